/* test_qb.c — Quantile Balancing: Fig. 5, convergence on a strongly skewed router, histogram vs exact, separability
 * over micro-batches, padding masks, and load telemetry; the auxiliary-loss-free bias step (DeepSeek-V3) of its
 * baseline arm. Spec: docs/MODEL.md §7.2–§7.4, docs/TRAINING.md §1.6. */
#include "test.h"
#include "ops/backend.h"
#include "ops/quantile_balance.h"

/* Reference routing: top-k of s + b per token (descending, ties to the lower expert index, as the router op), and the
 * cutoff α = the (k+1)-th largest biased score. */
static void route(const float *s, const float *b, int64_t m, int64_t n, int64_t k, int32_t *ids, float *alpha) {
    for (int64_t i = 0; i < m; i++) {
        float best[65];
        int32_t idx[65];
        int have = 0;
        for (int64_t j = 0; j < n; j++) {
            float v = s[i * n + j] + b[j];
            if (have == k + 1 && !(v > best[k])) continue;
            int p = have < k + 1 ? have : (int)k;
            while (p > 0 && v > best[p - 1]) {
                best[p] = best[p - 1];
                idx[p] = idx[p - 1];
                p--;
            }
            best[p] = v;
            idx[p] = (int32_t)j;
            if (have < k + 1) have++;
        }
        for (int64_t j = 0; j < k; j++) ids[i * k + j] = idx[j];
        alpha[i] = best[k];
    }
}

static void loads_of(const int32_t *ids, int64_t m, int64_t k, int64_t n, int64_t *loads, k3c_load_stats *st) {
    k3c_err err = {0};
    CHECK_OK(k3c_moe_load_stats(ids, NULL, m, k, n, loads, st, &err), &err);
}

/* ---------------------------------------------------------------- Fig. 5 */

static void test_fig5(void) {
    /* m = 8 tokens, n = 4 experts, k = 1, b = 0: argmax loads (4, 3, 1, 0). One exact update (q = 2: b̃_j = 3rd
     * smallest of α_i − s_ij) gives b = (−0.075, −0.025, 0.025, 0.075) and, applied to the same scores, loads
     * (2, 2, 2, 2); the histogram estimator gives the same loads. Every top-1/top-2 margin is ≥ 0.02 before and after
     * the exact update, so float rounding cannot flip a choice. */
    static const float s[8][4] = {{0.95f, 0.40f, 0.70f, 0.85f}, {0.80f, 0.60f, 0.75f, 0.10f},
                                  {0.05f, 0.50f, 0.10f, 0.45f}, {0.80f, 0.45f, 0.55f, 0.20f},
                                  {0.80f, 0.05f, 0.35f, 0.15f}, {0.45f, 0.50f, 0.80f, 0.45f},
                                  {0.80f, 0.85f, 0.35f, 0.55f}, {0.15f, 0.40f, 0.10f, 0.10f}};
    k3c_err err = {0};
    for (int mode = 0; mode <= 1; mode++) {
        float b[4] = {0, 0, 0, 0}, alpha[8];
        int32_t ids[8];
        int64_t loads[4];
        k3c_load_stats st;
        route(&s[0][0], b, 8, 4, 1, ids, alpha);
        loads_of(ids, 8, 1, 4, loads, &st);
        CHECK(loads[0] == 4 && loads[1] == 3 && loads[2] == 1 && loads[3] == 0, "initial loads %lld %lld %lld %lld",
              (long long)loads[0], (long long)loads[1], (long long)loads[2], (long long)loads[3]);
        int64_t got = k3c_qb_update(mode, &s[0][0], alpha, NULL, 8, 4, 1, b, NULL, &err);
        CHECK(got == 8, "mode %d: counted %lld tokens (%s)", mode, (long long)got, err.msg);
        if (mode == K3C_QB_EXACT)
            CHECK(fabs(b[0] + 0.075) < 1e-6 && fabs(b[1] + 0.025) < 1e-6 && fabs(b[2] - 0.025) < 1e-6 &&
                      fabs(b[3] - 0.075) < 1e-6,
                  "exact bias %.6f %.6f %.6f %.6f", b[0], b[1], b[2], b[3]);
        route(&s[0][0], b, 8, 4, 1, ids, alpha);
        loads_of(ids, 8, 1, 4, loads, &st);
        CHECK(loads[0] == 2 && loads[1] == 2 && loads[2] == 2 && loads[3] == 2,
              "mode %d: loads after %lld %lld %lld %lld", mode, (long long)loads[0], (long long)loads[1],
              (long long)loads[2], (long long)loads[3]);
    }
}

