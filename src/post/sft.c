/* sft.c — supervised fine-tuning on XTML trajectories: a run config read strictly, trajectories loaded (bad lines
 * reported), shuffled by seed and packed with document resets, the loss on the model's own tokens only, Muon + AdamW
 * through the backend table, metrics JSONL, checkpoints in the trainer's layout that resume bit-exactly. POST.md. */
#include "base/check.h"
#include "base/json.h"
#include "ops/backend.h"
#include "ops/optim.h"
#include "post/post.h"
#include "tok/tok.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/schedule.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- config */

static int cfg_path(const k3c_json_ctx *c, const k3c_json *o, const char *key, int req, char *out, size_t n) {
    const char *v = NULL;
    CHECK_RC(k3c_json_get_str(c, req ? K3C_JSON_REQ : K3C_JSON_OPT, K3C_SPOT(o, "", key), &v));
    out[0] = 0;
    if (!v) return K3C_OK;
    const char *slash = strrchr(c->file, '/');
    int len = v[0] == '/' || !slash ? snprintf(out, n, "%s", v)
                                    : snprintf(out, n, "%.*s/%s", (int)(slash - c->file), c->file, v);
    if (!v[0] || len < 0 || (size_t)len >= n)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: %s: expected a path (non-empty, < %zu bytes)", c->file, key, n);
    return K3C_OK;
}

static int cfg_int(const k3c_json_ctx *c, const k3c_json *o, const char *where, const char *key, int64_t def,
                   int64_t lo, int64_t *out) {
    int present;
    CHECK_RC(k3c_json_get_int(c, K3C_JSON_OPT, K3C_SPOT(o, where, key), K3C_NOSPOT, out, &present));
    if (!present) *out = def;
    if (*out < lo)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s: must be at least %lld", c->file, where, key, (long long)lo);
    return K3C_OK;
}

static int cfg_num(const k3c_json_ctx *c, const k3c_json *o, const char *where, const char *key, double def,
                   double *out) {
    int present;
    CHECK_RC(k3c_json_get_num(c, K3C_JSON_OPT, K3C_SPOT(o, where, key), K3C_NOSPOT, out, &present));
    if (!present) *out = def;
    if (!(*out >= 0)) return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s: must be >= 0", c->file, where, key);
    return K3C_OK;
}

static int cfg_keys(const k3c_json_ctx *c, const k3c_json *o, const char *where, const char *const *keys) {
    for (size_t i = 0; i < o->n; i++) {
        const char *const *k = keys;
        while (*k && strcmp(*k, o->keys[i])) k++;
        if (!*k) return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s: unknown key", c->file, where, o->keys[i]);
    }
    return K3C_OK;
}

