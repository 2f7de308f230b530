/* k3c/train.h — the public API of training runs: the run config (data sources, staged context,
 * optimizer, balancing, checkpoints) and the trainer. docs/TRAINING.md. */
#ifndef K3C_TRAIN_H
#define K3C_TRAIN_H

#include "k3c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- training (docs/TRAINING.md §1)
 * A run: the run config (model, data sources, staged context, optimizer, balancing, checkpoints) and the trainer that
 * executes it with checkpoints that resume bit-exactly. */
#define K3C_RUN_MAX_STAGES 16
#define K3C_RUN_MAX_SOURCES 16

typedef struct {
    char name[64];
    int64_t seq_len;         /* longest document piece (the stage's context length) */
    int64_t tokens_per_step; /* tokens per optimizer step */
    int64_t steps;
    double lr, min_lr_ratio; /* peak lr of the stage's schedule and its floor */
    int64_t warmup;
    int schedule;                        /* k3c_sched_kind */
    double mixture[K3C_RUN_MAX_SOURCES]; /* weight per data source (run order); all 0 = uniform */
} k3c_stage;

/* The run's parallel layout ("parallel" in the run config): degrees of data, expert, tensor, pipeline and context
 * parallelism; their product is the number of ranks (docs/PARALLEL.md). All zero: no block (dp = the world size).
 * micro_batches: pipeline micro-batches per step (0: pp). */
typedef struct {
    int64_t dp, ep, tp, pp, cp;
    int64_t micro_batches;
} k3c_parallel;

typedef enum {
    K3C_BALANCE_QUANTILE = 0,
    K3C_BALANCE_BIAS = 1,
    K3C_BALANCE_AUX = 2,
    K3C_BALANCE_NONE = 3
} k3c_balancing;

typedef struct {
    char path[1024];         /* the config file (errors name it) */
    char model_config[1024]; /* HF config.json of the model to train */
    char vocab[1024];        /* tokenizer (tiktoken file, + .specials.json), copied into checkpoints */
    char pattern[16];        /* pre-tokeniser: "cl100k" or "kimi" */
    char out_dir[1024];
    int n_sources;
    char source_name[K3C_RUN_MAX_SOURCES][64];
    char source_dir[K3C_RUN_MAX_SOURCES][1024];
    int n_stages;
    k3c_stage stage[K3C_RUN_MAX_STAGES];
    uint64_t seed;
    double init_std;
    int kda_chunk; /* 16, 64 or 0 (token recurrence) */
    int threads;   /* 0 = OpenMP default */
    int recompute; /* 1 = recompute every layer's activations in the backward ("recompute": "all") */
    /* optimizer */
    char matrix_optimizer[16]; /* "muon" or "adamw" */
    double weight_decay, beta1, beta2, eps, grad_clip, qk_clip_tau;
    /* balancing (docs/TRAINING.md §1.6): quantile balancing ("exact" = "quantile", "histogram"), DeepSeek-V3's
     * auxiliary-loss-free bias step ("bias", step bias_gamma), the Switch / GShard auxiliary loss ("aux", coefficient
     * aux_alpha), or none ("none" = "off": the router bias stays frozen) */
    int balancing;                /* k3c_balancing */
    int qb_mode;                  /* K3C_BALANCE_QUANTILE: the k3c_qb_mode; else -1 */
    double bias_gamma, aux_alpha; /* the bias step γ ("bias") and the loss coefficient α ("aux") */
    int64_t log_every, eval_every, eval_batches, checkpoint_every, keep_checkpoints;
    k3c_parallel parallel;
    /* "parallel": {"force": true}: the parallel step even with one rank (ZeRO-1 and the expert exchange over the
     * one-rank communicator), to exercise its code paths on one process or one GPU (docs/PARALLEL.md "Launch") */
    int parallel_force;
    /* the step guard ("guard": {...}, docs/TRAINING.md §8.1): skip a step whose loss exceeds spike_factor x the median
     * of the last `window` losses (0: no spike test) or is not finite; after max_skips in a row (0: never) roll back to
     * the last good checkpoint with the learning rate multiplied by lr_factor */
    double guard_spike_factor, guard_lr_factor;
    int64_t guard_window, guard_max_skips;
} k3c_run_config;

/* Reads a run config JSON strictly: unknown keys, impossible stages (steps ≤ 0, seq_len > tokens_per_step, a mixture
 * naming an unknown source, negative weights, ...) are errors naming the file and field. Relative paths are taken
 * relative to the config file's directory. */
int k3c_run_config_load(const char *path, k3c_run_config *rc, k3c_err *err);

/* Options of one `k3c train` invocation. */
typedef struct {
    int resume;          /* continue from out_dir/latest */
    int64_t max_steps;   /* stop after this many steps in total (0 = run every stage); for tests */
    FILE *progress;      /* progress bar (drawn only when a terminal; NULL = none) */
    FILE *log;           /* per-step lines (NULL = none) */
    const void *backend; /* the k3c_backend_f32 (ops/backend.h) the model runs on; NULL = the CPU reference */
    void *comm;          /* the k3c_comm (src/parallel/comm.h) of every rank of the run; NULL = this process alone. Rank 0
                            writes metrics and checkpoints */
} k3c_train_opts;

typedef struct {
    int64_t steps;
    double last_loss, last_val_loss, tokens_per_s, wall_s;
    double max_load_ratio;  /* max/mean expert load of the last step, worst layer */
    double unigram_entropy; /* nats/token of the training tokens' unigram distribution (the context-free baseline) */
    int64_t skipped, rollbacks; /* the step guard's events in this invocation */
    double lr_scale;            /* the guard's learning-rate factor at the end (1 without rollbacks) */
} k3c_train_result;

/* Runs (or resumes) the training described by rc; writes checkpoints and metrics.jsonl into rc->out_dir (`k3c train`
 * then plots metrics.png). */
int k3c_train_run(const k3c_run_config *rc, const k3c_train_opts *opts, k3c_train_result *res, k3c_err *err);

#ifdef __cplusplus
}
#endif
#endif