/* ---------------------------------------------------------------- skewed router */

enum { M = 4096, N = 64, K = 4 };

/* s_ij = σ(z_ij + o_j), z ~ N(0, 1) per batch, o_j a strong fixed per-expert preference (linear from −3 to +3). */
static void skewed_scores(float *s, int64_t m, uint64_t seed) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < N; j++) {
            double z = k3c_normal_at(seed, (uint64_t)(i * N + j)) + (-3.0 + 6.0 * (double)j / (N - 1));
            s[i * N + j] = (float)(1.0 / (1.0 + exp(-z)));
        }
}
static void skewed_batch(float *s, uint64_t seed) { skewed_scores(s, M, seed); }

static void test_skewed(void) {
    k3c_err err = {0};
    float *s = malloc(sizeof(float) * M * N), *alpha = malloc(sizeof(float) * M), b[N];
    int32_t *ids = malloc(sizeof(int32_t) * M * K);
    int64_t loads[N];
    k3c_load_stats st;
    size_t wsz = k3c_qb_workspace(K3C_QB_EXACT, M, N), wsh = k3c_qb_workspace(K3C_QB_HISTOGRAM, M, N);
    void *ws = malloc(wsz > wsh ? wsz : wsh);
    const double target = (double)M * K / N; /* 256 */
    const int verbose = getenv("K3C_TEST_VERBOSE") != NULL;

    /* Same batch: the bias from update u routes the same scores at update u+1, i.e. Algorithm 1's α→β alternation.
     * A fixed point of the alternation routes exactly q = 256 tokens to every expert; the approach is gradual. Measured
     * (this batch): min..max 0..1929 → 212..361 → 231..320 → 238..296 → 238..279 → 239..277 → 242..274 → 243..269 →
     * 244..266 (5% band 243.2..268.8 reached at update 8), CV 1.87 → 0.140 → 0.086 → 0.059 → … → 0.021. An independent
     * pure-Python float64 implementation of §7.2 on a batch of the same law gives 0..1921 → 198..329 → 211..309 →
     * 224..296 → … → 245..267 (update 7), and other skews (logit spreads 2 … 10) behave alike, so "within 5% in ≤ 3
     * updates" is not what the one-alternation rule does here; the checks below are the measured behaviour with margin:
     * within 20% after 3 updates, within 5% after at most 8, and the CV falling at every update. */
    skewed_batch(s, 1000);
    memset(b, 0, sizeof b);
    route(s, b, M, N, K, ids, alpha);
    loads_of(ids, M, K, N, loads, &st);
    CHECK(st.min == 0 && st.max_over_mean > 5, "router not skewed enough: loads %lld..%lld", (long long)st.min,
          (long long)st.max);
    if (verbose)
        printf("  same batch: update 0: loads %lld..%lld (target %.0f)\n", (long long)st.min, (long long)st.max,
               target);
    int converged_at = -1, cv_falls = 1;
    double cv_prev = st.cv;
    for (int u = 1; u <= 8; u++) {
        CHECK(k3c_qb_update(K3C_QB_EXACT, s, alpha, NULL, M, N, K, b, ws, &err) == M, "update %d: %s", u, err.msg);
        route(s, b, M, N, K, ids, alpha);
        loads_of(ids, M, K, N, loads, &st);
        if (verbose)
            printf("  same batch: update %d: loads %lld..%lld cv %.4f\n", u, (long long)st.min, (long long)st.max,
                   st.cv);
        if (u == 3)
            CHECK(st.max <= 1.20 * target && st.min >= 0.80 * target, "after 3 updates: loads %lld..%lld",
                  (long long)st.min, (long long)st.max);
        if (converged_at < 0 && st.max <= 1.05 * target && st.min >= 0.95 * target) converged_at = u;
        cv_falls &= st.cv < cv_prev;
        cv_prev = st.cv;
    }
    CHECK(converged_at > 0, "loads %lld..%lld not within 5%% of %.0f after 8 exact updates", (long long)st.min,
          (long long)st.max, target);
    CHECK(cv_falls, "load CV did not fall at every update on the same batch");
    if (verbose) printf("  same batch: within 5%% of the target at update %d\n", converged_at);

    /* Fresh batches: the bias computed on batch t routes batch t+1 (the training causality of §7.2 item 3). Even a
     * perfect bias leaves binomial noise on a fresh batch (CV ≈ sqrt(256·15/16)/256 = 0.06), and a one-batch estimate
     * adds about as much again (≈ 0.085). Measured (these seeds): CV 1.87 → 0.148 → 0.095 → 0.104 → 0.106 → 0.060 →
     * 0.085 → 0.072, load/mean within [0.78, 1.45] from batch 3 on (over 40 batches: [0.73, 1.33]). */
    for (int mode = 0; mode <= 1; mode++) {
        memset(b, 0, sizeof b);
        double worst_hi = 0, worst_lo = 1e9, cv_sum = 0;
        for (int step = 0; step < 8; step++) {
            skewed_batch(s, 2000 + (uint64_t)step);
            route(s, b, M, N, K, ids, alpha);
            loads_of(ids, M, K, N, loads, &st);
            if (verbose)
                printf("  %s, fresh batch %d: loads %lld..%lld cv %.3f\n", mode ? "histogram" : "exact", step,
                       (long long)st.min, (long long)st.max, st.cv);
            if (step >= 3) {
                worst_hi = fmax(worst_hi, st.max_over_mean);
                worst_lo = fmin(worst_lo, st.min_over_mean);
                cv_sum += st.cv;
            }
            CHECK(k3c_qb_update(mode, s, alpha, NULL, M, N, K, b, ws, &err) == M, "fresh update: %s", err.msg);
        }
        CHECK_LE(cv_sum / 5, 0.12,
                 mode ? "histogram: mean load CV on fresh batches 3..7" : "exact: mean load CV on fresh batches 3..7");
        CHECK(worst_hi <= 1.6 && worst_lo >= 0.65, "mode %d, fresh batches 3..7: load/mean in [%.3f, %.3f]", mode,
              worst_lo, worst_hi);
    }
    free(s);
    free(alpha);
    free(ids);
    free(ws);
}