static int read_config(const k3c_json_ctx *c, const k3c_json *j, k3c_sft_config *s) {
    static const char *const keys[] = {
        "init",         "tokenizer",        "pattern",          "format",    "thinking",
        "data",         "val_data",         "out_dir",          "seq_len",   "steps",
        "lr",           "min_lr_ratio",     "warmup",           "schedule",  "optimizer",
        "seed",         "kda_chunk",        "threads",          "log_every", "eval_every",
        "eval_batches", "checkpoint_every", "keep_checkpoints", NULL};
    static const char *const opt_keys[] = {"matrix", "weight_decay", "beta1", "beta2", "eps", "grad_clip", NULL};
    if (j->type != K3C_JSON_OBJECT) return k3c_errf(c->err, K3C_ECONFIG, "%s: expected a JSON object", c->file);
    CHECK_RC(cfg_keys(c, j, "", keys));
    CHECK_RC(cfg_path(c, j, "init", 1, s->init, sizeof s->init));
    CHECK_RC(cfg_path(c, j, "tokenizer", 0, s->tokenizer, sizeof s->tokenizer));
    CHECK_RC(cfg_path(c, j, "data", 1, s->data, sizeof s->data));
    CHECK_RC(cfg_path(c, j, "val_data", 0, s->val_data, sizeof s->val_data));
    CHECK_RC(cfg_path(c, j, "out_dir", 1, s->out_dir, sizeof s->out_dir));
    const char *str = NULL;
    CHECK_RC(k3c_json_get_str(c, K3C_JSON_OPT, K3C_SPOT(j, "", "pattern"), &str));
    snprintf(s->pattern, sizeof s->pattern, "%s", str ? str : "");
    str = NULL;
    CHECK_RC(k3c_json_get_str(c, K3C_JSON_OPT, K3C_SPOT(j, "", "format"), &str));
    k3c_chat_format fmt = K3C_CHAT_XTML;
    if (str && k3c_chat_format_parse(str, &fmt))
        return k3c_errf(c->err, K3C_ECONFIG, "%s: format: \"%s\" is not xtml or k2", c->file, str);
    s->format = fmt;
    int present;
    CHECK_RC(k3c_json_get_bool(c, K3C_JSON_OPT, K3C_SPOT(j, "", "thinking"), K3C_NOSPOT, &s->thinking, &present));
    if (!present) s->thinking = 1;
    int64_t v;
    CHECK_RC(cfg_int(c, j, "", "seq_len", 1024, 8, &s->seq_len));
    CHECK_RC(cfg_int(c, j, "", "steps", 0, 1, &s->steps));
    CHECK_RC(cfg_int(c, j, "", "warmup", 0, 0, &s->warmup));
    CHECK_RC(cfg_int(c, j, "", "seed", 1, 0, &v));
    s->seed = (uint64_t)v;
    CHECK_RC(cfg_int(c, j, "", "kda_chunk", 16, 0, &v));
    s->kda_chunk = (int)v;
    CHECK_RC(cfg_int(c, j, "", "threads", 0, 0, &v));
    s->threads = (int)v;
    CHECK_RC(cfg_int(c, j, "", "log_every", 1, 1, &s->log_every));
    CHECK_RC(cfg_int(c, j, "", "eval_every", 0, 0, &s->eval_every));
    CHECK_RC(cfg_int(c, j, "", "eval_batches", 4, 1, &s->eval_batches));
    CHECK_RC(cfg_int(c, j, "", "checkpoint_every", 0, 0, &s->checkpoint_every));
    CHECK_RC(cfg_int(c, j, "", "keep_checkpoints", 2, 1, &s->keep_checkpoints));
    CHECK_RC(cfg_num(c, j, "", "lr", 1e-3, &s->lr));
    CHECK_RC(cfg_num(c, j, "", "min_lr_ratio", 0.1, &s->min_lr_ratio));
    str = NULL;
    CHECK_RC(k3c_json_get_str(c, K3C_JSON_OPT, K3C_SPOT(j, "", "schedule"), &str));
    if (k3c_schedule_parse(str ? str : "cosine", &s->schedule, NULL))
        return k3c_errf(c->err, K3C_ECONFIG, "%s: schedule: \"%s\" is not cosine, linear or constant", c->file, str);
    const k3c_json *o = NULL;
    CHECK_RC(k3c_json_get_obj(c, K3C_SPOT(j, "", "optimizer"), &o));
    k3c_json empty = {.type = K3C_JSON_OBJECT};
    if (!o) o = &empty;
    CHECK_RC(cfg_keys(c, o, "optimizer.", opt_keys));
    str = NULL;
    CHECK_RC(k3c_json_get_str(c, K3C_JSON_OPT, K3C_SPOT(o, "optimizer.", "matrix"), &str));
    snprintf(s->matrix_optimizer, sizeof s->matrix_optimizer, "%s", str ? str : "muon");
    CHECK_RC(cfg_num(c, o, "optimizer.", "weight_decay", 0.0, &s->weight_decay));
    CHECK_RC(cfg_num(c, o, "optimizer.", "beta1", 0.9, &s->beta1));
    CHECK_RC(cfg_num(c, o, "optimizer.", "beta2", 0.95, &s->beta2));
    CHECK_RC(cfg_num(c, o, "optimizer.", "eps", 1e-8, &s->eps));
    CHECK_RC(cfg_num(c, o, "optimizer.", "grad_clip", 1.0, &s->grad_clip));
    if (s->warmup > s->steps) return k3c_errf(c->err, K3C_ECONFIG, "%s: warmup: longer than steps", c->file);
    return K3C_OK;
}

