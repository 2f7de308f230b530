/* test_post_rl.c — RL math (src/post/rl_loss.c): advantages, zero-variance groups, overlong penalty and the clipped
 * losses against hand-computed values, DAPO dynamic sampling's group selection, pass@k and TIS by hand, and the loss gradient w.r.t. the logits by float64 finite differences. */
#include "test.h"

#define NEAR(a, b) (fabs((a) - (b)) <= 1e-12 * fmax(1.0, fabs(b)))

static void test_advantages(void) {
    double r[] = {1, 0, 1, 0, 1, 1, 1, 1, 0.7}, adv[9];
    uint8_t keep[3];
    int zero = k3c_rl_advantages(r, 2, 4, 1, adv, keep);
    double a = 0.5 / (sqrt(1.0 / 3.0) + 1e-6); /* unbiased std of [1,0,1,0] = sqrt(1/3) = 0.57735 */
    CHECK(zero == 1 && keep[0] == 1 && keep[1] == 0, "zero-variance groups: %d", zero);
    CHECK(NEAR(adv[0], a) && NEAR(adv[1], -a) && NEAR(adv[2], a) && NEAR(adv[3], -a) && fabs(a - 0.866024) < 1e-5,
          "GRPO [1,0,1,0] -> %.9f (want ±%.9f)", adv[0], a);
    CHECK(adv[4] == 0 && adv[7] == 0, "flat group advantage 0");
    k3c_rl_advantages(r, 2, 4, 0, adv, NULL);
    CHECK(adv[0] == 0.5 && adv[1] == -0.5, "Dr. GRPO: r - mean = %g", adv[0]);
    k3c_rl_advantages(r + 8, 1, 1, 1, adv, keep);
    CHECK(NEAR(adv[0], 0.7 / (1 + 1e-6)) && keep[0] == 1, "group of one: mean 0, std 1: %.12f", adv[0]);
    CHECK(k3c_rl_overlong_penalty(80, 100, 20, 1) == 0 && k3c_rl_overlong_penalty(90, 100, 20, 1) == -0.5 &&
              k3c_rl_overlong_penalty(100, 100, 20, 1) == -1 && k3c_rl_overlong_penalty(130, 100, 20, 1) == -1 &&
              k3c_rl_overlong_penalty(99, 100, 0, 1) == 0,
          "overlong penalty");
}

