/* quantile_balance.c — Quantile Balancing: the exact per-expert order-statistic bias update, the separable histogram estimator with
 * in-bin interpolation, and expert-load telemetry. Spec: docs/MODEL.md §7.2 (exact rule), §7.3 (App. D), §7.4. */
#include "ops/quantile_balance.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void k3c_qb_centre(float *b, int64_t n) {
    if (n < 1) return;
    double sum = 0;
    for (int64_t j = 0; j < n; j++) sum += b[j];
    const double mean = sum / (double)n;
    for (int64_t j = 0; j < n; j++) b[j] = (float)((double)b[j] - mean);
}

static int check_sizes(const char *op, int64_t m, int64_t n, int64_t k, k3c_err *err) {
    if (m < 0 || n < 2 || k < 1 || k >= n)
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes m = %lld, n = %lld, k = %lld (need 1 <= k < n)", op,
                        (long long)m, (long long)n, (long long)k);
    return K3C_OK;
}

static void swapf(float *a, float *b) {
    float t = *a;
    *a = *b;
    *b = t;
}

/* The kth smallest (0-based) of a[0..n) (reordered in place): quickselect with median-of-three pivots. The value is a
 * pure function of the multiset, so the result is deterministic whatever the pivots. */
static float select_kth(float *a, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (hi > lo) {
        int64_t mid = lo + (hi - lo) / 2;
        if (a[mid] < a[lo]) swapf(&a[mid], &a[lo]);
        if (a[hi] < a[lo]) swapf(&a[hi], &a[lo]);
        if (a[hi] < a[mid]) swapf(&a[hi], &a[mid]);
        const float pivot = a[mid];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot) i++;
            while (pivot < a[j]) j--;
            if (i <= j) {
                swapf(&a[i], &a[j]);
                i++;
                j--;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            return a[k];
    }
    return a[k];
}

static int64_t counted(const uint8_t *mask, int64_t m) {
    if (!mask) return m;
    int64_t c = 0;
    for (int64_t i = 0; i < m; i++) c += mask[i] != 0;
    return c;
}

size_t k3c_qb_exact_workspace(int64_t m, int64_t n) { return (size_t)m * (size_t)n * sizeof(float); }

int64_t k3c_qb_exact(const float *s, const float *alpha, const uint8_t *mask, int64_t m, int64_t n, int64_t k,
                     float *b_raw, void *ws, k3c_err *err) {
    int rc = check_sizes("qb_exact", m, n, k, err);
    if (rc) return rc;
    const int64_t mc = counted(mask, m);
    if (mc == 0) return 0;
    float *cols = ws ? ws : malloc(k3c_qb_exact_workspace(mc, n));
    if (!cols) return k3c_errf(err, K3C_ENOMEM, "qb_exact: out of memory for %lld x %lld", (long long)n, (long long)mc);
    const int64_t q = mc * k / n; /* ⌊m·k/n⌋, see qb.h */
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
    for (int64_t j = 0; j < n; j++) {
        float *r = cols + j * mc;
        int64_t c = 0;
        for (int64_t i = 0; i < m; i++) {
            if (mask && !mask[i]) continue;
            r[c] = alpha[i] - s[i * n + j];
            bad |= !isfinite(r[c]);
            c++;
        }
        /* (q+1)-th largest μ = −[(q+1)-th smallest r]: b̃_j = r at ascending index q. */
        if (!bad) b_raw[j] = select_kth(r, mc, q);
    }
    if (!ws) free(cols);
    if (bad) return k3c_errf(err, K3C_ENUMERIC, "qb_exact: non-finite router score or cutoff");
    return mc;
}

int k3c_qb_hist_begin(k3c_qb_hist *h, const float *b, int64_t n, int64_t bins, int64_t *counts, k3c_err *err) {
    if (n < 1 || bins < 1)
        return k3c_errf(err, K3C_EINVAL, "qb_hist: bad n = %lld or bins = %lld", (long long)n, (long long)bins);
    double bmin = INFINITY, bmax = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        if (!isfinite(b[j])) return k3c_errf(err, K3C_ENUMERIC, "qb_hist: bias[%lld] = %g", (long long)j, (double)b[j]);
        if (b[j] < bmin) bmin = b[j];
        if (b[j] > bmax) bmax = b[j];
    }
    h->n = n;
    h->bins = bins;
    h->lo = bmin - 1.0;
    h->width = (bmax - bmin + 2.0) / (double)bins;
    h->counts = counts;
    memset(counts, 0, (size_t)n * (size_t)bins * sizeof *counts);
    return K3C_OK;
}

int k3c_qb_hist_add(const k3c_qb_hist *h, const float *s, const float *alpha, const uint8_t *mask, int64_t m,
                    k3c_err *err) {
    const int64_t n = h->n, B = h->bins;
    const double inv_w = 1.0 / h->width;
    int bad = 0;
    /* One thread per expert row of counts: no atomics, and integer counts make the order irrelevant anyway. */
#pragma omp parallel for schedule(static) reduction(| : bad)
    for (int64_t j = 0; j < n; j++) {
        int64_t *row = h->counts + j * B;
        for (int64_t i = 0; i < m; i++) {
            if (mask && !mask[i]) continue;
            const double r = (double)alpha[i] - (double)s[i * n + j];
            if (!isfinite(r)) {
                bad = 1;
                continue;
            }
            double x = floor((r - h->lo) * inv_w);
            int64_t bin = x < 0 ? 0 : x >= (double)B ? B - 1 : (int64_t)x;
            row[bin]++;
        }
    }
    if (bad) return k3c_errf(err, K3C_ENUMERIC, "qb_hist: non-finite router score or cutoff");
    return K3C_OK;
}

