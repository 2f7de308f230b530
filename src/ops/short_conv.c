/* short_conv.c — depthwise causal short convolution + SiLU with packed-document resets and decode conv state.
 * Spec: docs/MODEL.md §3.1 step 2, §3.4 "Short-conv backward", §3.5. */
#include "base/real.h"
#include "ops/short_conv.h"

#include <string.h>

#define CBLOCK 32          /* channels per task in the parameter-gradient pass */
#define PAR_MIN_WORK 32768 /* elements below which a loop runs on one thread */

static int sc_check(const k3c_short_conv_dims *d, const int32_t *cu, const char *op, k3c_err *err) {
    if (!d || d->T < 0 || d->C <= 0 || d->W < 1 || d->W > K3C_SHORT_CONV_MAX_W)
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes (T >= 0, C > 0, W in 1..%d)", op, K3C_SHORT_CONV_MAX_W);
    if (!cu) return 0;
    if (d->n_docs <= 0 || cu[0] != 0 || cu[d->n_docs] != d->T)
        return k3c_errf(err, K3C_EINVAL, "%s: cu_seqlens must hold n_docs + 1 offsets from 0 to T = %lld", op,
                        (long long)d->T);
    for (int i = 0; i < d->n_docs; i++)
        if (cu[i + 1] < cu[i]) return k3c_errf(err, K3C_EINVAL, "%s: cu_seqlens[%d] < cu_seqlens[%d]", op, i + 1, i);
    return 0;
}