/* A 16× larger batch (m = 65,536, q = 4,096 per expert), same batch, same skew: the ±5% band comes sooner in relative
 * terms but still not within 3 updates. Measured (seed 1000): 0..30784 → 3405..5217 → 3672..4948 → 3824..4662 → … inside
 * 3891..4301 at update 6 (milder skews: 4–5 updates). Checks: within 15% after 3 updates, the band reached at 5–7. */
static void test_large_batch(void) {
    const int64_t m = 16 * (int64_t)M;
    const double target = (double)m * K / N;
    k3c_err err = {0};
    float *s = malloc(sizeof(float) * (size_t)(m * N)), *alpha = malloc(sizeof(float) * (size_t)m), b[N];
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(m * K));
    void *ws = malloc(k3c_qb_workspace(K3C_QB_EXACT, m, N));
    int64_t loads[N];
    k3c_load_stats st;
    skewed_scores(s, m, 1000);
    memset(b, 0, sizeof b);
    route(s, b, m, N, K, ids, alpha);
    int converged_at = -1;
    for (int u = 1; u <= 7; u++) {
        CHECK(k3c_qb_update(K3C_QB_EXACT, s, alpha, NULL, m, N, K, b, ws, &err) == m, "update %d: %s", u, err.msg);
        route(s, b, m, N, K, ids, alpha);
        loads_of(ids, m, K, N, loads, &st);
        if (u == 3)
            CHECK(st.max <= 1.15 * target && st.min >= 0.85 * target, "m = %lld, after 3 updates: loads %lld..%lld",
                  (long long)m, (long long)st.min, (long long)st.max);
        if (converged_at < 0 && st.max <= 1.05 * target && st.min >= 0.95 * target) converged_at = u;
    }
    /* the §7.2 rule is deterministic here: a different count means a different rule, not noise */
    CHECK(converged_at >= 5 && converged_at <= 7,
          "m = %lld: within 5%% of %.0f at update %d (measured: 6; last loads "
          "%lld..%lld)",
          (long long)m, target, converged_at, (long long)st.min, (long long)st.max);
    free(s), free(alpha), free(ids), free(ws);
}