int k3c_sft_config_load(const char *path, k3c_sft_config *s, k3c_err *err) {
    memset(s, 0, sizeof *s);
    snprintf(s->path, sizeof s->path, "%s", path);
    k3c_json *j;
    CHECK_RC(k3c_json_parse_file(path, &j, err));
    k3c_json_ctx c = {path, err};
    int rc = read_config(&c, j, s);
    k3c_json_free(j);
    return rc;
}

/* ---------------------------------------------------------------- the run */

typedef struct {
    const k3c_sft_config *c;
    k3c_model m;
    const k3c_backend_f32 *be;
    k3c_optim opt;
    float *ostate;
    void *opt_inst;
    k3c_arena arena;
    size_t arena_cap;
    k3c_tok *tok;
    char vocab[4200], pattern[16];
    k3c_traj_set train, val;
    k3c_traj *order; /* train.items shuffled by the seed (shallow copies) */
    size_t cursor;
    k3c_packed pk;
    int64_t step, tokens;
    FILE *metrics;
} sft;

/* The tokenizer: the config's file, else the one in the init checkpoint; its path and pattern go into checkpoints. */
static int open_tokenizer(sft *s, k3c_err *err) {
    const k3c_sft_config *c = s->c;
    if (c->tokenizer[0]) {
        k3c_tok_pattern pat = K3C_TOK_PATTERN_CL100K;
        if (c->pattern[0] && k3c_tok_pattern_parse(c->pattern, &pat))
            return k3c_errf(err, K3C_ECONFIG, "%s: pattern: '%s' is not cl100k or kimi", c->path, c->pattern);
        snprintf(s->vocab, sizeof s->vocab, "%s", c->tokenizer);
        CHECK_RC(k3c_tok_load_with_specials(c->tokenizer, pat, 0, &s->tok, err));
    } else {
        snprintf(s->vocab, sizeof s->vocab, "%s/%s", c->init, K3C_TOK_DIR_VOCAB);
        CHECK_RC(k3c_tok_load_dir(c->init, c->pattern[0] ? c->pattern : NULL, &s->tok, err));
    }
    snprintf(s->pattern, sizeof s->pattern, "%s", k3c_tok_pattern_name(k3c_tok_get_pattern(s->tok)));
    if (k3c_tok_n_vocab(s->tok) > s->m.cfg.vocab_size)
        return k3c_errf(err, K3C_ECONFIG, "%s: tokenizer has %lld ids, the model's vocab_size is %lld", c->path,
                        (long long)k3c_tok_n_vocab(s->tok), (long long)s->m.cfg.vocab_size);
    return K3C_OK;
}

static int load_data(sft *s, FILE *log, k3c_err *err) {
    const k3c_sft_config *c = s->c;
    k3c_traj_opts o = {.format = c->format, .thinking = c->thinking, .max_tokens = c->seq_len};
    CHECK_RC(k3c_traj_load_jsonl(c->data, s->tok, &o, &s->train, err));
    if (log && s->train.bad) fprintf(log, "sft: %lld bad lines skipped:\n%s", (long long)s->train.bad, s->train.report);
    if (c->val_data[0]) CHECK_RC(k3c_traj_load_jsonl(c->val_data, s->tok, &o, &s->val, err));
    s->order = malloc(s->train.n * sizeof *s->order);
    if (!s->order) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    memcpy(s->order, s->train.items, s->train.n * sizeof *s->order);
    k3c_rng r = {s->c->seed ^ 0x5f7u, 0};
    for (size_t i = s->train.n; i > 1; i--) {
        size_t j = (size_t)(k3c_rng_u64(&r) % i);
        k3c_traj t = s->order[i - 1];
        s->order[i - 1] = s->order[j];
        s->order[j] = t;
    }
    return K3C_OK;
}

