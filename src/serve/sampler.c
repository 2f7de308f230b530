/* sampler.c — next-token choice over a logit row: repetition (HF), presence and frequency (OpenAI) penalties, then
 * greedy, or temperature with top-k, top-p (nucleus = the smallest set of most likely tokens whose mass reaches top_p)
 * and min-p cuts and a counter-based draw; logprobs of the chosen token and the top n. docs/ENGINE.md "Sampler". */
#include "base/base.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

static int has_penalty(const k3c_sampler *s) {
    return (s->repetition_penalty > 0 && s->repetition_penalty != 1) || s->presence_penalty != 0 ||
           s->frequency_penalty != 0;
}

/* x ← logits with the penalties of the sequence so far (mark: V ints of scratch, left zeroed).
 *   repetition (HF RepetitionPenaltyLogitsProcessor): every id of prompt or output, once: x > 0 ? x / r : x · r;
 *   presence / frequency (OpenAI): over the OUTPUT ids only: x −= frequency · count + presence · [count > 0]. */
static void penalise(const k3c_sampler *s, const float *logits, int64_t V, const k3c_history *h, float *x,
                     int32_t *mark) {
    memcpy(x, logits, sizeof(float) * (size_t)V);
    if (!h || !has_penalty(s)) return;
    memset(mark, 0, sizeof(int32_t) * (size_t)V);
    const double r = s->repetition_penalty;
    const int32_t *lists[2] = {h->prompt, h->output};
    const int64_t lens[2] = {h->n_prompt, h->n_output};
    for (int li = 0; li < 2; li++)
        for (int64_t i = 0; i < lens[li]; i++) {
            int32_t id = lists[li][i];
            if (id < 0 || id >= V) continue;
            if (r > 0 && r != 1 && !(mark[id] & 1)) x[id] = x[id] > 0 ? (float)(x[id] / r) : (float)(x[id] * r);
            mark[id] |= 1;
            if (li == 1) {
                x[id] -= (float)(s->frequency_penalty + (mark[id] & 2 ? 0 : s->presence_penalty));
                mark[id] |= 2;
            }
        }
    memset(mark, 0, sizeof(int32_t) * (size_t)V);
}

/* The log-probabilities of the raw model distribution: chosen id and the n most likely (ties: lower id first). */
static void logprobs(const float *logits, int64_t V, int32_t id, int n, k3c_sampled *out) {
    float mx = logits[argmax(logits, V)];
    double z = 0;
    for (int64_t i = 0; i < V; i++) z += exp((double)logits[i] - mx);
    const double lse = mx + log(z);
    out->id = id;
    out->logprob = (float)(logits[id] - lse);
    if (n > K3C_MAX_LOGPROBS) n = K3C_MAX_LOGPROBS;
    if (n > V) n = (int)V;
    out->n_top = n;
    for (int j = 0; j < n; j++) { /* selection: n ≤ 20 passes */
        int32_t best = -1;
        for (int64_t i = 0; i < V; i++) {
            int taken = 0;
            for (int q = 0; q < j && !taken; q++) taken = out->top_id[q] == i;
            if (!taken && (best < 0 || logits[i] > logits[best])) best = (int32_t)i;
        }
        out->top_id[j] = best;
        out->top_logprob[j] = (float)(logits[best] - lse);
    }
}

static int32_t draw(const k3c_sampler *s, const float *x, int64_t V, uint64_t position, float *p, int32_t *idx) {
    if (s->temperature <= 0) return argmax(x, V);
    float mx = x[argmax(x, V)];
    double z = 0;
    for (int64_t i = 0; i < V; i++) {
        p[i] = (float)exp((x[i] - mx) / s->temperature);
        z += p[i];
    }
    for (int64_t i = 0; i < V; i++) {
        p[i] = (float)(p[i] / z);
        idx[i] = (int32_t)i;
    }
    int64_t keep = V;
    if (s->top_p < 1 || s->top_k > 0 || s->min_p > 0) {
        qsort_r(idx, (size_t)V, sizeof *idx, by_prob_desc, p);
        if (s->top_k > 0 && s->top_k < keep) keep = s->top_k; /* HF order: top-k, then top-p, then min-p */
        if (s->top_p < 1) {
            double total = 0, mass = 0;
            for (int64_t i = 0; i < keep; i++) total += p[idx[i]];
            int64_t m = 0;
            for (; m < keep && mass < s->top_p * total; m++) mass += p[idx[m]];
            keep = m > 0 ? m : 1;
        }
        if (s->min_p > 0) { /* tokens at least min_p times as likely as the most likely one */
            int64_t m = 1;
            while (m < keep && p[idx[m]] >= s->min_p * p[idx[0]]) m++;
            keep = m;
        }
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

size_t k3c_sample_workspace(int64_t V) { return (sizeof(float) * 2 + sizeof(int32_t)) * (size_t)V; }

int32_t k3c_sample_seq(const k3c_sampler *s, const float *logits, int64_t V, uint64_t position, const k3c_history *h,
                       k3c_sampled *out, void *ws) {
    float *x = ws, *p = x + V;
    int32_t *idx = (int32_t *)(p + V);
    penalise(s, logits, V, h, x, idx);
    int32_t id = draw(s, x, V, position, p, idx);
    if (out) logprobs(logits, V, id, s->logprobs, out);
    return id;
}

int32_t k3c_sample(const k3c_sampler *s, const float *logits, int64_t V, uint64_t position, float *p, int32_t *idx) {
    return draw(s, logits, V, position, p, idx); /* no history: the penalties have nothing to act on */
}

int k3c_sampler_check(const k3c_sampler *s, k3c_err *err) {
    if (!(s->temperature >= 0) || !(s->top_p > 0 && s->top_p <= 1))
        return k3c_errf(err, K3C_EINVAL, "sampler: temperature %g must be >= 0 and top-p %g in (0, 1]", s->temperature,
                        s->top_p);
    if (s->top_k < 0 || !(s->min_p >= 0 && s->min_p <= 1) || !(s->repetition_penalty >= 0) ||
        !isfinite(s->presence_penalty) || !isfinite(s->frequency_penalty) || s->logprobs < 0 ||
        s->logprobs > K3C_MAX_LOGPROBS)
        return k3c_errf(err, K3C_EINVAL,
                        "sampler: needs top-k >= 0, min-p in [0, 1], repetition penalty >= 0, finite presence and "
                        "frequency penalties, logprobs in 0..%d",
                        K3C_MAX_LOGPROBS);
    return K3C_OK;
}
