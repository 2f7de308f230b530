/* sft.c — supervised fine-tuning on XTML trajectories: a run config read strictly, trajectories loaded (bad lines
 * reported), shuffled by seed and packed with document resets, the loss on the model's own tokens only, Muon + AdamW
 * through the backend table, metrics JSONL, checkpoints in the trainer's layout that resume bit-exactly. POST.md. */
#include "base/check.h"
#include "base/json.h"
#include "post/post.h"
#include "post/post_run.h"
#include "tok/tok.h"
#include "train/metrics.h"
#include "train/schedule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- config */

static int read_config(const k3c_json_ctx *c, const k3c_json *j, k3c_sft_config *s) {
    static const char *const keys[] = {
        "init",         "tokenizer",        "pattern",          "format",    "thinking",
        "data",         "val_data",         "out_dir",          "seq_len",   "steps",
        "lr",           "min_lr_ratio",     "warmup",           "schedule",  "optimizer",
        "seed",         "kda_chunk",        "threads",          "log_every", "eval_every",
        "eval_batches", "checkpoint_every", "keep_checkpoints", NULL};
    static const char *const opt_keys[] = {"matrix", "weight_decay", "beta1", "beta2", "eps", "grad_clip", NULL};
    if (j->type != K3C_JSON_OBJECT) return k3c_errf(c->err, K3C_ECONFIG, "%s: expected a JSON object", c->file);
    CHECK_RC(k3c_post_cfg_keys(c, j, "", keys));
    CHECK_RC(k3c_post_cfg_path(c, j, "init", 1, s->init, sizeof s->init));
    CHECK_RC(k3c_post_cfg_path(c, j, "tokenizer", 0, s->tokenizer, sizeof s->tokenizer));
    CHECK_RC(k3c_post_cfg_path(c, j, "data", 1, s->data, sizeof s->data));
    CHECK_RC(k3c_post_cfg_path(c, j, "val_data", 0, s->val_data, sizeof s->val_data));
    CHECK_RC(k3c_post_cfg_path(c, j, "out_dir", 1, s->out_dir, sizeof s->out_dir));
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
    CHECK_RC(k3c_post_cfg_int(c, j, "", "seq_len", 1024, 8, &s->seq_len));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "steps", 0, 1, &s->steps));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "warmup", 0, 0, &s->warmup));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "seed", 1, 0, &v));
    s->seed = (uint64_t)v;
    CHECK_RC(k3c_post_cfg_int(c, j, "", "kda_chunk", 16, 0, &v));
    s->kda_chunk = (int)v;
    CHECK_RC(k3c_post_cfg_int(c, j, "", "threads", 0, 0, &v));
    s->threads = (int)v;
    CHECK_RC(k3c_post_cfg_int(c, j, "", "log_every", 1, 1, &s->log_every));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "eval_every", 0, 0, &s->eval_every));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "eval_batches", 4, 1, &s->eval_batches));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "checkpoint_every", 0, 0, &s->checkpoint_every));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "keep_checkpoints", 2, 1, &s->keep_checkpoints));
    CHECK_RC(k3c_post_cfg_num(c, j, "", "lr", 1e-3, &s->lr));
    CHECK_RC(k3c_post_cfg_num(c, j, "", "min_lr_ratio", 0.1, &s->min_lr_ratio));
    str = NULL;
    CHECK_RC(k3c_json_get_str(c, K3C_JSON_OPT, K3C_SPOT(j, "", "schedule"), &str));
    if (k3c_schedule_parse(str ? str : "cosine", &s->schedule, NULL))
        return k3c_errf(c->err, K3C_ECONFIG, "%s: schedule: \"%s\" is not cosine, linear or constant", c->file, str);
    const k3c_json *o = NULL;
    CHECK_RC(k3c_json_get_obj(c, K3C_SPOT(j, "", "optimizer"), &o));
    k3c_json empty = {.type = K3C_JSON_OBJECT};
    if (!o) o = &empty;
    CHECK_RC(k3c_post_cfg_keys(c, o, "optimizer.", opt_keys));
    str = NULL;
    CHECK_RC(k3c_json_get_str(c, K3C_JSON_OPT, K3C_SPOT(o, "optimizer.", "matrix"), &str));
    snprintf(s->matrix_optimizer, sizeof s->matrix_optimizer, "%s", str ? str : "muon");
    CHECK_RC(k3c_post_cfg_num(c, o, "optimizer.", "weight_decay", 0.0, &s->weight_decay));
    CHECK_RC(k3c_post_cfg_num(c, o, "optimizer.", "beta1", 0.9, &s->beta1));
    CHECK_RC(k3c_post_cfg_num(c, o, "optimizer.", "beta2", 0.95, &s->beta2));
    CHECK_RC(k3c_post_cfg_num(c, o, "optimizer.", "eps", 1e-8, &s->eps));
    CHECK_RC(k3c_post_cfg_num(c, o, "optimizer.", "grad_clip", 1.0, &s->grad_clip));
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
    k3c_post_run r;
    k3c_traj_set train, val;
    k3c_traj *order; /* train.items shuffled by the seed (shallow copies) */
    size_t cursor;
    k3c_packed pk;
    int64_t step, tokens;
} sft;