/* ---------------------------------------------------------------- histogram vs exact */

static void test_histogram(void) {
    k3c_err err = {0};
    float *s = malloc(sizeof(float) * M * N), *alpha = malloc(sizeof(float) * M), b[N], ex[N], hi[N], ex2[N];
    int32_t *ids = malloc(sizeof(int32_t) * M * K);
    int64_t *counts = malloc(sizeof(int64_t) * N * K3C_QB_BINS), *counts2 = malloc(sizeof(int64_t) * N * K3C_QB_BINS);
    skewed_batch(s, 3000);
    memset(b, 0, sizeof b);
    for (int round = 0; round < 3; round++) { /* b = 0, then two non-trivial biases (a different histogram range) */
        route(s, b, M, N, K, ids, alpha);
        CHECK(k3c_qb_exact(s, alpha, NULL, M, N, K, ex, NULL, &err) == M, "exact: %s", err.msg);
        k3c_qb_hist h;
        CHECK_OK(k3c_qb_hist_begin(&h, b, N, K3C_QB_BINS, counts, &err), &err);
        CHECK_OK(k3c_qb_hist_add(&h, s, alpha, NULL, M, &err), &err);
        CHECK(k3c_qb_hist_readout(&h, K, hi, &err) == M, "readout: %s", err.msg);
        double worst = 0;
        for (int j = 0; j < N; j++) worst = fmax(worst, fabs((double)hi[j] - ex[j]));
        CHECK_LE(worst / h.width, 1.0, "max |histogram - exact| / bin width");
        /* mean-centred biases agree as well */
        k3c_qb_centre(ex, N);
        k3c_qb_centre(hi, N);
        worst = 0;
        for (int j = 0; j < N; j++) worst = fmax(worst, fabs((double)hi[j] - ex[j]));
        CHECK_LE(worst / h.width, 1.0, "max |centred histogram - exact| / bin width");

        /* separable: four micro-batches of 1024 tokens give the same counts and read-out */
        k3c_qb_hist h2;
        CHECK_OK(k3c_qb_hist_begin(&h2, b, N, K3C_QB_BINS, counts2, &err), &err);
        for (int mb = 0; mb < 4; mb++)
            CHECK_OK(k3c_qb_hist_add(&h2, s + (size_t)mb * 1024 * N, alpha + mb * 1024, NULL, 1024, &err), &err);
        CHECK(memcmp(counts, counts2, sizeof(int64_t) * N * K3C_QB_BINS) == 0, "micro-batch counts differ");
        memcpy(b, ex, sizeof b); /* the next round uses the new (centred) bias */
    }

    /* padding: masked tokens are excluded — the same result as the batch without them */
    uint8_t *mask = malloc(M);
    int64_t mc = 0;
    for (int i = 0; i < M; i++) mask[i] = (i % 7) != 3;
    route(s, b, M, N, K, ids, alpha);
    float *sc = malloc(sizeof(float) * M * N), *ac = malloc(sizeof(float) * M);
    for (int i = 0; i < M; i++)
        if (mask[i]) {
            memcpy(sc + mc * N, s + (size_t)i * N, sizeof(float) * N);
            ac[mc++] = alpha[i];
        }
    CHECK(k3c_qb_exact(s, alpha, mask, M, N, K, ex, NULL, &err) == mc, "masked exact count");
    CHECK(k3c_qb_exact(sc, ac, NULL, mc, N, K, ex2, NULL, &err) == mc, "compacted exact count");
    CHECK(memcmp(ex, ex2, sizeof ex) == 0, "mask: exact bias differs from the compacted batch");
    k3c_qb_hist h;
    CHECK_OK(k3c_qb_hist_begin(&h, b, N, K3C_QB_BINS, counts, &err), &err);
    CHECK_OK(k3c_qb_hist_add(&h, s, alpha, mask, M, &err), &err);
    CHECK_OK(k3c_qb_hist_begin(&h, b, N, K3C_QB_BINS, counts2, &err), &err);
    CHECK_OK(k3c_qb_hist_add(&h, sc, ac, NULL, mc, &err), &err);
    CHECK(memcmp(counts, counts2, sizeof(int64_t) * N * K3C_QB_BINS) == 0, "mask: histogram counts differ");
    /* all padding: the bias is left alone */
    memset(mask, 0, M);
    float keep[N];
    memcpy(keep, b, sizeof b);
    CHECK(k3c_qb_update(K3C_QB_HISTOGRAM, s, alpha, mask, M, N, K, b, NULL, &err) == 0 &&
              memcmp(keep, b, sizeof b) == 0,
          "all-padding step changed the bias");
    alpha[5] = NAN;
    CHECK(k3c_qb_exact(s, alpha, NULL, M, N, K, ex, NULL, &err) == K3C_ENUMERIC, "NaN cutoff accepted");
    CHECK(k3c_qb_exact(s, alpha, NULL, M, N, N, ex, NULL, &err) == K3C_EINVAL, "k = n accepted");
    free(s);
    free(alpha);
    free(ids);
    free(counts);
    free(counts2);
    free(mask);
    free(sc);
    free(ac);
}

