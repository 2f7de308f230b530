/* sampler.c — greedy and temperature/top-p sampling over a logit row (softmax in double, nucleus = the smallest set of
 * most likely tokens whose mass reaches top_p). */
#include "base/base.h"

#include <math.h>
#include <stdlib.h>

static int32_t argmax(const float *x, int64_t n) {
    int32_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int32_t)i;
    return best;
}

static int by_prob_desc(const void *a, const void *b, void *ctx) {
    const float *p = ctx;
    float pa = p[*(const int32_t *)a], pb = p[*(const int32_t *)b];
    if (pa != pb) return pa < pb ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

int32_t k3c_sample(const k3c_sampler *s, const float *logits, int64_t V, uint64_t position, float *p, int32_t *idx) {
    if (s->temperature <= 0) return argmax(logits, V);
    float mx = logits[argmax(logits, V)];
    double z = 0;
    for (int64_t i = 0; i < V; i++) {
        p[i] = (float)exp((logits[i] - mx) / s->temperature);
        z += p[i];
    }
    for (int64_t i = 0; i < V; i++) {
        p[i] = (float)(p[i] / z);
        idx[i] = (int32_t)i;
    }
    int64_t keep = V;
    if (s->top_p < 1) {
        qsort_r(idx, (size_t)V, sizeof *idx, by_prob_desc, p);
        double mass = 0;
        for (keep = 0; keep < V && mass < s->top_p; keep++) mass += p[idx[keep]];
        if (keep == 0) keep = 1;
    }
    double total = 0;
    for (int64_t i = 0; i < keep; i++) total += p[idx[i]];
    double u = k3c_uniform_at(s->seed, position) * total, acc = 0;
    for (int64_t i = 0; i < keep; i++) {
        acc += p[idx[i]];
        if (u < acc) return idx[i];
    }
    return idx[keep - 1];
}