static int load_data(sft *s, FILE *log, k3c_err *err) {
    const k3c_sft_config *c = s->c;
    k3c_traj_opts o = {.format = c->format, .thinking = c->thinking, .max_tokens = c->seq_len};
    CHECK_RC(k3c_traj_load_jsonl(c->data, s->r.tok, &o, &s->train, err));
    if (log && s->train.bad) fprintf(log, "sft: %lld bad lines skipped:\n%s", (long long)s->train.bad, s->train.report);
    if (c->val_data[0]) CHECK_RC(k3c_traj_load_jsonl(c->val_data, s->r.tok, &o, &s->val, err));
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

/* Mean loss over the trained tokens of one packed batch; with grad, the backward adds into m.g. */
static int forward(sft *s, const k3c_packed *p, int grad, double *loss, k3c_err *err) {
    if (!p->n_counted) return k3c_errf(err, K3C_EINVAL, "sft: a batch without trained tokens");
    CHECK_RC(k3c_post_run_arena(&s->r, p->T, p->n_docs, err));
    k3c_model_batch b = {
        .T = p->T, .n_docs = p->n_docs, .ids = p->ids, .cu_seqlens = p->cu_seqlens, .targets = p->targets};
    k3c_arena_reset(&s->r.arena, 0);
    k3c_acts *acts;
    CHECK_RC(k3c_model_forward_f32(&s->r.m, &b, &s->r.arena, &acts, loss, NULL, err));
    if (!isfinite(*loss))
        return k3c_errf(err, K3C_ENUMERIC, "sft step %lld: loss is %g", (long long)s->step + 1, *loss);
    return grad ? k3c_model_backward_f32(&s->r.m, acts, 1.0, err) : K3C_OK;
}

static int validate(sft *s, double *val, k3c_err *err) {
    *val = NAN;
    if (!s->val.n) return K3C_OK;
    size_t next = 0;
    double sum = 0;
    k3c_packed p = {0};
    int64_t n = 0;
    int rc = K3C_OK;
    for (int64_t i = 0; i < s->c->eval_batches && !rc; i++) {
        rc = k3c_traj_pack(s->val.items, s->val.n, &next, s->c->seq_len, &p, err);
        double l;
        if (!rc) rc = forward(s, &p, 0, &l, err);
        if (!rc) sum += l, n++;
        if (next == 0) break; /* one pass over the validation set at most */
    }
    k3c_packed_free(&p);
    if (!rc && n) *val = sum / (double)n;
    return rc;
}

static int step(sft *s, k3c_metrics_row *row, k3c_err *err) {
    const k3c_sft_config *c = s->c;
    CHECK_RC(k3c_traj_pack(s->order, s->train.n, &s->cursor, c->seq_len, &s->pk, err));
    CHECK_RC(s->r.be->zero(s->r.m.g, (int64_t)s->r.m.table.total, err));
    double loss;
    CHECK_RC(forward(s, &s->pk, 1, &loss, err));
    k3c_schedule sch = {c->schedule, c->lr, c->warmup, c->steps, c->min_lr_ratio};
    row->lr = k3c_schedule_lr(&sch, s->step + 1);
    CHECK_RC(k3c_post_run_update(&s->r, c->grad_clip, row->lr, s->step + 1, &row->grad_norm, err));
    s->step++;
    s->tokens += s->pk.T;
    row->loss = loss;
    return K3C_OK;
}

/* trainer_state.json; "chat" records the chat options the model was tuned with, serve's and chat's defaults. */
static int save(sft *s, k3c_err *err) {
    char ts[320];
    snprintf(ts, sizeof ts,
             "{\"step\": %lld, \"tokens\": %lld, \"cursor\": %zu, \"seed\": %llu, \"kind\": \"sft\", \"chat\": "
             "{\"format\": \"%s\", \"thinking\": %s}}\n",
             (long long)s->step, (long long)s->tokens, s->cursor, (unsigned long long)s->c->seed,
             s->c->format == K3C_CHAT_K2 ? "k2" : "xtml", s->c->thinking ? "true" : "false");
    return k3c_post_run_save(&s->r, s->c->out_dir, s->step, ts, (int)s->c->keep_checkpoints, err);
}

static int restore(sft *s, const char *ts, k3c_err *err) {
    k3c_json *j = NULL;
    CHECK_RC(k3c_json_parse(ts, strlen(ts), "trainer_state.json", &j, err));
    const k3c_json *st = k3c_json_get(j, "step"), *tk = k3c_json_get(j, "tokens"), *cu = k3c_json_get(j, "cursor");
    int rc = K3C_OK;
    if (!st || !st->is_integer || !tk || !tk->is_integer || !cu || !cu->is_integer || cu->integer < 0)
        rc = k3c_errf(err, K3C_EFORMAT, "%s/latest: trainer_state.json is not an SFT state (step, tokens, cursor)",
                      s->c->out_dir);
    if (!rc) {
        s->step = st->integer;
        s->tokens = tk->integer;
        s->cursor = (size_t)cu->integer % s->train.n;
    }
    k3c_json_free(j);
    return rc;
}

static int setup(sft *s, const k3c_sft_config *c, const k3c_train_opts *o, k3c_err *err) {
    memset(s, 0, sizeof *s);
    s->c = c;
    k3c_post_run_opts ro = {c->init,    c->tokenizer,        c->pattern,      c->out_dir, c->kda_chunk,
                            c->threads, c->matrix_optimizer, c->weight_decay, c->beta1,   c->beta2,
                            c->eps};
    char *ts = NULL;
    int rc = k3c_post_run_open(&s->r, &ro, o, &ts, err);
    if (!rc) rc = load_data(s, o->log, err);
    if (!rc && ts) rc = restore(s, ts, err);
    free(ts);
    return rc;
}

static void teardown(sft *s) {
    k3c_post_run_close(&s->r);
    free(s->order);
    k3c_traj_set_free(&s->train);
    k3c_traj_set_free(&s->val);
    k3c_packed_free(&s->pk);
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
        if (s.step % c->log_every == 0 || last || isfinite(row.val_loss)) k3c_metrics_write(s.r.metrics, &row);
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