static void test_histogram_hand(void) {
    /* n = 2, bins = 4, b = (0.5, −0.5): range [−1.5, 1.5], width 0.75, bin edges −1.5, −0.75, 0, 0.75, 1.5.
     * 4 tokens, k = 1 → q = 2, ⌈q⌉ = 2. α = 1 for all tokens; r = α − s.
     * expert 0: s = (0.9, 0.8, 0.3, 0.2) → r = (0.1, 0.2, 0.7, 0.8): bin 2 holds 3 (0.1, 0.2, 0.7), bin 3 holds 1.
     *   cum reaches 2 in bin 2 with c = 0, h = 3 → b̃ = 0 + (2/3)·0.75 = 0.5.
     * expert 1: s = (0.95, 0.5, 0.4, 0.05) → r = (0.05, 0.5, 0.6, 0.95): bin 2 holds 3, bin 3 holds 1 → also 0.5.
     * Exact: 3rd smallest r → 0.7 and 0.6. */
    k3c_err err = {0};
    const float s[8] = {0.9f, 0.95f, 0.8f, 0.5f, 0.3f, 0.4f, 0.2f, 0.05f}, alpha[4] = {1, 1, 1, 1};
    const float b[2] = {0.5f, -0.5f};
    int64_t counts[8];
    float out[2];
    k3c_qb_hist h;
    CHECK_OK(k3c_qb_hist_begin(&h, b, 2, 4, counts, &err), &err);
    CHECK(fabs(h.lo + 1.5) < 1e-12 && fabs(h.width - 0.75) < 1e-12, "range lo %g width %g", h.lo, h.width);
    CHECK_OK(k3c_qb_hist_add(&h, s, alpha, NULL, 4, &err), &err);
    CHECK(counts[2] == 3 && counts[3] == 1 && counts[6] == 3 && counts[7] == 1, "counts %lld %lld / %lld %lld",
          (long long)counts[2], (long long)counts[3], (long long)counts[6], (long long)counts[7]);
    CHECK(k3c_qb_hist_readout(&h, 1, out, &err) == 4, "readout count");
    CHECK(fabs(out[0] - 0.5) < 1e-6 && fabs(out[1] - 0.5) < 1e-6, "readout %.6f %.6f, want 0.5 0.5", out[0], out[1]);
    CHECK(k3c_qb_exact(s, alpha, NULL, 4, 2, 1, out, NULL, &err) == 4, "exact count");
    CHECK(fabs(out[0] - 0.7) < 1e-6 && fabs(out[1] - 0.6) < 1e-6, "exact %.6f %.6f, want 0.7 0.6", out[0], out[1]);
    /* non-integer q: 5 tokens, n = 2, k = 1 → q = 2.5, the exact rule uses ⌊q⌋ = 2 (3rd smallest) */
    const float s5[10] = {0.9f, 0.1f, 0.8f, 0.2f, 0.7f, 0.3f, 0.6f, 0.4f, 0.5f, 0.5f}, a5[5] = {1, 1, 1, 1, 1};
    CHECK(k3c_qb_exact(s5, a5, NULL, 5, 2, 1, out, NULL, &err) == 5, "exact count (5)");
    CHECK(fabs(out[0] - 0.3) < 1e-6 && fabs(out[1] - 0.7) < 1e-6, "exact q=2.5: %.6f %.6f, want 0.3 0.7", out[0],
          out[1]);
}

