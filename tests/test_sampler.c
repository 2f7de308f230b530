/* test_sampler.c — k3c_sample_seq against hand-computed distributions: temperature, top-k, top-p, min-p (draw
 * frequencies over many counter positions), greedy with repetition (HF) / presence / frequency (OpenAI) penalties,
 * logprobs of the chosen and top tokens, and (seed, position) determinism. */
#include "test.h"

#define DRAWS 40000

/* Frequencies of each id over DRAWS positions; checks them against want[] within 4.5 standard deviations. */
static void check_freq(const char *what, const k3c_sampler *s, const float *logits, int V, const double *want) {
    int count[8] = {0};
    void *ws = malloc(k3c_sample_workspace(V));
    for (int i = 0; i < DRAWS; i++) count[k3c_sample_seq(s, logits, V, (uint64_t)i, NULL, NULL, ws)]++;
    free(ws);
    for (int v = 0; v < V; v++) {
        double f = (double)count[v] / DRAWS, sd = sqrt(want[v] * (1 - want[v]) / DRAWS);
        if (want[v] == 0)
            CHECK(count[v] == 0, "%s: id %d drawn %d times, must be cut", what, v, count[v]);
        else
            CHECK(fabs(f - want[v]) <= 4.5 * sd, "%s: id %d frequency %.4f, expected %.4f", what, v, f, want[v]);
    }
}

/* p ∝ exp(logit / T) over the kept ids. */
static void softmax_keep(const float *x, int V, double T, const int *keep, double *p) {
    double z = 0;
    for (int v = 0; v < V; v++) z += p[v] = keep[v] ? exp(x[v] / T) : 0;
    for (int v = 0; v < V; v++) p[v] /= z;
}

static void distributions(void) {
    const float x[4] = {2, 1, 0, -1}; /* probabilities at T = 1: .6439 .2369 .0871 .0321 */
    double p[4];
    const int all[4] = {1, 1, 1, 1}, two[4] = {1, 1, 0, 0}, three[4] = {1, 1, 1, 0};
    k3c_sampler s = {.temperature = 1, .top_p = 1, .seed = 7};
    softmax_keep(x, 4, 1, all, p);
    check_freq("temperature 1", &s, x, 4, p);
    s.temperature = 2;
    softmax_keep(x, 4, 2, all, p);
    check_freq("temperature 2", &s, x, 4, p);
    s.temperature = 1;
    s.top_k = 2;
    softmax_keep(x, 4, 1, two, p);
    check_freq("top-k 2", &s, x, 4, p);
    s.top_k = 0;
    s.top_p = 0.7; /* .6439 < .7 ≤ .6439 + .2369: the two most likely */
    check_freq("top-p 0.7", &s, x, 4, p);
    s.top_p = 0.9; /* .8808 < .9: three */
    softmax_keep(x, 4, 1, three, p);
    check_freq("top-p 0.9", &s, x, 4, p);
    s.top_p = 1;
    s.min_p = 0.3; /* keep p ≥ .3 · .6439 = .193: two */
    softmax_keep(x, 4, 1, two, p);
    check_freq("min-p 0.3", &s, x, 4, p);
    s.min_p = 0.1; /* keep p ≥ .0644: three */
    softmax_keep(x, 4, 1, three, p);
    check_freq("min-p 0.1", &s, x, 4, p);
    s.min_p = 0;
    s.top_k = 3;
    s.top_p = 0.75; /* within the top 3 (mass .9679): .6439/.9679 = .665 < .75: two */
    softmax_keep(x, 4, 1, two, p);
    check_freq("top-k 3 then top-p 0.75", &s, x, 4, p);
}

static int32_t greedy(const k3c_sampler *s, const float *x, int V, const k3c_history *h) {
    void *ws = malloc(k3c_sample_workspace(V));
    int32_t id = k3c_sample_seq(s, x, V, 0, h, NULL, ws);
    free(ws);
    return id;
}

