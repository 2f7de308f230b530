/* sched.h — the scheduler the server and `k3c chat` submit generation requests to: prompt ids + sampling parameters in,
 * a stream of token events and a finish reason out, cancellable. The one seam between the HTTP layer
 * and the decode engine: swapping in the batched engine replaces sched.c alone. */
#ifndef K3C_SERVE_SCHED_H
#define K3C_SERVE_SCHED_H

#include "k3c.h"

#define K3C_SCHED_MAX_STOP_IDS 8
#define K3C_SCHED_MAX_CTX                                                                                              \
    4096 /* tokens per sequence (prompt + output) at most: each slot's latent cache holds this many */

/* Per-request sampling, every field validated by the request layer and applied per sequence by the engine's sampler
 * (k3c_sampler). logprobs: report each token's logprob and its top_logprobs most likely alternatives. */
typedef struct {
    double temperature, top_p, min_p;
    int64_t top_k; /* 0 = off */
    double presence_penalty, frequency_penalty, repetition_penalty;
    uint64_t seed;
    int logprobs, top_logprobs;
} k3c_gen_params;

void k3c_gen_params_default(k3c_gen_params *p); /* temperature 1, top_p 1, repetition 1, the rest off */

typedef struct {
    const int32_t *prompt; /* copied at submit */
    int64_t n_prompt, max_new;
    int32_t stop_ids[K3C_SCHED_MAX_STOP_IDS]; /* generation ends after one of these (the id is still reported) */
    int n_stop_ids;
    k3c_gen_params params;
    /* image rows (k3c_request's overrides), copied at submit: n_embeds × hidden floats at prompt positions embed_pos */
    int64_t n_embeds;
    const int32_t *embed_pos;
    const float *embeds;
    /* seconds a job may wait for a slot, and may generate once in one (0: no limit); past either it ends with
     * K3C_SCHED_FINISH_QUEUE_TIMEOUT / K3C_SCHED_FINISH_TIMEOUT, checked between engine steps */
    double max_queue_s, max_gen_s;
} k3c_sched_req;

typedef enum {
    K3C_SCHED_FINISH_STOP = 0,      /* a stop id, or the sink asked to stop (a stop string) */
    K3C_SCHED_FINISH_LENGTH,        /* max_new ids */
    K3C_SCHED_FINISH_CANCELLED,     /* k3c_sched_cancel, or the scheduler shut down */
    K3C_SCHED_FINISH_ERROR,         /* the engine failed: the message is in the done event */
    K3C_SCHED_FINISH_TIMEOUT,       /* generated for longer than max_gen_s */
    K3C_SCHED_FINISH_QUEUE_TIMEOUT, /* waited for a slot longer than max_queue_s (nothing generated) */
} k3c_sched_finish;

/* OpenAI spelling: "stop", "length", "cancelled", "error"; "timeout", "queue_timeout" */
const char *k3c_sched_finish_name(k3c_sched_finish f);

/* Where a job's events go; called on the engine thread, one job's events in order. on_token gets each generated id
 * with its logprob and top alternatives (t->n_top = params.top_logprobs when params.logprobs; is_stop: it is one of
 * the request's stop ids, generation ends after it) and returns non-zero to end generation.
 * on_done comes exactly once, last, also for a job cancelled before it started; after it returns the scheduler never
 * touches ctx again. */
typedef struct {
    int (*on_token)(void *ctx, const k3c_sampled *t, int is_stop);
    void (*on_done)(void *ctx, k3c_sched_finish why, int64_t n_generated, const k3c_err *err);
    void *ctx;
} k3c_sched_sink;

typedef struct k3c_sched k3c_sched;
typedef struct k3c_sched_job k3c_sched_job;

/* A scheduler over weights (as stored, on the host or a device; they outlive the scheduler): one engine thread runs
 * the inference engine (k3c_engine) with `slots` sequences decoding together (continuous batching); at most
 * `queue_max` more wait. */
int k3c_sched_new(const k3c_weights *w, int slots, int queue_max, k3c_sched **out, k3c_err *err);
/* Cancels every job (each gets its on_done soon) and refuses new ones; returns at once. */
void k3c_sched_close(k3c_sched *s);
/* Tokens a sequence may hold, prompt + output: the model's max_position_embeddings capped at K3C_SCHED_MAX_CTX (the
 * request layer's limit, so a longer request is refused before it is queued). */
int64_t k3c_sched_max_ctx(const k3c_sched *s);
/* Closes, waits for the engine thread and frees the scheduler. */
void k3c_sched_free(k3c_sched *s);
/* Queues a request: K3C_ENOMEM when the queue is full (the caller answers "overloaded"), K3C_EINVAL for a bad
 * request or sampler setting (an engine that refuses it later, e.g. a prompt past its context, ends it with
 * on_done(K3C_SCHED_FINISH_ERROR)), else *job is the caller's handle (release it with k3c_sched_release). */
int k3c_sched_submit(k3c_sched *s, const k3c_sched_req *r, const k3c_sched_sink *sink, k3c_sched_job **job,
                     k3c_err *err);
/* Asks the job to end (a client went away): its sequence leaves the engine and it gets
 * on_done(K3C_SCHED_FINISH_CANCELLED) before the next step, or, when it is still queued, at once on the calling thread
 * (which must not hold a lock on_done takes). */
void k3c_sched_cancel(k3c_sched_job *j);
void k3c_sched_release(k3c_sched_job *j);
typedef struct {
    int queued, running;       /* jobs waiting for a slot, jobs in a slot */
    uint64_t steps, step_seqs; /* engine steps run, and the sequences they ran summed (step_seqs / steps: the
                                     mean batch) */
    int batch_max;             /* the most sequences one step ran */
} k3c_sched_stats;
void k3c_sched_get_stats(k3c_sched *s, k3c_sched_stats *st);

#endif