/* ---------------------------------------------------------------- telemetry */

static void test_telemetry(void) {
    /* 5 tokens, k = 2, n = 3: (0,1) (0,2) (0,1) (2,−1 dropped) and a masked token (1,2).
     * loads (3, 2, 2), routes 7, mean 7/3, max/mean 9/7, min/mean 6/7,
     * cv = sqrt(((2/3)² + 2·(1/3)²)/3)/(7/3) = 0.2020305. */
    k3c_err err = {0};
    const int32_t ids[10] = {0, 1, 0, 2, 0, 1, 2, -1, 1, 2};
    const uint8_t mask[5] = {1, 1, 1, 1, 0};
    int64_t loads[3];
    k3c_load_stats st;
    CHECK_OK(k3c_moe_load_stats(ids, mask, 5, 2, 3, loads, &st, &err), &err);
    CHECK(loads[0] == 3 && loads[1] == 2 && loads[2] == 2 && st.routes == 7 && st.max == 3 && st.min == 2,
          "loads %lld %lld %lld", (long long)loads[0], (long long)loads[1], (long long)loads[2]);
    CHECK(fabs(st.mean - 7.0 / 3) < 1e-12 && fabs(st.max_over_mean - 9.0 / 7) < 1e-12 &&
              fabs(st.min_over_mean - 6.0 / 7) < 1e-12,
          "mean %g max/mean %g min/mean %g", st.mean, st.max_over_mean, st.min_over_mean);
    CHECK(fabs(st.cv - 0.2020305089) < 1e-9, "cv %.10f", st.cv);
    const int32_t bad[2] = {0, 3};
    CHECK(k3c_moe_load_stats(bad, NULL, 1, 2, 3, loads, &st, &err) == K3C_EINVAL, "id 3 of 3 experts accepted");
}