static void penalties(void) {
    k3c_sampler s = {.top_p = 1};
    const int32_t zero[3] = {0, 0, 0}, one[1] = {1};
    const float pos[2] = {2.0f, 1.9f}, neg[2] = {-1.0f, -0.9f}, near[2] = {1.0f, 0.9f};
    k3c_history in_prompt = {zero, 1, NULL, 0}, in_output = {NULL, 0, zero, 1}, thrice = {NULL, 0, zero, 3};
    k3c_history one_prompt = {one, 1, NULL, 0};
    CHECK(greedy(&s, pos, 2, &in_prompt) == 0, "no penalty: the larger logit");
    s.repetition_penalty = 1.2; /* 2 / 1.2 = 1.667 < 1.9 */
    CHECK(greedy(&s, pos, 2, &in_prompt) == 1, "repetition over the prompt divides a positive logit");
    CHECK(greedy(&s, neg, 2, &one_prompt) == 0, "repetition multiplies a negative logit (-0.9 · 1.2 < -1)");
    s.repetition_penalty = 0;
    s.presence_penalty = 0.2; /* 1 − 0.2 < 0.9, output ids only */
    CHECK(greedy(&s, near, 2, &in_output) == 1, "presence over the output");
    CHECK(greedy(&s, near, 2, &in_prompt) == 0, "presence ignores the prompt (OpenAI)");
    CHECK(greedy(&s, near, 2, &thrice) == 1, "presence counts once");
    s.presence_penalty = 0;
    s.frequency_penalty = 0.05; /* 1 − 3 · 0.05 = 0.85 < 0.9 */
    CHECK(greedy(&s, near, 2, &thrice) == 1, "frequency scales with the count");
    s.frequency_penalty = 0.03; /* 1 − 0.09 = 0.91 > 0.9 */
    CHECK(greedy(&s, near, 2, &thrice) == 0, "a small frequency penalty does not flip it");
    s.frequency_penalty = 0.05;
    CHECK(greedy(&s, near, 2, &in_output) == 0, "frequency once: 0.95 > 0.9");
}

static void logprobs_and_seed(void) {
    const float x[4] = {2, 1, 0, -1};
    const double lse = log(exp(2.0) + exp(1.0) + 1 + exp(-1.0));
    k3c_sampler s = {.top_p = 1, .logprobs = 3, .repetition_penalty = 1.5};
    k3c_sampled t;
    void *ws = malloc(k3c_sample_workspace(4));
    const int32_t hist[1] = {0};
    k3c_history h = {hist, 1, NULL, 0};
    int32_t id = k3c_sample_seq(&s, x, 4, 0, &h, &t, ws); /* 2/1.5 = 1.33 > 1: still id 0 */
    CHECK(id == 0 && t.id == 0 && t.n_top == 3, "greedy id %d, %d alternatives", id, t.n_top);
    CHECK(fabs(t.logprob - (2 - lse)) < 1e-6, "chosen logprob %.7f, expected %.7f (the raw distribution)", t.logprob,
          2 - lse);
    for (int j = 0; j < 3; j++)
        CHECK(t.top_id[j] == j && fabs(t.top_logprob[j] - (x[j] - lse)) < 1e-6, "top %d: id %d logprob %.7f", j,
              t.top_id[j], t.top_logprob[j]);
    k3c_sampler r = {.temperature = 1, .top_p = 1, .seed = 3};
    int same = 1, varies = 0;
    for (uint64_t pos = 0; pos < 64; pos++) {
        int32_t a = k3c_sample_seq(&r, x, 4, pos, NULL, NULL, ws), b = k3c_sample_seq(&r, x, 4, pos, NULL, NULL, ws);
        same &= a == b;
        varies |= a != k3c_sample_seq(&r, x, 4, 0, NULL, NULL, ws);
    }
    CHECK(same && varies, "(seed, position) decides the draw");
    float p[4];
    int32_t idx[4];
    CHECK(k3c_sample(&r, x, 4, 9, p, idx) == k3c_sample_seq(&r, x, 4, 9, NULL, NULL, ws),
          "k3c_sample draws what k3c_sample_seq draws without history");
    k3c_err err = {0};
    k3c_sampler bad = {.top_p = 1, .min_p = 2};
    CHECK(k3c_sampler_check(&bad, &err) == K3C_EINVAL, "min-p 2 is refused");
    bad = (k3c_sampler){.top_p = 1, .logprobs = K3C_MAX_LOGPROBS + 1};
    CHECK(k3c_sampler_check(&bad, &err) == K3C_EINVAL, "too many logprobs are refused");
    free(ws);
}

int main(void) {
    distributions();
    penalties();
    logprobs_and_seed();
    printf("%d passed, %d failed\n", test_passed_, test_failed_);
    return test_failed_ != 0;
}
