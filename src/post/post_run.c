/* post_run.c — what SFT and RL runs share: the model opened from a checkpoint with its tokenizer, the optimizer and its
 * state in the backend's memory, the update through the step's tail, resume from out_dir/latest, checkpoints in the
 * trainer's layout, metrics file. docs/POST.md "Runs". */
#include "post/post_run.h"

#include "base/check.h"
#include "base/json.h"
#include "tok/tok.h"
#include "train/checkpoint.h"
#include "train/step_tail.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- run-config fields */

int k3c_post_cfg_path(const k3c_json_ctx *c, const k3c_json *o, const char *key, int req, char *out, size_t n) {
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

int k3c_post_cfg_int(const k3c_json_ctx *c, const k3c_json *o, const char *where, const char *key, int64_t def,
                     int64_t lo, int64_t *out) {
    int present;
    CHECK_RC(k3c_json_get_int(c, K3C_JSON_OPT, K3C_SPOT(o, where, key), K3C_NOSPOT, out, &present));
    if (!present) *out = def;
    if (*out < lo)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s: must be at least %lld", c->file, where, key, (long long)lo);
    return K3C_OK;
}

int k3c_post_cfg_num(const k3c_json_ctx *c, const k3c_json *o, const char *where, const char *key, double def,
                     double *out) {
    int present;
    CHECK_RC(k3c_json_get_num(c, K3C_JSON_OPT, K3C_SPOT(o, where, key), K3C_NOSPOT, out, &present));
    if (!present) *out = def;
    if (!(*out >= 0)) return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s: must be >= 0", c->file, where, key);
    return K3C_OK;
}

int k3c_post_cfg_keys(const k3c_json_ctx *c, const k3c_json *o, const char *where, const char *const *keys) {
    for (size_t i = 0; i < o->n; i++) {
        const char *const *k = keys;
        while (*k && strcmp(*k, o->keys[i])) k++;
        if (!*k) return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s: unknown key", c->file, where, o->keys[i]);
    }
    return K3C_OK;
}

/* ---------------------------------------------------------------- model, optimizer, checkpoints */

static int open_tokenizer(k3c_post_run *p, const k3c_post_run_opts *r, k3c_err *err) {
    if (r->tokenizer && r->tokenizer[0]) {
        k3c_tok_pattern pat = K3C_TOK_PATTERN_CL100K;
        if (r->pattern && r->pattern[0] && k3c_tok_pattern_parse(r->pattern, &pat))
            return k3c_errf(err, K3C_ECONFIG, "pattern: '%s' is not cl100k or kimi", r->pattern);
        snprintf(p->vocab, sizeof p->vocab, "%s", r->tokenizer);
        CHECK_RC(k3c_tok_load_with_specials(r->tokenizer, pat, 0, &p->tok, err));
    } else {
        snprintf(p->vocab, sizeof p->vocab, "%s/%s", r->init, K3C_TOK_DIR_VOCAB);
        CHECK_RC(k3c_tok_load_dir(r->init, r->pattern && r->pattern[0] ? r->pattern : NULL, &p->tok, err));
    }
    snprintf(p->pattern, sizeof p->pattern, "%s", k3c_tok_pattern_name(k3c_tok_get_pattern(p->tok)));
    if (k3c_tok_n_vocab(p->tok) > p->m.cfg.vocab_size)
        return k3c_errf(err, K3C_ECONFIG, "tokenizer has %lld ids, the model's vocab_size is %lld",
                        (long long)k3c_tok_n_vocab(p->tok), (long long)p->m.cfg.vocab_size);
    return K3C_OK;
}

/* Weights and optimizer state of out_dir/latest; *state_json receives its trainer_state.json. */
static int resume(k3c_post_run *p, const char *out_dir, float **state, char **state_json, k3c_err *err) {
    char dir[4096];
    CHECK_RC(k3c_train_ckpt_latest(out_dir, dir, sizeof dir, err));
    k3c_checkpoint *ck;
    CHECK_RC(k3c_ckpt_open(dir, &ck, err));
    int rc = k3c_model_load_f32(&p->m, ck, err);
    k3c_ckpt_close(ck);
    *state = rc ? NULL : malloc(sizeof(float) * (p->opt.state_numel ? p->opt.state_numel : 1));
    if (!rc && !*state) rc = k3c_errf(err, K3C_ENOMEM, "resume: out of memory");
    if (!rc) rc = k3c_train_ckpt_load_state(dir, &p->m.table, &p->opt, NULL, *state, state_json, err);
    return rc ? k3c_err_wrap(err, "resume from %s", dir) : K3C_OK;
}

int k3c_post_run_open(k3c_post_run *p, const k3c_post_run_opts *r, const k3c_train_opts *o, char **state_json,
                      k3c_err *err) {
    memset(p, 0, sizeof *p);
    *state_json = NULL;
    if (r->threads > 0) k3c_set_num_threads(r->threads);
    CHECK_RC(k3c_model_open_f32(r->init, 1, &p->m, err));
    p->m.kda_chunk = r->kda_chunk;
    CHECK_RC(open_tokenizer(p, r, err));
    k3c_optim_defaults(&p->opt);
    p->opt.weight_decay = r->weight_decay;
    p->opt.beta1 = r->beta1;
    p->opt.beta2 = r->beta2;
    p->opt.eps = r->eps;
    CHECK_RC(k3c_optim_parse_matrix(r->matrix_optimizer, &p->opt.matrix_optimizer, err));
    CHECK_RC(k3c_optim_init(&p->opt, &p->m.table, err));
    if (mkdir(r->out_dir, 0755) != 0 && errno != EEXIST)
        return k3c_errf(err, K3C_EIO, "%s: cannot create: %s", r->out_dir, strerror(errno));
    char path[4200];
    snprintf(path, sizeof path, "%s/latest", r->out_dir);
    if (!o->resume && access(path, F_OK) == 0)
        return k3c_errf(err, K3C_EINVAL, "%s already holds a run (%s exists): use --resume, or another out_dir",
                        r->out_dir, path);
    float *state = NULL;
    int rc = o->resume ? resume(p, r->out_dir, &state, state_json, err) : K3C_OK;
    if (!rc) rc = k3c_model_use_backend_f32(&p->m, o->backend, err);
    size_t n = p->opt.state_numel ? p->opt.state_numel : 1;
    if (!rc) {
        p->be = k3c_model_backend_f32(&p->m);
        p->ostate = p->be->alloc(sizeof(float) * n);
        if (!p->ostate) rc = k3c_errf(err, K3C_ENOMEM, "cannot allocate the optimizer state");
    }
    if (!rc) rc = p->be->zero(p->ostate, (int64_t)n, err);
    if (!rc && state) rc = p->be->upload(p->ostate, state, sizeof(float) * p->opt.state_numel, err);
    if (!rc && state) rc = p->be->sync(err);
    free(state);
    if (!rc) rc = p->be->optim_open(p->be->ctx, &p->opt, &p->m.table, &p->opt_inst, err);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/metrics.jsonl", r->out_dir);
    p->metrics = fopen(path, o->resume ? "a" : "w");
    return p->metrics ? K3C_OK : k3c_errf(err, K3C_EIO, "%s: cannot write", path);
}

int k3c_post_run_arena(k3c_post_run *p, int64_t T, int n_docs, k3c_err *err) {
    size_t need = k3c_model_plan_bytes_f32(&p->m, T, n_docs);
    if (need <= p->arena_cap) return K3C_OK;
    k3c_model_arena_free_f32(&p->m, &p->arena);
    p->arena_cap = need + need / 4;
    return k3c_model_arena_init_f32(&p->m, p->arena_cap, &p->arena, err);
}

int k3c_post_run_update(k3c_post_run *p, double grad_clip, double lr, int64_t step, double *grad_norm, k3c_err *err) {
    /* post-training keeps the router biases and QK-Clip of the base run as they are */
    const k3c_tail_config c = {grad_clip, 0, K3C_BALANCE_NONE, -1, 0};
    k3c_step_tail t = {.m = &p->m, .n_groups = 1};
    t.group[0] = (k3c_param_group){&p->m.table, &p->opt, p->opt_inst, p->m.w, p->m.g, p->ostate};
    k3c_tail_result r;
    CHECK_RC(k3c_step_tail_run(&t, &c, &lr, step, &r, err));
    *grad_norm = r.grad_norm[0];
    if (r.skipped) /* an update from it would turn every weight into NaN; the last checkpoint stays as it was */
        return k3c_errf(err, K3C_ENUMERIC, "step %lld: %s: update not applied", (long long)step, r.why);
    return K3C_OK;
}

int k3c_post_run_save(k3c_post_run *p, const char *out_dir, int64_t step, const char *state_json, int keep,
                      k3c_err *err) {
    float *state = malloc(sizeof(float) * (p->opt.state_numel ? p->opt.state_numel : 1));
    if (!state) return k3c_errf(err, K3C_ENOMEM, "checkpoint: out of memory");
    int rc = p->be->download(state, p->ostate, sizeof(float) * p->opt.state_numel, err);
    k3c_train_ckpt ck = {.model = &p->m,
                         .optim_state = state,
                         .optim_numel = p->opt.state_numel,
                         .trainer_state = state_json,
                         .vocab = p->vocab,
                         .pattern = p->pattern};
    if (!rc) rc = k3c_train_ckpt_save(out_dir, step, &ck, keep, err);
    free(state);
    return rc;
}

void k3c_post_run_close(k3c_post_run *p) {
    const k3c_backend_f32 *be = k3c_model_backend_f32(&p->m);
    if (p->opt_inst) be->optim_close(p->opt_inst);
    k3c_model_arena_free_f32(&p->m, &p->arena);
    if (p->ostate && be->sync(NULL) == K3C_OK) be->free(p->ostate);
    k3c_model_free_f32(&p->m);
    k3c_optim_free(&p->opt);
    k3c_tok_free(p->tok);
    if (p->metrics) fclose(p->metrics);
}