static int ensure_arena(sft *s, int64_t T, int n_docs, k3c_err *err) {
    size_t need = k3c_model_plan_bytes_f32(&s->m, T, n_docs);
    if (need <= s->arena_cap) return K3C_OK;
    k3c_model_arena_free_f32(&s->m, &s->arena);
    s->arena_cap = need + need / 4;
    return k3c_model_arena_init_f32(&s->m, s->arena_cap, &s->arena, err);
}

/* Mean loss over the trained tokens of one packed batch; with grad, the backward adds into m.g. */
static int forward(sft *s, const k3c_packed *p, int grad, double *loss, k3c_err *err) {
    if (!p->n_counted) return k3c_errf(err, K3C_EINVAL, "sft: a batch without trained tokens");
    CHECK_RC(ensure_arena(s, p->T, p->n_docs, err));
    k3c_model_batch b = {p->T, p->n_docs, p->ids, p->cu_seqlens, p->targets, 0};
    k3c_arena_reset(&s->arena, 0);
    k3c_acts *acts;
    CHECK_RC(k3c_model_forward_f32(&s->m, &b, &s->arena, &acts, loss, NULL, err));
    if (!isfinite(*loss))
        return k3c_errf(err, K3C_ENUMERIC, "sft step %lld: loss is %g", (long long)s->step + 1, *loss);
    return grad ? k3c_model_backward_f32(&s->m, acts, 1.0, err) : K3C_OK;
}

static int validate(sft *s, double *val, k3c_err *err) {
    *val = NAN;
    if (!s->val.n) return K3C_OK;
    size_t next = 0;
    double sum = 0;
    k3c_packed p = {0};
    int64_t n = 0, rc = K3C_OK;
    for (int64_t i = 0; i < s->c->eval_batches && !rc; i++) {
        rc = k3c_traj_pack(s->val.items, s->val.n, &next, s->c->seq_len, &p, err);
        double l;
        if (!rc) rc = forward(s, &p, 0, &l, err);
        if (!rc) sum += l, n++;
        if (next == 0) break; /* one pass over the validation set at most */
    }
    k3c_packed_free(&p);
    if (!rc && n) *val = sum / (double)n;
    return (int)rc;
}

static int step(sft *s, k3c_metrics_row *row, k3c_err *err) {
    const k3c_sft_config *c = s->c;
    CHECK_RC(k3c_traj_pack(s->order, s->train.n, &s->cursor, c->seq_len, &s->pk, err));
    CHECK_RC(s->be->zero(s->m.g, (int64_t)s->m.table.total, err));
    double loss;
    CHECK_RC(forward(s, &s->pk, 1, &loss, err));
    CHECK_RC(s->be->clip_grad_norm(s->opt_inst, &s->m.table, s->m.g, c->grad_clip, &row->grad_norm, err));
    k3c_schedule sch = {c->schedule, c->lr, c->warmup, c->steps, c->min_lr_ratio};
    row->lr = k3c_schedule_lr(&sch, s->step + 1);
    CHECK_RC(s->be->optim_step(s->opt_inst, &s->opt, &s->m.table, 0, s->m.table.n, s->m.w, s->m.g, s->ostate, row->lr,
                               s->step + 1, err));
    s->step++;
    s->tokens += s->pk.T;
    row->loss = loss;
    return K3C_OK;
}

static int save(sft *s, k3c_err *err) {
    size_t n = s->opt.state_numel ? s->opt.state_numel : 1;
    float *state = malloc(sizeof(float) * n);
    if (!state) return k3c_errf(err, K3C_ENOMEM, "checkpoint: out of memory");
    int rc = s->be->download(state, s->ostate, sizeof(float) * s->opt.state_numel, err);
    char ts[256];
    snprintf(ts, sizeof ts, "{\"step\": %lld, \"tokens\": %lld, \"cursor\": %zu, \"seed\": %llu, \"kind\": \"sft\"}\n",
             (long long)s->step, (long long)s->tokens, s->cursor, (unsigned long long)s->c->seed);
    k3c_train_ckpt ck = {&s->m, state, s->opt.state_numel, ts, s->vocab, s->pattern};
    if (!rc) rc = k3c_train_ckpt_save(s->c->out_dir, s->step, &ck, (int)s->c->keep_checkpoints, err);
    free(state);
    return rc;
}

