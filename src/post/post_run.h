/* post_run.h — internal to the library: the model + optimizer + checkpoint plumbing SFT (sft.c) and RL (rl.c) share
 * (post_run.c). Spec: docs/POST.md "Runs". */
#ifndef K3C_POST_POST_RUN_H
#define K3C_POST_POST_RUN_H

#include "base/json.h"
#include "model/model.h"
#include "ops/backend.h"
#include "ops/optim.h"

/* Run-config fields (errors "<file>: <where><key>: <reason>"): a path relative to the config file's directory; an
 * integer (default def, at least lo); a number (default def, >= 0); no keys outside `keys` (NULL-terminated). */
int k3c_post_cfg_path(const k3c_json_ctx *c, const k3c_json *o, const char *key, int req, char *out, size_t n);
int k3c_post_cfg_int(const k3c_json_ctx *c, const k3c_json *o, const char *where, const char *key, int64_t def,
                     int64_t lo, int64_t *out);
int k3c_post_cfg_num(const k3c_json_ctx *c, const k3c_json *o, const char *where, const char *key, double def,
                     double *out);
int k3c_post_cfg_keys(const k3c_json_ctx *c, const k3c_json *o, const char *where, const char *const *keys);

typedef struct {
    const char *init, *tokenizer, *pattern, *out_dir; /* tokenizer / pattern: NULL or "" = the init dir's */
    int kda_chunk, threads;
    const char *matrix_optimizer;
    double weight_decay, beta1, beta2, eps;
} k3c_post_run_opts;

typedef struct {
    k3c_model m;
    const k3c_backend_f32 *be;
    k3c_optim opt;
    float *ostate;
    void *opt_inst;
    k3c_arena arena;
    size_t arena_cap;
    k3c_tok *tok;
    char vocab[4200], pattern[16];
    FILE *metrics;
} k3c_post_run;

/* Opens the model (with gradients) and tokenizer, the optimizer and its state on o->backend; with o->resume, loads
 * out_dir/latest (weights, optimizer state) and returns its trainer_state.json in *state_json (malloc'd, NULL
 * otherwise); opens out_dir/metrics.jsonl. Without o->resume an existing run in out_dir is an error. */
int k3c_post_run_open(k3c_post_run *p, const k3c_post_run_opts *r, const k3c_train_opts *o, char **state_json,
                      k3c_err *err);
int k3c_post_run_arena(k3c_post_run *p, int64_t T, int n_docs, k3c_err *err);
/* The step's tail (train/step_tail.h) on the model: clips m.g and applies one optimizer step (step ≥ 1); a non-finite
 * gradient norm is K3C_ENUMERIC with nothing updated. */
int k3c_post_run_update(k3c_post_run *p, double grad_clip, double lr, int64_t step, double *grad_norm, k3c_err *err);
int k3c_post_run_save(k3c_post_run *p, const char *out_dir, int64_t step, const char *state_json, int keep,
                      k3c_err *err);
void k3c_post_run_close(k3c_post_run *p);

#endif
