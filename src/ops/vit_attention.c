/* vit_attention.c — the vision tower's attention: non-causal softmax attention restricted to each packed item
 * (block-diagonal by grid_thws), forward with the row log-sum-exp and a recomputing backward. Materialises nothing:
 * scores are recomputed per pass, which keeps the reference short and workspace-free.
 * Spec: docs/VISION.md "Blocks" (eager_attention with the cu_seqlens mask). */
#include "base/real.h"
#include "ops/vision_ops.h"

#include <float.h>

enum { MAX_DH = 512 };

static int check(const k3c_vit_attn_sizes *s, const int32_t *cu, int n, const char *op, k3c_err *err) {
    if (!s || s->L < 0 || s->H <= 0 || s->dh <= 0 || s->dh > MAX_DH || !cu || n < 0)
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes (head dim at most %d)", op, MAX_DH);
    if (cu[0] != 0 || cu[n] != s->L) return k3c_errf(err, K3C_EINVAL, "%s: cu_seqlens must run from 0 to L", op);
    for (int i = 0; i < n; i++)
        if (cu[i + 1] < cu[i]) return k3c_errf(err, K3C_EINVAL, "%s: cu_seqlens decrease at item %d", op, i);
    return K3C_OK;
}

/* The item holding token i. */
static int item_of(const int32_t *cu, int n, int64_t i) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (cu[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static inline double dot(const real *a, const real *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

int k3c_vit_attention_fwd(const k3c_vit_attn_sizes *s, const int32_t *cu, int n, const real *q, const real *k,
                          const real *v, real *o, real *lse, k3c_err *err) {
    int rc = check(s, cu, n, "vit_attention_fwd", err);
    if (rc) return rc;
    const int64_t H = s->H, dh = s->dh, ld = H * dh;
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t r = 0; r < s->L * H; r++) {
        const int64_t i = r / H, h = r % H;
        const int d = item_of(cu, n, i);
        const real *qi = q + i * ld + h * dh;
        double mx = -DBL_MAX, sum = 0, acc[MAX_DH] = {0};
        for (int64_t j = cu[d]; j < cu[d + 1]; j++) {
            double sc = s->scale * dot(qi, k + j * ld + h * dh, dh);
            mx = sc > mx ? sc : mx;
        }
        for (int64_t j = cu[d]; j < cu[d + 1]; j++) {
            double p = exp(s->scale * dot(qi, k + j * ld + h * dh, dh) - mx);
            sum += p;
            for (int64_t c = 0; c < dh; c++) acc[c] += p * v[j * ld + h * dh + c];
        }
        for (int64_t c = 0; c < dh; c++) o[i * ld + h * dh + c] = (real)(acc[c] / sum);
        lse[i * H + h] = (real)(mx + log(sum));
    }
    return K3C_OK;
}

/* dS_ij = P_ij (dO_i·v_j − Δ_i), Δ_i = dO_i·o_i; dq_i = scale Σ_j dS_ij k_j; dk_j = scale Σ_i dS_ij q_i; dv_j = Σ_i P_ij dO_i. */
int k3c_vit_attention_bwd(const k3c_vit_attn_sizes *s, const int32_t *cu, int n, const real *q, const real *k,
                          const real *v, const real *o, const real *lse, const real *dout, real *dq, real *dk, real *dv,
                          k3c_err *err) {
    int rc = check(s, cu, n, "vit_attention_bwd", err);
    if (rc) return rc;
    if (!lse || !o || !dout) return k3c_errf(err, K3C_EINVAL, "vit_attention_bwd: o, lse and dout are required");
    const int64_t H = s->H, dh = s->dh, ld = H * dh;
#define AT(p, t) ((p) + (t)*ld + h * dh)
    if (dq)
#pragma omp parallel for schedule(dynamic, 4)
        for (int64_t r = 0; r < s->L * H; r++) {
            const int64_t i = r / H, h = r % H;
            const int d = item_of(cu, n, i);
            const double delta = dot(AT(dout, i), AT(o, i), dh);
            double acc[MAX_DH] = {0};
            for (int64_t j = cu[d]; j < cu[d + 1]; j++) {
                double p = exp(s->scale * dot(AT(q, i), AT(k, j), dh) - lse[i * H + h]);
                double ds = p * (dot(AT(dout, i), AT(v, j), dh) - delta) * s->scale;
                for (int64_t c = 0; c < dh; c++) acc[c] += ds * AT(k, j)[c];
            }
            for (int64_t c = 0; c < dh; c++) AT(dq, i)[c] += (real)acc[c];
        }
    if (dk || dv)
#pragma omp parallel for schedule(dynamic, 4)
        for (int64_t r = 0; r < s->L * H; r++) {
            const int64_t j = r / H, h = r % H;
            const int d = item_of(cu, n, j);
            double ak[MAX_DH] = {0}, av[MAX_DH] = {0};
            for (int64_t i = cu[d]; i < cu[d + 1]; i++) {
                double p = exp(s->scale * dot(AT(q, i), AT(k, j), dh) - lse[i * H + h]);
                double delta = dot(AT(dout, i), AT(o, i), dh);
                double ds = p * (dot(AT(dout, i), AT(v, j), dh) - delta) * s->scale;
                for (int64_t c = 0; c < dh; c++) {
                    ak[c] += ds * AT(q, i)[c];
                    av[c] += p * AT(dout, i)[c];
                }
            }
            for (int64_t c = 0; c < dh; c++) {
                if (dk) AT(dk, j)[c] += (real)ak[c];
                if (dv) AT(dv, j)[c] += (real)av[c];
            }
        }
#undef AT
    return K3C_OK;
}
