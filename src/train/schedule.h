/* schedule.h — the learning-rate schedule of a training stage (warmup, then cosine / linear / constant).
 * Spec: docs/TRAINING.md §1.1 (cosine with 1% warmup), §1.4 (stages with their own lr). */
#ifndef K3C_TRAIN_SCHEDULE_H
#define K3C_TRAIN_SCHEDULE_H

#include "k3c.h"

/* ================================================================ learning-rate schedule
 * step is the 1-based update index. Warmup: lr = peak · step / warmup_steps for step ≤ warmup_steps. After warmup,
 * p = (step − warmup) / (total − warmup) clamped to [0, 1] (p = 1 when total ≤ warmup), lr_min = min_lr_ratio · peak:
 *   COSINE: lr_min + (peak − lr_min) · ½(1 + cos πp)      (K3: cosine with 1% warmup, docs/TRAINING.md §1.1)
 *   LINEAR: peak − (peak − lr_min) · p                    (annealing / cooldown stages)
 *   CONSTANT: peak */
typedef enum { K3C_SCHED_COSINE = 0, K3C_SCHED_LINEAR = 1, K3C_SCHED_CONSTANT = 2 } k3c_sched_kind;

typedef struct {
    int kind; /* k3c_sched_kind */
    double peak_lr;
    int64_t warmup_steps, total_steps;
    double min_lr_ratio;
} k3c_schedule;

double k3c_schedule_lr(const k3c_schedule *s, int64_t step);
/* "cosine" / "linear" / "constant" → k3c_sched_kind; K3C_EINVAL otherwise. */
int k3c_schedule_parse(const char *name, int *kind, k3c_err *err);

#endif
