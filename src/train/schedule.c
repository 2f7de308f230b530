/* schedule.c — the learning-rate schedule (linear warmup, then cosine / linear / constant) and global gradient-norm
 * clipping. Spec: TRAINING.md §1.1 (cosine with 1% warmup), §1.4 (stages with their own lr); ARCHITECTURE.md §11. */
#include "train/optim.h"

#include <math.h>
#include <string.h>

double k3c_schedule_lr(const k3c_schedule *s, int64_t step) {
    const double peak = s->peak_lr, lo = s->min_lr_ratio * s->peak_lr;
    if (step < 0) step = 0;
    if (s->warmup_steps > 0 && step <= s->warmup_steps) return peak * (double)step / (double)s->warmup_steps;
    const int64_t span = s->total_steps - s->warmup_steps;
    double p = span > 0 ? (double)(step - s->warmup_steps) / (double)span : 1.0;
    if (p < 0) p = 0;
    if (p > 1) p = 1;
    switch (s->kind) {
    case K3C_SCHED_LINEAR: return peak - (peak - lo) * p;
    case K3C_SCHED_CONSTANT: return peak;
    default: return lo + (peak - lo) * 0.5 * (1.0 + cos(M_PI * p));
    }
}

int k3c_schedule_parse(const char *name, int *kind, k3c_err *err) {
    static const char *names[] = {"cosine", "linear", "constant"};
    for (int i = 0; i < 3; i++)
        if (name && strcmp(name, names[i]) == 0) {
            *kind = i;
            return K3C_OK;
        }
    return k3c_errf(err, K3C_EINVAL, "schedule: '%s' is not one of cosine, linear, constant", name ? name : "(null)");
}

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
