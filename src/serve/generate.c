/* generate.c — k3c_serve_open (model + tokenizer of a directory) and k3c_generate, the decode loop behind `k3c generate`:
 * recompute the prefix, sample the next id from the last row of logits, append, hand it to the caller's callback. */
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

int k3c_serve_open(const char *dir, int with_tok, const char *pattern, k3c_serve *s, k3c_err *err) {
    memset(s, 0, sizeof *s);
    if (!(s->model = calloc(1, sizeof *s->model))) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", dir);
    int rc = k3c_model_open_f32(dir, 0, s->model, err);
    if (!rc && with_tok) rc = k3c_tok_load_dir(dir, pattern, &s->tok, err);
    if (rc) k3c_serve_close(s);
    return rc;
}

void k3c_serve_close(k3c_serve *s) {
    k3c_tok_free(s->tok);
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
    if (!(o->sampler.temperature >= 0) || !(o->sampler.top_p > 0 && o->sampler.top_p <= 1))
        return k3c_errf(err, K3C_EINVAL, "generate: temperature %g must be >= 0 and top-p %g in (0, 1]",
                        o->sampler.temperature, o->sampler.top_p);
    return 0;
}

int k3c_generate(k3c_model *m, int32_t *seq, int64_t n_prompt, const k3c_gen_opts *o, int64_t *n_seq, k3c_err *err) {
    int rc = gen_check(m, seq, n_prompt, o, err);
    if (rc) return rc;
    int64_t V = m->cfg.vocab_size, len = n_prompt;
    k3c_arena arena = {0};
    float *pw = malloc(sizeof(float) * (size_t)V), *last = malloc(sizeof(float) * (size_t)V);
    int32_t *iw = malloc(sizeof(int32_t) * (size_t)V);
    rc = pw && iw && last
             ? k3c_model_arena_init_f32(m, k3c_model_plan_bytes_f32(m, n_prompt + o->max_new, 1), &arena, err)
             : k3c_errf(err, K3C_ENOMEM, "generate: out of memory");
    for (int64_t i = 0; !rc && i < o->max_new; i++) {
        k3c_arena_reset(&arena, 0);
        k3c_model_batch b = {len, 1, seq, NULL, NULL, 0, 0, NULL, NULL, NULL};
        k3c_acts *acts;
        float *logits;
        if ((rc = k3c_model_forward_f32(m, &b, &arena, &acts, NULL, &logits, err))) break;
        /* the last row only, into host memory (the sampler runs on the host) */
        if ((rc = k3c_model_download_f32(m, last, logits + (len - 1) * V, sizeof(float) * (size_t)V, err))) break;
        int32_t next = k3c_sample(&o->sampler, last, V, (uint64_t)len, pw, iw);
        seq[len++] = next;
        if (next == o->stop_id || (o->on_token && o->on_token(o->ctx, next, i))) break;
    }
    *n_seq = len;
    k3c_model_arena_free_f32(m, &arena);
    free(pw);
    free(last);
    free(iw);
    return rc;
}
