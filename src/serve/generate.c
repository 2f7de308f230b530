/* generate.c — k3c_serve_open (model + tokenizer of a directory) and k3c_generate, the decode loop behind `k3c generate`:
 * one sequence on the inference engine (docs/ENGINE.md), or prefix recomputation for a model on another backend. */
#include "base/check.h"
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

int k3c_serve_open(const char *dir, int with_tok, const char *pattern, k3c_serve *s, k3c_err *err) {
    memset(s, 0, sizeof *s);
    if (!(s->model = calloc(1, sizeof *s->model))) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", dir);
    int rc = k3c_model_open_f32(dir, 0, s->model, err);
    if (!rc && with_tok) rc = k3c_tok_load_dir(dir, pattern, &s->tok, err);
    if (!rc && s->model->cfg.vision.present) rc = k3c_vision_open_f32(dir, 0, &s->vision, err);
    if (rc) k3c_serve_close(s);
    return rc;
}

void k3c_serve_close(k3c_serve *s) {
    k3c_tok_free(s->tok);
    k3c_vision_free(s->vision);
    s->vision = NULL;
    if (s->model) k3c_model_free_f32(s->model); /* frees what open loaded, also after a partial open */
    free(s->model);
    s->tok = NULL;
    s->model = NULL;
}

static int gen_check(const k3c_model *m, const int32_t *seq, int64_t n_prompt, const k3c_gen_opts *o, k3c_err *err) {
    if (!m || !seq || !o) return k3c_errf(err, K3C_EINVAL, "generate: NULL argument");
    if (n_prompt < 1 || o->max_new < 0)
        return k3c_errf(err, K3C_EINVAL,
                        "generate: needs a prompt of at least one id and max_new >= 0 (got %lld, %lld)",
                        (long long)n_prompt, (long long)o->max_new);
    int rc = k3c_sampler_check(&o->sampler, err);
    return rc ? k3c_err_wrap(err, "generate") : K3C_OK;
}

/* Hands id i to the caller; non-zero: stop. The stop id is appended but not passed on. */
static int emit(const k3c_gen_opts *o, const k3c_sampled *t, int64_t i) {
    if (t->id == o->stop_id) return 1;
    if (o->on_sampled) return o->on_sampled(o->ctx, t, i);
    return o->on_token ? o->on_token(o->ctx, t->id, i) : 0;
}

/* A model on another backend (the GPU): recompute the prefix for every token. */
static int generate_recompute(k3c_model *m, int32_t *seq, int64_t n_prompt, const k3c_gen_opts *o, int64_t *n_seq,
                              k3c_err *err) {
    int64_t V = m->cfg.vocab_size, len = n_prompt;
    k3c_arena arena = {0};
    float *last = malloc(sizeof(float) * (size_t)V);
    void *ws = malloc(k3c_sample_workspace(V));
    int rc = ws && last
                 ? k3c_model_arena_init_f32(m, k3c_model_plan_bytes_f32(m, n_prompt + o->max_new, 1), &arena, err)
                 : k3c_errf(err, K3C_ENOMEM, "generate: out of memory");
    for (int64_t i = 0; !rc && i < o->max_new; i++) {
        k3c_arena_reset(&arena, 0);
        k3c_model_batch b = {len, 1, seq, NULL, NULL, 0, 0, NULL, NULL, NULL, NULL};
        k3c_acts *acts;
        float *logits;
        if ((rc = k3c_model_forward_f32(m, &b, &arena, &acts, NULL, &logits, err))) break;
        /* the last row only, into host memory (the sampler runs on the host) */
        if ((rc = k3c_model_download_f32(m, last, logits + (len - 1) * V, sizeof(float) * (size_t)V, err))) break;
        k3c_history h = {seq, n_prompt, seq + n_prompt, len - n_prompt};
        k3c_sampled t;
        seq[len] = k3c_sample_seq(&o->sampler, last, V, (uint64_t)len, &h, &t, ws);
        len++;
        if (emit(o, &t, i)) break;
    }
    *n_seq = len;
    k3c_model_arena_free_f32(m, &arena);
    free(last);
    free(ws);
    return rc;
}

int k3c_generate(k3c_model *m, int32_t *seq, int64_t n_prompt, const k3c_gen_opts *o, int64_t *n_seq, k3c_err *err) {
    int rc = gen_check(m, seq, n_prompt, o, err);
    if (rc) return rc;
    *n_seq = n_prompt;
    if (o->max_new == 0) return K3C_OK;
    if (m->precision != K3C_F32) return generate_recompute(m, seq, n_prompt, o, n_seq, err);
    k3c_engine_opts eo = {.max_seqs = 1, .max_ctx = n_prompt + o->max_new + 1};
    k3c_request r = {.sampler = o->sampler, .max_new = o->max_new, .n_stop = o->stop_id >= 0};
    r.stop_ids[0] = o->stop_id;
    k3c_engine *e;
    int64_t id;
    CHECK_RC(k3c_engine_open(m, &eo, &e, err));
    rc = k3c_engine_submit(e, seq, n_prompt, &r, &id, err);
    k3c_engine_event ev;
    int n_ev, stop = 0;
    while (!rc && !stop && k3c_engine_pending(e) > 0) { /* a step of a long prompt's prefill has no event */
        if ((rc = k3c_engine_step(e, &ev, 1, &n_ev, err)) || n_ev == 0) continue;
        seq[(*n_seq)++] = ev.token.id;
        stop = emit(o, &ev.token, *n_seq - n_prompt - 1) || ev.finish;
    }
    k3c_engine_close(e);
    return rc;
}
