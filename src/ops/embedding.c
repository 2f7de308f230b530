/* embedding.c — token embedding gather (forward) and scatter-add (backward) over a table E[V, D].
 * Spec: docs/MODEL.md §1.1 (model.embed_tokens feeds the first decoder layer). */
#include "base/real.h"
#include "ops/basic.h"

#include <string.h>

static int check_ids(const k3c_embedding_sizes *s, const int32_t *ids, const char *op, k3c_err *err) {
    if (!s || s->T < 0 || s->V <= 0 || s->D <= 0) return k3c_errf(err, K3C_EINVAL, "%s: bad sizes", op);
    for (int64_t t = 0; t < s->T; t++)
        if (ids[t] < 0 || ids[t] >= s->V)
            return k3c_errf(err, K3C_EINVAL, "%s: token %lld has id %d outside [0, %lld)", op, (long long)t, ids[t],
                            (long long)s->V);
    return K3C_OK;
}

int k3c_embedding_fwd(const k3c_embedding_sizes *s, const int32_t *ids, const real *E, real *y, k3c_err *err) {
    int rc = check_ids(s, ids, "embedding_fwd", err);
    if (rc) return rc;
    const int64_t D = s->D;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < s->T; t++) memcpy(y + t * D, E + (int64_t)ids[t] * D, (size_t)D * sizeof(real));
    return K3C_OK;
}

/* Parallel over column blocks so that repeated ids never race and the sum order is the token order. */
int k3c_embedding_bwd(const k3c_embedding_sizes *s, const int32_t *ids, const real *dy, real *dE, k3c_err *err) {
    int rc = check_ids(s, ids, "embedding_bwd", err);
    if (rc || !dE) return rc;
    const int64_t D = s->D, CB = 256, nb = (D + CB - 1) / CB;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t c0 = b * CB, c1 = c0 + CB < D ? c0 + CB : D;
        for (int64_t t = 0; t < s->T; t++) {
            real *dst = dE + (int64_t)ids[t] * D;
            const real *src = dy + t * D;
            for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
        }
    }
    return K3C_OK;
}