static void test_hand_losses(void) {
    /* Sequence 0: tokens ρ = 1.5, 0.5, (masked); sequence 1: ρ = 1.1. Clip-higher ε = (0.2, 0.28). */
    double logp[] = {log(1.5), log(0.5), -3, log(1.1)}, old[] = {0, 0, -1, 0};
    uint8_t mask[] = {1, 1, 0, 1};
    int64_t off[] = {0, 3, 4};
    double adv[] = {1, -1}, g[4];
    k3c_rl_tokens t = {.B = 2, .off = off, .logp = logp, .logp_old = old, .mask = mask, .adv = adv};
    k3c_rl_loss_opts o = {.eps_low = 0.2, .eps_high = 0.28, .agg = K3C_RL_TOKEN_MEAN};
    k3c_rl_loss_stats s;
    k3c_err err = {0};
    CHECK_OK(k3c_rl_loss(&t, &o, g, &s, &err), &err);
    /* seq 0, A = 1: ρ=1.5 clipped to 1.28 (l = −1.28, no grad); ρ=0.5 below 0.8 but A > 0: unclipped (l = −0.5,
     * ∂l/∂logp = −0.5). seq 1, A = −1: ρ = 1.1 inside: l = 1.1, ∂ = 1.1. Token mean over 3. */
    CHECK(NEAR(s.loss, (-1.28 - 0.5 + 1.1) / 3) && s.n_tokens == 3, "DAPO loss %.15f", s.loss);
    CHECK(g[0] == 0 && NEAR(g[1], -0.5 / 3) && g[2] == 0 && NEAR(g[3], 1.1 / 3), "DAPO grads %g %g %g %g", g[0], g[1],
          g[2], g[3]);
    CHECK(NEAR(s.clip_high, 1.0 / 3) && s.clip_low == 0 && NEAR(s.ratio_mean, (1.5 + 0.5 + 1.1) / 3), "clip stats");
    /* A = −1 on sequence 0: ρ = 1.5 unclipped (l = 1.5, ∂ = 1.5); ρ = 0.5 clipped low (l = 0.8, no grad). */
    adv[0] = -1;
    CHECK_OK(k3c_rl_loss(&t, &o, g, &s, &err), &err);
    CHECK(NEAR(s.loss, (1.5 + 0.8 + 1.1) / 3) && NEAR(g[0], 1.5 / 3) && g[1] == 0 && NEAR(s.clip_low, 1.0 / 3),
          "negative advantage: %.15f", s.loss);
    /* GRPO sequence mean: seq 0 has 2 tokens, seq 1 one: weights 1/(2·2) and 1/(2·1). */
    o.agg = K3C_RL_SEQ_MEAN;
    CHECK_OK(k3c_rl_loss(&t, &o, g, &s, &err), &err);
    CHECK(NEAR(s.loss, (1.5 + 0.8) / 4 + 1.1 / 2) && NEAR(g[0], 1.5 / 4) && NEAR(g[3], 1.1 / 2), "GRPO: %.15f", s.loss);
    /* Dr. GRPO constant normaliser B · L_max = 2 · 8. */
    o.agg = K3C_RL_CONST_NORM;
    o.max_len = 8;
    CHECK_OK(k3c_rl_loss(&t, &o, g, &s, &err), &err);
    CHECK(NEAR(s.loss, (1.5 + 0.8 + 1.1) / 16) && NEAR(g[3], 1.1 / 16), "Dr. GRPO: %.15f", s.loss);
    o.max_len = 0;
    CHECK(k3c_rl_loss(&t, &o, g, &s, &err) == K3C_EINVAL, "Dr. GRPO without max_len");
    /* k3 KL: ref − logp = 0.2 on every token; D = e^0.2 − 1.2, ∂D/∂logp = 1 − e^0.2. */
    double ref[4];
    for (int k = 0; k < 4; k++) ref[k] = logp[k] + 0.2;
    t.logp_ref = ref;
    o = (k3c_rl_loss_opts){.eps_low = 0.2, .eps_high = 0.2, .beta = 0.1, .agg = K3C_RL_TOKEN_MEAN};
    adv[0] = adv[1] = 0;
    CHECK_OK(k3c_rl_loss(&t, &o, g, &s, &err), &err);
    double D = exp(0.2) - 1.2;
    CHECK(NEAR(s.kl, D) && NEAR(s.loss, 0.1 * D) && NEAR(g[0], 0.1 * (1 - exp(0.2)) / 3), "KL: %.15f %.15f", s.kl,
          s.loss);
    t.logp_ref = NULL;
    CHECK(k3c_rl_loss(&t, &o, g, &s, &err) == K3C_EINVAL, "beta without reference");
}

static void test_dynamic_sampling(void) {
    /* Draw 1, G = 2: [1,1] flat, [0,1] kept, [0,0] flat, [1,0] kept; the step wants 3 groups with variance. */
    double d1[] = {1, 1, 0, 1, 0, 0, 1, 0}, d2[] = {0, 0, 1, 0, 0, 1};
    int sel[3] = {-1, -1, -1}, n = 0;
    int flat = k3c_rl_select_groups(d1, 4, 2, 3, sel, &n);
    CHECK(flat == 2 && n == 2 && sel[0] == 1 && sel[1] == 3, "draw 1: flat %d, kept %d (%d %d)", flat, n, sel[0],
          sel[1]);
    /* Draw 2: [0,0] flat, [1,0] fills the batch, [0,1] has variance but the batch is full; still counted as drawn. */
    flat = k3c_rl_select_groups(d2, 3, 2, 3, sel, &n);
    CHECK(flat == 1 && n == 3 && sel[2] == 1, "draw 2: flat %d, kept %d (third %d)", flat, n, sel[2]);
    /* A nearly flat group (1e-13 apart) is flat, as k3c_rl_advantages drops it; 0.7 vs 0.3 is not. */
    double d3[] = {0.5, 0.5 + 1e-13, 0.7, 0.3};
    n = 0;
    flat = k3c_rl_select_groups(d3, 2, 2, 8, sel, &n);
    CHECK(flat == 1 && n == 1 && sel[0] == 1, "near-flat: flat %d kept %d", flat, n);
}

