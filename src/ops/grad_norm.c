/* grad_norm.c — the global gradient norm over a parameter table and torch-style clipping: the CPU reference of the
 * backend table's clip_grad_norm entry (CUDA twin in cuda/optim.cu). Spec: docs/MODEL.md §11, docs/TRAINING.md §1.3. */
#include "ops/optim.h"

#include <math.h>

/* Σx² over fixed blocks: each block is summed sequentially, blocks are added in index order, so threads only change who
 * computes a block, never the rounding. */
#define NORM_BLOCK (1 << 15)
#define NORM_BATCH 256

static double sumsq(const float *x, int64_t n) {
    double total = 0;
    const int64_t nb = (n + NORM_BLOCK - 1) / NORM_BLOCK;
    for (int64_t b0 = 0; b0 < nb; b0 += NORM_BATCH) {
        const int64_t cnt = nb - b0 < NORM_BATCH ? nb - b0 : NORM_BATCH;
        double part[NORM_BATCH];
#pragma omp parallel for schedule(static) if (cnt > 1)
        for (int64_t b = 0; b < cnt; b++) {
            const int64_t i0 = (b0 + b) * NORM_BLOCK, i1 = i0 + NORM_BLOCK < n ? i0 + NORM_BLOCK : n;
            double s = 0;
            for (int64_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
            part[b] = s;
        }
        for (int64_t b = 0; b < cnt; b++) total += part[b];
    }
    return total;
}

double k3c_grad_norm(const k3c_param_table *t, const float *g) {
    double ss = 0;
    for (int i = 0; i < t->n; i++)
        if (t->p[i].kind != K3C_PK_ROUTER_BIAS) ss += sumsq(g + t->p[i].offset, t->p[i].numel);
    return sqrt(ss);
}

double k3c_clip_grad_norm(const k3c_param_table *t, float *g, double max_norm) {
    const double norm = k3c_grad_norm(t, g);
    if (!isfinite(norm) || !(max_norm > 0) || norm <= max_norm) return norm;
    const float c = (float)(max_norm / (norm + 1e-6));
    for (int i = 0; i < t->n; i++) {
        const k3c_param *p = &t->p[i];
        if (p->kind == K3C_PK_ROUTER_BIAS) continue;
        float *x = g + p->offset;
#pragma omp parallel for schedule(static) if (p->numel > (1 << 16))
        for (int64_t j = 0; j < p->numel; j++) x[j] *= c;
    }
    return norm;
}
