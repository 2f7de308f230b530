/* guard.h — the step guard: a step whose loss or gradient norm is not finite, or whose loss spikes above a multiple of
 * the running median, is skipped (no optimizer step); after max_skips failures in a row the trainer rolls back to the
 * last good checkpoint with the learning rate scaled down. Spec: docs/TRAINING.md §8.1. */
#ifndef K3C_TRAIN_GUARD_H
#define K3C_TRAIN_GUARD_H

#include "base/json.h"

#define K3C_GUARD_MAX_WINDOW 1024
#define K3C_GUARD_MIN_HISTORY 8 /* losses needed before spikes are judged (or the whole window, when shorter) */

/* What the guard has seen; saved in trainer_state.json so that a resumed run judges exactly as the uninterrupted one. */
typedef struct {
    double loss[K3C_GUARD_MAX_WINDOW]; /* the last accepted losses, a ring */
    int n, next;
    int64_t fails;     /* failed steps in a row */
    double lr_scale;   /* product of the rollback factors so far (1 at the start) */
    int64_t skipped;   /* batches skipped in this run */
    int64_t rollbacks; /* rollbacks in this run */
} k3c_guard;

void k3c_guard_init(k3c_guard *g);
/* 1 and a reason in why[n] when a step with this loss and gradient norm must be skipped, else 0 (before the backward,
 * pass grad_norm 0: only the loss is judged). */
int k3c_guard_judge(const k3c_guard *g, const k3c_run_config *rc, double loss, double grad_norm, char *why, size_t n);
/* A step that went through: its loss joins the window, the failure run ends. */
void k3c_guard_accept(k3c_guard *g, const k3c_run_config *rc, double loss);
/* A skipped step; returns 1 when the failures in a row reach guard_max_skips (time to roll back). */
int k3c_guard_reject(k3c_guard *g, const k3c_run_config *rc);
/* "guard": {"lr_scale": x, "losses": [...]} as a member of trainer_state.json (with a leading comma), and back. */
void k3c_guard_to_json(const k3c_guard *g, k3c_sbuf *s);
int k3c_guard_from_json(k3c_guard *g, const k3c_json *state, const char *file, k3c_err *err);

#endif