/* Loads the newest checkpoint of out_dir: weights into the host model, the optimizer state into *state. */
static int resume(sft *s, float **state, k3c_err *err) {
    char dir[4096], *ts = NULL;
    CHECK_RC(k3c_train_ckpt_latest(s->c->out_dir, dir, sizeof dir, err));
    k3c_checkpoint *ck;
    CHECK_RC(k3c_ckpt_open(dir, &ck, err));
    int rc = k3c_model_load_f32(&s->m, ck, err);
    k3c_ckpt_close(ck);
    *state = rc ? NULL : malloc(sizeof(float) * (s->opt.state_numel ? s->opt.state_numel : 1));
    if (!rc && !*state) rc = k3c_errf(err, K3C_ENOMEM, "resume: out of memory");
    if (!rc) rc = k3c_train_ckpt_load_state(dir, *state, s->opt.state_numel, &ts, err);
    k3c_json *j = NULL;
    if (!rc) rc = k3c_json_parse(ts, strlen(ts), "trainer_state.json", &j, err);
    const k3c_json *st = j ? k3c_json_get(j, "step") : NULL, *tk = j ? k3c_json_get(j, "tokens") : NULL,
                   *cu = j ? k3c_json_get(j, "cursor") : NULL;
    if (!rc && (!st || !st->is_integer || !tk || !tk->is_integer || !cu || !cu->is_integer || cu->integer < 0))
        rc = k3c_errf(err, K3C_EFORMAT, "%s/trainer_state.json: not an SFT state (step, tokens, cursor)", dir);
    if (!rc) {
        s->step = st->integer;
        s->tokens = tk->integer;
        s->cursor = (size_t)cu->integer % s->train.n;
    }
    k3c_json_free(j);
    free(ts);
    return rc ? k3c_err_wrap(err, "resume from %s", dir) : K3C_OK;
}

static int setup(sft *s, const k3c_sft_config *c, const k3c_train_opts *o, k3c_err *err) {
    memset(s, 0, sizeof *s);
    s->c = c;
    if (c->threads > 0) k3c_set_num_threads(c->threads);
    CHECK_RC(k3c_model_open_f32(c->init, 1, &s->m, err));
    s->m.kda_chunk = c->kda_chunk;
    CHECK_RC(open_tokenizer(s, err));
    CHECK_RC(load_data(s, o->log, err));
    k3c_optim_defaults(&s->opt);
    s->opt.weight_decay = c->weight_decay;
    s->opt.beta1 = c->beta1;
    s->opt.beta2 = c->beta2;
    s->opt.eps = c->eps;
    CHECK_RC(k3c_optim_parse_matrix(c->matrix_optimizer, &s->opt.matrix_optimizer, err));
    CHECK_RC(k3c_optim_init(&s->opt, &s->m.table, err));
    if (mkdir(c->out_dir, 0755) != 0 && errno != EEXIST)
        return k3c_errf(err, K3C_EIO, "%s: cannot create: %s", c->out_dir, strerror(errno));
    char p[4200];
    snprintf(p, sizeof p, "%s/latest", c->out_dir);
    if (!o->resume && access(p, F_OK) == 0)
        return k3c_errf(err, K3C_EINVAL, "%s already holds a run (%s exists): use --resume, or another out_dir",
                        c->out_dir, p);
    float *state = NULL;
    int rc = o->resume ? resume(s, &state, err) : K3C_OK;
    if (!rc) rc = k3c_model_use_backend_f32(&s->m, o->backend, err);
    if (!rc) {
        s->be = k3c_model_backend_f32(&s->m);
        size_t n = s->opt.state_numel ? s->opt.state_numel : 1;
        s->ostate = s->be->alloc(sizeof(float) * n);
        if (!s->ostate) rc = k3c_errf(err, K3C_ENOMEM, "sft: cannot allocate the optimizer state");
    }
    if (!rc) rc = s->be->zero(s->ostate, (int64_t)(s->opt.state_numel ? s->opt.state_numel : 1), err);
    if (!rc && state) rc = s->be->upload(s->ostate, state, sizeof(float) * s->opt.state_numel, err);
    if (!rc && state) rc = s->be->sync(err);
    free(state);
    if (!rc) rc = s->be->optim_open(s->be->ctx, &s->opt, &s->m.table, &s->opt_inst, err);
    if (rc) return rc;
    snprintf(p, sizeof p, "%s/metrics.jsonl", c->out_dir);
    s->metrics = fopen(p, o->resume ? "a" : "w");
    return s->metrics ? K3C_OK : k3c_errf(err, K3C_EIO, "%s: cannot write", p);
}

