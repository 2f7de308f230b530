/* head.c — the chunked head: lm_head → cross-entropy over chunks of tokens, forward (the loss and lse, no [T, V]
 * logits kept) and backward (each chunk's logits again from hn, then its dlogits, dxn and the lm_head gradient).
 * Spec: docs/TRAINING.md §1.4 "Chunked head". */
#include "base/check.h"
#include "base/real.h"
#include "model/acts.h"

int64_t k3c_head_rows(const k3c_model *m, int64_t T) {
    return m->head_chunk > 0 && m->head_chunk < T ? m->head_chunk : T;
}

int k3c_head_check(const k3c_model *m, int64_t T, k3c_err *err) {
    if (m->head_chunk < 0)
        return k3c_errf(err, K3C_EINVAL, "head_chunk = %lld (tokens a chunk, 0 = off)", (long long)m->head_chunk);
    if (k3c_head_rows(m, T) < T && m->tp) /* the vocabulary-parallel cross-entropy takes the whole batch */
        return k3c_errf(err, K3C_EUNSUPPORTED, "head_chunk = %lld with tensor parallelism is not built",
                        (long long)m->head_chunk);
    return K3C_OK;
}

/* The chunk's logits [n, V] into a->logits (one chunk's rows): the same product as the forward's, so the backward
 * sees the logits its saved lse was taken over. */
static int chunk_logits(k3c_acts *a, int64_t t0, int64_t n, k3c_err *err) {
    const k3c_config *c = &a->st.m->cfg;
    return k3c_proj1(&a->st, n, &a->st.views->lm_head, c->hidden_size, c->vocab_size, a->hn + t0 * c->hidden_size,
                     a->logits, err);
}

static k3c_xent_sizes chunk_sizes(const k3c_acts *a, int64_t t0, int64_t n) {
    return (k3c_xent_sizes){n, a->st.m->cfg.vocab_size, a->loss_norm, a->weight ? a->weight + t0 : NULL};
}

int k3c_head_chunked_fwd(k3c_acts *a, double *loss, k3c_err *err) {
    const int64_t T = a->T, C = k3c_head_rows(a->st.m, T);
    double sum = 0;
    for (int64_t t0 = 0; t0 < T; t0 += C) {
        const int64_t n = T - t0 < C ? T - t0 : C;
        const k3c_xent_sizes xs = chunk_sizes(a, t0, n);
        double l = 0;
        CHECK_RC(chunk_logits(a, t0, n, err));
        CHECK_RC(a->st.be->xent_fwd(&xs, a->logits, a->targets + t0, NULL, a->lse + t0, &l, NULL, err));
        sum += l;
    }
    *loss = sum;
    return K3C_OK;
}

int k3c_head_chunked_bwd(k3c_acts *a, double scale, real *dxn, real *dW, k3c_err *err) {
    const k3c_backend *be = a->st.be;
    const int64_t T = a->T, C = k3c_head_rows(a->st.m, T), D = a->st.m->cfg.hidden_size, V = a->st.m->cfg.vocab_size;
    const real *W = (const real *)a->st.w + a->st.m->table.glob.lm_head;
    size_t mark = k3c_arena_mark(a->arena);
    real *dlogits = k3c_tmp_zeros(&a->st, a->arena, C * V, err);
    if (!dlogits) return k3c_errf(err, K3C_ENOMEM, "backward: activation arena too small for a head chunk's dlogits");
    int rc = K3C_OK;
    for (int64_t t0 = 0; !rc && t0 < T; t0 += C) {
        const int64_t n = T - t0 < C ? T - t0 : C;
        const k3c_xent_sizes xs = chunk_sizes(a, t0, n);
        const k3c_linear_sizes ls = {n, D, V, 0};
        rc = chunk_logits(a, t0, n, err);
        if (!rc && t0 > 0) rc = be->zero(dlogits, n * V, err); /* xent_bwd adds into it */
        if (!rc) rc = be->xent_bwd(&xs, a->logits, a->targets + t0, NULL, a->lse + t0, scale, dlogits, err);
        /* dx of the chunk's rows, and dW summed over the chunks (linear_bwd adds into both) */
        if (!rc) rc = be->linear_bwd(be->ctx, &ls, a->hn + t0 * D, W, dlogits, dxn + t0 * D, dW, err);
    }
    k3c_arena_reset(a->arena, mark);
    return rc;
}