/* The CPU backend table's quantile_balance entry takes the router logits: it equals k3c_qb_update on the scores
 * s = (float)sigmoid(double logit), in both modes, for a skewed router. */
static void test_backend_entry(void) {
    enum { M = 600, N = 12, K = 3 };
    static float logit[M * N], s[M * N], alpha[M];
    float b[N], bt[N], b0[N];
    const k3c_backend_f32 *be = k3c_backend_cpu_f32();
    for (int i = 0; i < M * N; i++) {
        logit[i] = (float)(2 * k3c_normal_at(91, (uint64_t)i) + (i % N < 3 ? 1.5 : 0)); /* three hot experts */
        s[i] = (float)k3c_sigmoid_d((double)logit[i]);
    }
    for (int j = 0; j < N; j++) b0[j] = (float)(0.01 * j);
    int32_t *ids = malloc(sizeof(int32_t) * M * K);
    route(s, b0, M, N, K, ids, alpha);
    free(ids);
    for (int mode = K3C_QB_EXACT; mode <= K3C_QB_HISTOGRAM; mode++) {
        k3c_err err = {0};
        memcpy(b, b0, sizeof b);
        memcpy(bt, b0, sizeof bt);
        void *ws = malloc(be->quantile_balance_workspace(mode, M, N)), *ws_ref = malloc(k3c_qb_workspace(mode, M, N));
        CHECK(k3c_qb_update(mode, s, alpha, NULL, M, N, K, b, ws_ref, &err) == M, "%s", err.msg);
        CHECK_OK(be->quantile_balance(be->ctx, mode, logit, alpha, M, N, K, bt, ws, &err), &err);
        CHECK(memcmp(b, bt, sizeof b) == 0 && memcmp(b, b0, sizeof b) != 0,
              "mode %d: the table's quantile_balance differs from k3c_qb_update (or did nothing)", mode);
        logit[5] = NAN;
        CHECK(be->quantile_balance(be->ctx, mode, logit, alpha, M, N, K, bt, ws, &err) == K3C_ENUMERIC,
              "mode %d: NaN logit accepted", mode);
        logit[5] = 0.5f;
        free(ws);
        free(ws_ref);
    }
}

/* ---------------------------------------------------------------- the auxiliary-loss-free bias step */

