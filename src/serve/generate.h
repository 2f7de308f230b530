/* generate.h — text generation as a library service: open a model directory for serving (config, float32 weights and
 * the tokenizer it carries) and the decode loop (sample, append, stream each token to a callback). */
#ifndef K3C_SERVE_GENERATE_H
#define K3C_SERVE_GENERATE_H

#include "model/model.h"
#include "serve/sampler.h"
#include "tok/tok.h"

/* A model opened for serving. */
typedef struct {
    k3c_model model; /* float32 weights, no gradients */
    k3c_tok *tok;    /* the directory's tokenizer (tok/tok.h k3c_tok_load_dir), or NULL when not asked for */
} k3c_serve;

/* Opens <dir>: config.json + checkpoint and, when with_tok, the tokenizer (pattern NULL: the one k3c_tokenizer.json
 * names). On failure nothing stays open. */
int k3c_serve_open(const char *dir, int with_tok, const char *pattern, k3c_serve *s, k3c_err *err);
void k3c_serve_close(k3c_serve *s);

/* Called with every generated id (i counts from 0); a non-zero return stops the generation (not an error). */
typedef int (*k3c_token_fn)(void *ctx, int32_t id, int64_t i);

typedef struct {
    k3c_sampler sampler;
    int64_t max_new;       /* ids to generate at most */
    int32_t stop_id;       /* -1: none; else generation ends once it is sampled (it is appended, not passed on) */
    k3c_token_fn on_token; /* NULL: no streaming */
    void *ctx;
} k3c_gen_opts;

/* Appends up to o->max_new sampled ids to the prompt: seq holds n_prompt ids and has room for n_prompt + max_new;
 * *n_seq receives the final length. Each step runs the whole prefix forward (the latent-cache decoder comes with
 * serving); sample draws are keyed by position, so a (seed, prompt) pair always gives the same continuation. */
int k3c_generate(k3c_model *m, int32_t *seq, int64_t n_prompt, const k3c_gen_opts *o, int64_t *n_seq, k3c_err *err);

#endif
