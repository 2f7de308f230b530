/* optim_backend.h — where the trainer runs the optimizer step and gradient clipping: a plain table of functions that
 * replaces the CPU k3c_optim_step_entries / k3c_clip_grad_norm (NULL table = the CPU). Spec: ARCHITECTURE.md §10. */
#ifndef K3C_TRAIN_OPTIM_BACKEND_H
#define K3C_TRAIN_OPTIM_BACKEND_H

#include "train/optim.h"

/* The functions take the same buffers as the CPU ones (w, g, state laid out by k3c_optim_init), but in the model
 * backend's memory, and run on that backend's stream. The state layout is the CPU one, so checkpoints of the optimizer
 * state do not depend on where the step ran. */
typedef struct k3c_optim_backend {
    void *ctx; /* e.g. the k3c_cuda_backend the model runs on */
    /* Once, after k3c_optim_init(o, t): allocates the workspace for o over t and returns it in *inst. */
    int (*open)(void *ctx, const k3c_optim *o, const k3c_param_table *t, void **inst, k3c_err *err);
    void (*close)(void *inst);
    /* k3c_optim_step_entries; returns without waiting for the device (the caller syncs the backend before the host
     * reads w or state). */
    int (*step_entries)(void *inst, k3c_optim *o, const k3c_param_table *t, int first, int last, float *w,
                        const float *g, float *state, double lr, int64_t step, k3c_err *err);
    /* *norm = k3c_clip_grad_norm(t, g, max_norm) (max_norm ≤ 0: no clipping, the norm only). Waits for the device:
     * the host needs the norm (it is logged and decides the clip). */
    int (*clip_grad_norm)(void *inst, const k3c_param_table *t, float *g, double max_norm, double *norm, k3c_err *err);
} k3c_optim_backend;

#endif
