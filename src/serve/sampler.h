/* sampler.h — next-token choice from logits: greedy, or temperature + nucleus (top-p) sampling with a counter-based
 * random stream, so a (seed, position) pair always draws the same token. */
#ifndef K3C_SERVE_SAMPLER_H
#define K3C_SERVE_SAMPLER_H

#include "k3c.h"

typedef struct {
    double temperature; /* 0 = greedy */
    double top_p;       /* 1 = no nucleus cut */
    uint64_t seed;
} k3c_sampler;

/* Picks a token id from logits[V]; `position` selects the random draw. work: V floats + V ints of scratch. */
int32_t k3c_sample(const k3c_sampler *s, const float *logits, int64_t V, uint64_t position, float *work_p,
                   int32_t *work_idx);

#endif