static void teardown(sft *s) {
    const k3c_backend_f32 *be = k3c_model_backend_f32(&s->m);
    if (s->opt_inst) be->optim_close(s->opt_inst);
    k3c_model_arena_free_f32(&s->m, &s->arena);
    if (s->ostate && be->sync(NULL) == K3C_OK) be->free(s->ostate);
    k3c_model_free_f32(&s->m);
    k3c_optim_free(&s->opt);
    k3c_tok_free(s->tok);
    free(s->order);
    k3c_traj_set_free(&s->train);
    k3c_traj_set_free(&s->val);
    k3c_packed_free(&s->pk);
    if (s->metrics) fclose(s->metrics);
}

int k3c_sft_run(const k3c_sft_config *c, const k3c_train_opts *o, k3c_sft_result *res, k3c_err *err) {
    sft s;
    memset(res, 0, sizeof *res);
    res->first_loss = res->last_loss = res->last_val_loss = NAN;
    int rc = setup(&s, c, o, err);
    res->n_traj = (int64_t)s.train.n;
    res->bad_lines = s.train.bad;
    int64_t stop = o->max_steps > 0 && o->max_steps < c->steps ? o->max_steps : c->steps;
    k3c_progress bar;
    k3c_progress_init(&bar, "sft", stop, "tok", o->progress ? o->progress : stderr, 0);
    if (!o->progress) bar.enabled = 0;
    bar.done = s.step;
    double t0 = k3c_now();
    int64_t tokens0 = s.tokens;
    while (!rc && s.step < stop) {
        k3c_metrics_row row = {.val_loss = NAN, .max_load_ratio = NAN, .load_cv = NAN};
        if ((rc = step(&s, &row, err))) break;
        int last = s.step == stop;
        row.step = s.step;
        row.tokens = s.tokens;
        row.tokens_per_s = (double)(s.tokens - tokens0) / (k3c_now() - t0);
        if (c->eval_every > 0 && (s.step % c->eval_every == 0 || last) && (rc = validate(&s, &row.val_loss, err)))
            break;
        if (s.step % c->log_every == 0 || last || isfinite(row.val_loss)) k3c_metrics_write(s.metrics, &row);
        if (o->log)
            fprintf(o->log, "sft step %lld loss %.4f lr %.2e gnorm %.3f %.0f tok/s\n", (long long)s.step, row.loss,
                    row.lr, row.grad_norm, row.tokens_per_s);
        char extra[64];
        snprintf(extra, sizeof extra, "loss %.3f", row.loss);
        k3c_progress_update(&bar, s.step, (double)s.pk.T, extra);
        if ((c->checkpoint_every > 0 && s.step % c->checkpoint_every == 0) || last) rc = save(&s, err);
        if (isnan(res->first_loss)) res->first_loss = row.loss;
        res->last_loss = row.loss;
        if (isfinite(row.val_loss)) res->last_val_loss = row.val_loss;
        res->tokens_per_s = row.tokens_per_s;
    }
    k3c_progress_finish(&bar, NULL);
    res->steps = s.step;
    res->wall_s = k3c_now() - t0;
    teardown(&s);
    return rc;
}