/* The document holding token t: the last i with cu[i] <= t (skips empty documents). */
static int doc_of(const int32_t *cu, int n_docs, int64_t t) {
    if (!cu) return 0;
    int lo = 0, hi = n_docs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (cu[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static real sigm(real x) {
    if (x >= 0) return 1 / (1 + rexp(-x));
    real e = rexp(x);
    return e / (1 + e);
}

/* Input of channel c at position s of a document starting at t0: x, or the conv state before the start (or zero). */
static real conv_in(const real *x, const real *st, int64_t C, int W, int64_t t0, int64_t s, int64_t c) {
    if (s >= t0) return x[s * C + c];
    int64_t j = s - t0 + W - 1;
    return st && j >= 0 ? st[c * (W - 1) + j] : 0;
}

/* Pre-activation a_t[c] for all channels of token t. */
static void preact(const k3c_short_conv_dims *d, const int32_t *cu, const real *x, const real *w, const real *state_in,
                   int64_t t, real *a) {
    const int64_t C = d->C, W = d->W;
    const int doc = doc_of(cu, d->n_docs, t);
    const int64_t t0 = cu ? cu[doc] : 0;
    const real *st = state_in ? state_in + (int64_t)doc * C * (W - 1) : NULL;
    for (int64_t c = 0; c < C; c++) a[c] = 0;
    for (int64_t j = 0; j < W; j++) {
        const int64_t s = t - W + 1 + j;
        if (s >= t0)
            for (int64_t c = 0; c < C; c++) a[c] += w[c * W + j] * x[s * C + c];
        else if (st)
            for (int64_t c = 0; c < C; c++) a[c] += w[c * W + j] * conv_in(x, st, C, (int)W, t0, s, c);
    }
}

int k3c_short_conv_fwd(const k3c_short_conv_dims *d, const int32_t *cu_seqlens, const real *x, const real *w,
                       const real *state_in, real *y, real *state_out, k3c_err *err) {
    int rc = sc_check(d, cu_seqlens, "short_conv_fwd", err);
    if (rc) return rc;
    const int64_t C = d->C, W = d->W;
    const int nd = cu_seqlens ? d->n_docs : 1;
#pragma omp parallel for schedule(static) if (d->T * C > PAR_MIN_WORK)
    for (int64_t t = 0; t < d->T; t++) {
        real *a = y + t * C;
        preact(d, cu_seqlens, x, w, state_in, t, a);
        for (int64_t c = 0; c < C; c++) a[c] = a[c] * sigm(a[c]);
    }
    if (!state_out || W == 1) return 0;
        /* New entry j comes from position t1 − W + 1 + j, i.e. old entry j + len when before the start: ascending j never
     * reads an entry it has already overwritten, so state_out may alias state_in. */
#pragma omp parallel for schedule(static) if ((int64_t)nd * C * W > PAR_MIN_WORK)
    for (int64_t dc = 0; dc < (int64_t)nd * C; dc++) {
        const int doc = (int)(dc / C);
        const int64_t c = dc % C;
        const int64_t t0 = cu_seqlens ? cu_seqlens[doc] : 0, t1 = cu_seqlens ? cu_seqlens[doc + 1] : d->T;
        const real *st = state_in ? state_in + (int64_t)doc * C * (W - 1) : NULL;
        real *so = state_out + (int64_t)doc * C * (W - 1);
        for (int64_t j = 0; j < W - 1; j++) so[c * (W - 1) + j] = conv_in(x, st, C, (int)W, t0, t1 - W + 1 + j, c);
    }
    return 0;
}

size_t k3c_short_conv_bwd_workspace(const k3c_short_conv_dims *d) { return (size_t)(d->T * d->C) * sizeof(real); }

/* dx, dw and dstate from da (pre-activation gradient, in ws). */
static void conv_bwd_params(const k3c_short_conv_dims *d, const int32_t *cu, const real *x, const real *w,
                            const real *state_in, const real *da, real *dw, real *dstate_in) {
    const int64_t C = d->C, W = d->W, nb = (C + CBLOCK - 1) / CBLOCK;
    const int nd = cu ? d->n_docs : 1;
#pragma omp parallel for schedule(dynamic, 1) if (d->T * C > PAR_MIN_WORK)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t c0 = b * CBLOCK, c1 = c0 + CBLOCK < C ? c0 + CBLOCK : C;
        for (int doc = 0; doc < nd; doc++) {
            const int64_t t0 = cu ? cu[doc] : 0, t1 = cu ? cu[doc + 1] : d->T;
            const real *st = state_in ? state_in + (int64_t)doc * C * (W - 1) : NULL;
            real *dst = dstate_in ? dstate_in + (int64_t)doc * C * (W - 1) : NULL;
            for (int64_t t = t0; t < t1; t++)
                for (int64_t j = 0; j < W; j++) {
                    const int64_t s = t - W + 1 + j;
                    if (s >= t0) {
                        if (dw)
                            for (int64_t c = c0; c < c1; c++) dw[c * W + j] += da[t * C + c] * x[s * C + c];
                    } else if (s - t0 + W - 1 >= 0) {
                        const int64_t js = s - t0 + W - 1;
                        for (int64_t c = c0; c < c1; c++) {
                            if (dw && st) dw[c * W + j] += da[t * C + c] * st[c * (W - 1) + js];
                            if (dst) dst[c * (W - 1) + js] += da[t * C + c] * w[c * W + j];
                        }
                    }
                }
        }
    }
}

int k3c_short_conv_bwd(const k3c_short_conv_dims *d, const int32_t *cu_seqlens, const real *x, const real *w,
                       const real *state_in, const real *dy, real *dx, real *dw, real *dstate_in, void *ws,
                       k3c_err *err) {
    int rc = sc_check(d, cu_seqlens, "short_conv_bwd", err);
    if (rc) return rc;
    if (!ws && d->T > 0) return k3c_errf(err, K3C_EINVAL, "short_conv_bwd: ws is NULL");
    const int64_t C = d->C, W = d->W;
    real *da = (real *)ws;
#pragma omp parallel for schedule(static) if (d->T * C > PAR_MIN_WORK)
    for (int64_t t = 0; t < d->T; t++) { /* da = dy · SiLU'(a), SiLU'(a) = σ(a)(1 + a(1 − σ(a))) */
        real *a = da + t * C;
        preact(d, cu_seqlens, x, w, state_in, t, a);
        for (int64_t c = 0; c < C; c++) {
            const real s = sigm(a[c]);
            a[c] = dy[t * C + c] * s * (1 + a[c] * (1 - s));
        }
    }
    if (dx) { /* dx_τ = Σ_j w[j] da_{τ+W−1−j}, the later token in the same document (anti-causal) */
#pragma omp parallel for schedule(static) if (d->T * C > PAR_MIN_WORK)
        for (int64_t t = 0; t < d->T; t++) {
            const int doc = doc_of(cu_seqlens, d->n_docs, t);
            const int64_t t1 = cu_seqlens ? cu_seqlens[doc + 1] : d->T;
            for (int64_t j = 0; j < W; j++) {
                const int64_t u = t + W - 1 - j;
                if (u >= t1) continue;
                for (int64_t c = 0; c < C; c++) dx[t * C + c] += w[c * W + j] * da[u * C + c];
            }
        }
    }
    if (dw || dstate_in) conv_bwd_params(d, cu_seqlens, x, w, state_in, da, dw, dstate_in);
    return 0;
}