static void test_bias_update_hand(void) {
    /* loads (5, 1, 3, 3): mean 3, so expert 0 is over (−γ), expert 1 under (+γ), 2 and 3 exactly at the mean (0) */
    const int64_t loads[4] = {5, 1, 3, 3};
    float b[4] = {0, 0, 0.5f, -0.5f};
    k3c_bias_update(loads, 4, 0.01, b);
    CHECK(b[0] == (float)-0.01 && b[1] == (float)0.01 && b[2] == 0.5f && b[3] == -0.5f, "bias (%g, %g, %g, %g)", b[0],
          b[1], b[2], b[3]);
    /* a mean that is not an integer: loads (2, 1, 0, 0), mean 3/4, signs (−, −, +, +) */
    const int64_t l2[4] = {2, 1, 0, 0};
    float c[4] = {1, 1, 1, 1};
    k3c_bias_update(l2, 4, 0.25, c);
    CHECK(c[0] == 0.75f && c[1] == 0.75f && c[2] == 1.25f && c[3] == 1.25f, "bias (%g, %g, %g, %g)", c[0], c[1], c[2],
          c[3]);

    /* From logits: three tokens, four experts, top-1. Tokens 0, 1 pick expert 0, token 2 picks expert 2: loads
     * (2, 0, 1, 0), mean 3/4: b = (−γ, +γ, −γ, +γ). */
    const float lg[12] = {3, 0, 0, 0, 2, 1, 0, -1, 0, 0, 4, 0};
    float bb[4] = {0, 0, 0, 0};
    k3c_err err = {0};
    void *ws = malloc(k3c_bias_balance_workspace(3, 4, 1));
    CHECK_OK(k3c_bias_balance(lg, 3, 4, 1, 0.001, bb, ws, &err), &err);
    CHECK(bb[0] == (float)-0.001 && bb[1] == (float)0.001 && bb[2] == (float)-0.001 && bb[3] == (float)0.001,
          "bias from logits (%g, %g, %g, %g)", bb[0], bb[1], bb[2], bb[3]);
    /* the bias routes: +1 on expert 3 sends every token there, loads (0, 0, 0, 3): (+γ, +γ, +γ, −γ) */
    float bh[4] = {0, 0, 0, 1};
    CHECK_OK(k3c_bias_balance(lg, 3, 4, 1, 0.001, bh, ws, &err), &err);
    CHECK(bh[0] == (float)0.001 && bh[1] == (float)0.001 && bh[2] == (float)0.001 && bh[3] == (float)(1 - 0.001),
          "bias that routes (%g, %g, %g, %.9g)", bh[0], bh[1], bh[2], bh[3]);
    /* errors leave b as it was */
    float keep[4] = {0, 0, 0, 0};
    CHECK(k3c_bias_balance(lg, 3, 4, 1, 0, keep, ws, &err) == K3C_EINVAL && strstr(err.msg, "gamma"), "gamma 0: %s",
          err.msg);
    CHECK(k3c_bias_balance(lg, 3, 4, 4, 0.001, keep, ws, &err) == K3C_EINVAL, "k = n rejected");
    float bad[12];
    memcpy(bad, lg, sizeof bad);
    bad[7] = NAN;
    CHECK(k3c_bias_balance(bad, 3, 4, 1, 0.001, keep, ws, &err) == K3C_ENUMERIC, "NaN logit: %s", err.msg);
    CHECK(keep[0] == 0 && keep[1] == 0 && keep[2] == 0 && keep[3] == 0, "rejected input changed the bias");
    free(ws);
}

/* On the skewed router of test_skewed the sign steps bring the load ratio down, and the table entry is the op. */
static void test_bias_converges(void) {
    static float s[M * N], logit[M * N];
    skewed_batch(s, 5);
    for (int i = 0; i < M * N; i++) logit[i] = logf(s[i] / (1 - s[i])); /* the scores' logits */
    const k3c_backend_f32 *be = k3c_backend_cpu_f32();
    void *ws = malloc(be->bias_balance_workspace(M, N, K));
    float b[N] = {0}, bt[N] = {0}, alpha[M];
    int32_t *ids = malloc(sizeof(int32_t) * M * K);
    int64_t loads[N];
    k3c_load_stats st0, st;
    route(s, b, M, N, K, ids, alpha);
    loads_of(ids, M, K, N, loads, &st0);
    k3c_err err = {0};
    int same = 1;
    for (int it = 0; it < 300; it++) {
        CHECK_OK(k3c_bias_balance(logit, M, N, K, 0.005, b, ws, &err), &err);
        CHECK_OK(be->bias_balance(be->ctx, logit, M, N, K, 0.005, bt, ws, &err), &err);
        same &= memcmp(b, bt, sizeof b) == 0;
    }
    route(s, b, M, N, K, ids, alpha);
    loads_of(ids, M, K, N, loads, &st);
    CHECK(same, "the table's bias_balance differs from k3c_bias_balance");
    CHECK(st0.max_over_mean > 4 && st.max_over_mean < 1.5, "bias step: max/mean %.3f -> %.3f", st0.max_over_mean,
          st.max_over_mean);
    free(ids);
    free(ws);
}

int main(void) {
    test_fig5();
    test_skewed();
    test_large_batch();
    test_histogram();
    test_histogram_hand();
    test_telemetry();
    test_backend_entry();
    test_bias_update_hand();
    test_bias_converges();
    return test_summary();
}
