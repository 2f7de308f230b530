/* generate.c — k3c_serve_open (a directory's weights as stored, tokenizer and vision tower) and k3c_generate, the
 * decode loop behind `k3c generate`: one sequence on the inference engine. docs/ENGINE.md "Weights", "The step". */
#include "base/check.h"
#include "serve/weights.h"

#include <stdlib.h>
#include <string.h>

int k3c_serve_open(const char *dir, int with_tok, const char *pattern, k3c_serve *s, k3c_err *err) {
    memset(s, 0, sizeof *s);
    if (!(s->weights = calloc(1, sizeof *s->weights))) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", dir);
    int rc = k3c_weights_open(dir, s->weights, err);
    if (rc) { /* k3c_weights_open left nothing open */
        free(s->weights);
        s->weights = NULL;
        return rc;
    }
    if (with_tok) rc = k3c_tok_load_dir(dir, pattern, &s->tok, err);
    if (!rc && s->weights->cfg.vision.present) rc = k3c_vision_open_f32(dir, 0, &s->vision, err);
    if (rc) k3c_serve_close(s);
    return rc;
}

int k3c_serve_use_backend(k3c_serve *s, const k3c_backend_f32 *backend, k3c_err *err) {
    const k3c_backend_f32 *be = backend;
    if (!be || be == k3c_backend_cpu_f32() || s->weights->be == be) return K3C_OK;
    k3c_weights *dev = calloc(1, sizeof *dev);
    if (!dev) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    int rc = k3c_weights_to_backend(s->weights, be, dev, err);
    if (rc) {
        free(dev);
        return rc;
    }
    k3c_weights_free(s->weights); /* the mapping: every byte the engine reads is now in the backend's memory */
    free(s->weights);
    s->weights = dev;
    return K3C_OK;
}

void k3c_serve_close(k3c_serve *s) {
    k3c_tok_free(s->tok);
    k3c_vision_free(s->vision);
    if (s->weights) k3c_weights_free(s->weights);
    free(s->weights);
    memset(s, 0, sizeof *s);
}

const k3c_config *k3c_weights_config(const k3c_weights *w) { return &w->cfg; }
size_t k3c_weights_device_bytes(const k3c_weights *w) { return w->bytes; }

static int gen_check(const int32_t *seq, int64_t n_prompt, const k3c_gen_opts *o, k3c_err *err) {
    if (!seq || !o) return k3c_errf(err, K3C_EINVAL, "generate: NULL argument");
    if (n_prompt < 1 || o->max_new < 0)
        return k3c_errf(err, K3C_EINVAL,
                        "generate: needs a prompt of at least one id and max_new >= 0 (got %lld, %lld)",
                        (long long)n_prompt, (long long)o->max_new);
    int rc = k3c_sampler_check(&o->sampler, err);
    return rc ? k3c_err_wrap(err, "generate") : K3C_OK;
}

/* Hands id i to the caller; non-zero: stop. The stop id (the engine's finish) is appended but not passed on. */
static int emit(const k3c_gen_opts *o, const k3c_engine_event *ev, int64_t i) {
    const k3c_sampled *t = &ev->token;
    if (ev->finish == K3C_FINISH_STOP) return 1;
    if (o->on_sampled) return o->on_sampled(o->ctx, t, i);
    return o->on_token ? o->on_token(o->ctx, t->id, i) : 0;
}

int k3c_generate(const k3c_weights *w, int32_t *seq, int64_t n_prompt, const k3c_gen_opts *o, int64_t *n_seq,
                 k3c_err *err) {
    if (!w) return k3c_errf(err, K3C_EINVAL, "generate: NULL weights");
    int rc = gen_check(seq, n_prompt, o, err);
    if (rc) return rc;
    *n_seq = n_prompt;
    if (o->max_new == 0) return K3C_OK;
    k3c_engine_opts eo = {.max_seqs = 1, .max_ctx = n_prompt + o->max_new + 1};
    k3c_request r = {.sampler = o->sampler, .max_new = o->max_new, .n_stop = o->stop_id >= 0};
    r.stop_ids[0] = o->stop_id;
    k3c_engine *e;
    int64_t id;
    CHECK_RC(k3c_engine_open_weights(w, &eo, &e, err));
    rc = k3c_engine_submit(e, seq, n_prompt, &r, &id, err);
    k3c_engine_event ev;
    int n_ev, stop = 0;
    while (!rc && !stop && k3c_engine_pending(e) > 0) { /* a step of a long prompt's prefill has no event */
        if ((rc = k3c_engine_step(e, &ev, 1, &n_ev, err)) || n_ev == 0) continue;
        seq[(*n_seq)++] = ev.token.id;
        stop = emit(o, &ev, *n_seq - n_prompt - 1) || ev.finish;
    }
    k3c_engine_close(e);
    return rc;
}

int k3c_model_generate(const k3c_model *m, int32_t *seq, int64_t n_prompt, const k3c_gen_opts *o, int64_t *n_seq,
                       k3c_err *err) {
    if (!m) return k3c_errf(err, K3C_EINVAL, "generate: NULL model");
    k3c_weights w;
    CHECK_RC(k3c_weights_from_model(m, &w, err));
    int rc = k3c_generate(&w, seq, n_prompt, o, n_seq, err);
    k3c_weights_free(&w);
    return rc;
}