static void test_pass_at_k(void) {
    /* 1 − C(n−c, k)/C(n, k): n 4, c 1, k 2: 1 − 3/6; n 10, c 3, k 5: 1 − 21/252; pass@1 = c / n. */
    CHECK(NEAR(k3c_rl_pass_at_k(4, 1, 2), 0.5) && NEAR(k3c_rl_pass_at_k(10, 3, 5), 1 - 21.0 / 252) &&
              NEAR(k3c_rl_pass_at_k(5, 2, 1), 0.4) && k3c_rl_pass_at_k(8, 0, 8) == 0 &&
              k3c_rl_pass_at_k(8, 8, 1) == 1 && k3c_rl_pass_at_k(8, 2, 8) == 1,
          "pass@k %.15f %.15f %.15f", k3c_rl_pass_at_k(4, 1, 2), k3c_rl_pass_at_k(10, 3, 5), k3c_rl_pass_at_k(5, 2, 1));
}

static void test_tis(void) {
    /* The hand case above (ρ = 1.5, 0.5 | 1.1; A = 1, −1) with rollout log-probs making π_old / π_rollout = 2, 0.5,
     * 1.2 and the cap 1.5: weights 1.5 (capped), 0.5, 1.2. */
    double logp[] = {log(1.5), log(0.5), -3, log(1.1)}, old[] = {0, 0, -1, 0}, roll[] = {-log(2), log(2), 0, -log(1.2)};
    uint8_t mask[] = {1, 1, 0, 1};
    int64_t off[] = {0, 3, 4};
    double adv[] = {1, -1}, g[4];
    k3c_rl_tokens t = {
        .B = 2, .off = off, .logp = logp, .logp_old = old, .mask = mask, .adv = adv, .logp_rollout = roll};
    k3c_rl_loss_opts o = {.eps_low = 0.2, .eps_high = 0.28, .agg = K3C_RL_TOKEN_MEAN, .tis_cap = 1.5};
    k3c_rl_loss_stats s;
    k3c_err err = {0};
    CHECK_OK(k3c_rl_loss(&t, &o, g, &s, &err), &err);
    /* token 0: clipped (l = −1.5·1.28, no grad); token 1: l = −0.5·0.5, ∂ = −0.25; token 3: l = 1.2·1.1, ∂ = 1.32 */
    CHECK(NEAR(s.loss, (-1.5 * 1.28 - 0.25 + 1.32) / 3), "TIS loss %.15f", s.loss);
    CHECK(g[0] == 0 && NEAR(g[1], -0.25 / 3) && g[2] == 0 && NEAR(g[3], 1.32 / 3), "TIS grads %g %g %g", g[0], g[1],
          g[3]);
    CHECK(NEAR(s.tis_mean, (1.5 + 0.5 + 1.2) / 3) && NEAR(s.tis_capped, 1.0 / 3), "TIS stats %g %g", s.tis_mean,
          s.tis_capped);
    /* tis_cap 0: weights 1, the plain loss of test_hand_losses */
    o.tis_cap = 0;
    CHECK_OK(k3c_rl_loss(&t, &o, g, &s, &err), &err);
    CHECK(NEAR(s.loss, (-1.28 - 0.5 + 1.1) / 3) && s.tis_mean == 1 && s.tis_capped == 0, "TIS off %.15f", s.loss);
    o.tis_cap = 2;
    t.logp_rollout = NULL;
    CHECK(k3c_rl_loss(&t, &o, g, &s, &err) == K3C_EINVAL, "tis_cap without rollout log-probs");
    o.tis_cap = -1;
    CHECK(k3c_rl_loss(&t, &o, g, &s, &err) == K3C_EINVAL, "negative tis_cap");
}

/* ---------------------------------------------------------------- gradient by finite differences */

enum { T = 14, V = 7, B = 3 };
typedef struct {
    double z[T * V];
    int32_t y[T];
    double old[T], ref[T], roll[T], adv[B];
    uint8_t mask[T];
    int64_t off[B + 1];
    k3c_rl_loss_opts o;
} fd_case;

static void log_softmax_at(const double *z, int32_t y, double *lp, double *p) {
    double m = z[0], s = 0;
    for (int v = 1; v < V; v++) m = fmax(m, z[v]);
    for (int v = 0; v < V; v++) s += exp(z[v] - m);
    *lp = z[y] - m - log(s);
    for (int v = 0; p && v < V; v++) p[v] = exp(z[v] - m) / s;
}

