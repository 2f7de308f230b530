/* schedule.c — the learning-rate schedule (linear warmup, then cosine / linear / constant).
 * Spec: docs/TRAINING.md §1.1 (cosine with 1% warmup), §1.4 (stages with their own lr). */
#include "train/schedule.h"

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