int64_t k3c_qb_hist_readout(const k3c_qb_hist *h, int64_t k, float *b_raw, k3c_err *err) {
    const int64_t n = h->n, B = h->bins;
    int rc = check_sizes("qb_hist", 0, n, k, err);
    if (rc) return rc;
    int64_t tokens = 0;
    for (int64_t b = 0; b < B; b++) tokens += h->counts[b];
    if (tokens == 0) return 0;
    const double q = (double)tokens * (double)k / (double)n;
    const int64_t target = (tokens * k + n - 1) / n; /* ⌈q⌉ ≥ 1 */
    for (int64_t j = 0; j < n; j++) {
        const int64_t *row = h->counts + j * B;
        int64_t c = 0, bin = 0;
        while (bin < B && c + row[bin] < target) c += row[bin++];
        if (bin == B)
            return k3c_errf(err, K3C_EINVAL, "qb_hist: expert %lld holds fewer counts than expert 0 (%lld)",
                            (long long)j, (long long)tokens);
        double frac = (q - (double)c) / (double)row[bin];
        frac = frac < 0 ? 0 : frac > 1 ? 1 : frac;
        b_raw[j] = (float)(h->lo + ((double)bin + frac) * h->width);
    }
    return tokens;
}

size_t k3c_qb_workspace(int mode, int64_t m, int64_t n) {
    size_t own = (size_t)n * sizeof(float);
    own = (own + 63) / 64 * 64;
    if (mode == K3C_QB_HISTOGRAM) return own + (size_t)n * K3C_QB_BINS * sizeof(int64_t);
    return own + k3c_qb_exact_workspace(m, n);
}

int64_t k3c_qb_update(int mode, const float *s, const float *alpha, const uint8_t *mask, int64_t m, int64_t n,
                      int64_t k, float *b, void *ws, k3c_err *err) {
    int rc = check_sizes("qb_update", m, n, k, err);
    if (rc) return rc;
    if (mode != K3C_QB_EXACT && mode != K3C_QB_HISTOGRAM)
        return k3c_errf(err, K3C_EINVAL, "qb_update: unknown mode %d", mode);
    unsigned char *mem = ws ? ws : malloc(k3c_qb_workspace(mode, m, n));
    if (!mem) return k3c_errf(err, K3C_ENOMEM, "qb_update: out of memory");
    float *b_raw = (float *)mem;
    void *rest = mem + ((size_t)n * sizeof(float) + 63) / 64 * 64;
    int64_t got;
    if (mode == K3C_QB_EXACT) {
        got = k3c_qb_exact(s, alpha, mask, m, n, k, b_raw, rest, err);
    } else {
        k3c_qb_hist h;
        got = k3c_qb_hist_begin(&h, b, n, K3C_QB_BINS, rest, err);
        if (got == 0) got = k3c_qb_hist_add(&h, s, alpha, mask, m, err);
        if (got == 0) got = k3c_qb_hist_readout(&h, k, b_raw, err);
    }
    if (got > 0) {
        k3c_qb_centre(b_raw, n);
        memcpy(b, b_raw, (size_t)n * sizeof *b);
    }
    if (!ws) free(mem);
    return got;
}

int k3c_moe_load_stats(const int32_t *topk_ids, const uint8_t *mask, int64_t m, int64_t k, int64_t n, int64_t *loads,
                       k3c_load_stats *st, k3c_err *err) {
    if (m < 0 || k < 1 || n < 1)
        return k3c_errf(err, K3C_EINVAL, "moe_load_stats: bad sizes m = %lld, k = %lld, n = %lld", (long long)m,
                        (long long)k, (long long)n);
    memset(loads, 0, (size_t)n * sizeof *loads);
    for (int64_t i = 0; i < m; i++) {
        if (mask && !mask[i]) continue;
        for (int64_t j = 0; j < k; j++) {
            int32_t e = topk_ids[i * k + j];
            if (e < -1 || e >= n)
                return k3c_errf(err, K3C_EINVAL, "moe_load_stats: token %lld slot %lld has expert id %d (n = %lld)",
                                (long long)i, (long long)j, (int)e, (long long)n);
            if (e >= 0) loads[e]++;
        }
    }
    memset(st, 0, sizeof *st);
    st->max = st->min = loads[0];
    for (int64_t e = 0; e < n; e++) {
        st->routes += loads[e];
        if (loads[e] > st->max) st->max = loads[e];
        if (loads[e] < st->min) st->min = loads[e];
    }
    st->mean = (double)st->routes / (double)n;
    if (st->routes == 0) return K3C_OK;
    double var = 0;
    for (int64_t e = 0; e < n; e++) var += ((double)loads[e] - st->mean) * ((double)loads[e] - st->mean);
    st->max_over_mean = (double)st->max / st->mean;
    st->min_over_mean = (double)st->min / st->mean;
    st->cv = sqrt(var / (double)n) / st->mean;
    return K3C_OK;
}