static double fd_loss(void *ctx) {
    fd_case *c = ctx;
    double lp[T];
    for (int t = 0; t < T; t++) log_softmax_at(c->z + t * V, c->y[t], &lp[t], NULL);
    k3c_rl_tokens tk = {B, c->off, lp, c->old, c->o.beta ? c->ref : NULL, c->mask, c->adv, c->roll};
    k3c_rl_loss_stats s;
    k3c_rl_loss(&tk, &c->o, NULL, &s, NULL);
    return s.loss;
}

static void test_fd(void) {
    k3c_rng rng = {.seed = 42};
    fd_case c = {.off = {0, 5, 9, T}};
    for (int i = 0; i < T * V; i++) c.z[i] = k3c_rng_normal(&rng);
    double lp[T];
    for (int t = 0; t < T; t++) {
        c.y[t] = (int32_t)(k3c_rng_u64(&rng) % V);
        c.mask[t] = t % 5 != 0;
        log_softmax_at(c.z + t * V, c.y[t], &lp[t], NULL);
        /* Ratios spread over both clip regions, at least 1e-3 from either boundary (the loss has kinks there). */
        double d;
        do d = 0.6 * (k3c_rng_uniform(&rng) - 0.5);
        while (fabs(exp(d) - 0.8) < 1e-3 || fabs(exp(d) - 1.28) < 1e-3 || fabs(exp(d) - 1.2) < 1e-3);
        c.old[t] = lp[t] - d;
        c.ref[t] = lp[t] + 0.3 * (k3c_rng_uniform(&rng) - 0.5);
        c.roll[t] = c.old[t] + 0.4 * (k3c_rng_uniform(&rng) - 0.5); /* TIS weights 0.82 to 1.22, cap 1.1 */
    }
    c.adv[0] = 0.9, c.adv[1] = -1.3, c.adv[2] = 0.4;
    const k3c_rl_loss_opts opts[] = {{0.2, 0.28, 0, K3C_RL_TOKEN_MEAN, 0, 0},
                                     {0.2, 0.2, 0.05, K3C_RL_SEQ_MEAN, 0, 0},
                                     {0.2, 0.28, 0.1, K3C_RL_CONST_NORM, 8, 0},
                                     {0.2, 0.28, 0.05, K3C_RL_TOKEN_MEAN, 0, 1.1}};
    for (int v = 0; v < 4; v++) {
        c.o = opts[v];
        double dlogp[T], g[T * V], p[V];
        k3c_rl_tokens tk = {B, c.off, lp, c.old, c.o.beta ? c.ref : NULL, c.mask, c.adv, c.roll};
        k3c_rl_loss_stats s;
        k3c_err err = {0};
        CHECK_OK(k3c_rl_loss(&tk, &c.o, dlogp, &s, &err), &err);
        for (int t = 0; t < T; t++) {
            double l;
            log_softmax_at(c.z + t * V, c.y[t], &l, p);
            for (int k = 0; k < V; k++) g[t * V + k] = dlogp[t] * ((k == c.y[t]) - p[k]);
        }
        double e = test_fd_rel_err(fd_loss, &c, c.z, T * V, g);
        char what[800];
        snprintf(what, sizeof what, "RL loss dL/dlogits variant %d (clip fractions %.2f/%.2f)", v, s.clip_low,
                 s.clip_high);
        CHECK_LE(e, 1e-7, what);
        CHECK(s.clip_low + s.clip_high > 0, "variant %d: no token clipped, the test would not see the kinks", v);
    }
}

static void test_logp_entropy(void) {
    float z[3] = {1, 2, 3};
    double lp, h;
    k3c_logp_entropy(z, 3, 1, &lp, &h);
    double s = exp(1) + exp(2) + exp(3), p[3] = {exp(1) / s, exp(2) / s, exp(3) / s};
    CHECK(NEAR(lp, 2 - log(s)) && NEAR(h, -(p[0] * log(p[0]) + p[1] * log(p[1]) + p[2] * log(p[2]))),
          "logp %.15f entropy %.15f", lp, h);
}

int main(void) {
    test_advantages();
    test_hand_losses();
    test_dynamic_sampling();
    test_pass_at_k();
    test_tis();
    test_fd();
    test_logp_entropy();
    return test_summary();
}
