/* sched.h — the scheduler between the request layers (`k3c serve`, `k3c chat`) and the inference engine: one thread
 * steps the engine, whose queue is the only one (k3c/serve.h), and each job's events come back as objects that the
 * job's consumer takes on its own thread (docs/SERVING.md §4, docs/ENGINE.md). */
#ifndef K3C_SERVE_SCHED_H
#define K3C_SERVE_SCHED_H

#include "k3c.h"
#include "k3c/serve.h"

#define K3C_SCHED_MAX_CTX                                                                                              \
    4096 /* tokens per sequence (prompt + output) at most: each slot's latent cache holds this many */

typedef struct k3c_sched k3c_sched;
typedef struct k3c_sched_job k3c_sched_job;

/* Called when a job whose consumer found nothing has an event (on the engine thread, or on the thread that cancels or
 * closes); one-shot. Must not block or call back into the job. */
typedef void (*k3c_sched_wake)(void *ctx);

/* A scheduler over weights (as stored, on the host or a device; they outlive the scheduler): one engine thread runs
 * the inference engine with `slots` sequences decoding together (continuous batching); at most `queue_max` more wait. */
int k3c_sched_new(const k3c_weights *w, int slots, int queue_max, k3c_sched **out, k3c_err *err);
/* Cancels every job (each gets its last event soon) and refuses new ones; returns at once. */
void k3c_sched_close(k3c_sched *s);
/* Tokens a sequence may hold, prompt + output: the model's max_position_embeddings capped at K3C_SCHED_MAX_CTX (the
 * request layer's limit, so a longer request is refused before it is queued). */
int64_t k3c_sched_max_ctx(const k3c_sched *s);
/* Closes, waits for the engine thread and frees the scheduler (jobs still held stay valid until released). */
void k3c_sched_free(k3c_sched *s);

/* Queues prompt[0..n) with r (both copied): K3C_ENOMEM when the queue is full or the scheduler is closing (the
 * caller answers "overloaded"), K3C_EINVAL for a bad request, else *job is the caller's handle (k3c_sched_release).
 * max_new 0 ends at once with K3C_FINISH_LENGTH. */
int k3c_sched_submit(k3c_sched *s, const int32_t *prompt, int64_t n, const k3c_request *r, k3c_sched_job **job,
                     k3c_err *err);
/* Queues count requests at once, all or none: jobs[i] for prompts[i][0..n[i]) with r[i]. Queued together, they take
 * free slots at the same step (the samples of one request decode as one batch). */
int k3c_sched_submit_all(k3c_sched *s, int count, const int32_t *const *prompts, const int64_t *n,
                         const k3c_request *r, k3c_sched_job **jobs, k3c_err *err);
/* Takes the job's next event: 1 with *ev filled (its finish is not K3C_FINISH_NONE on the last one; ev->token.id is
 * -1 in an event without a token), or 0 when none has come yet — then, when wake is given, wake(ctx) is called once
 * when one does. After the last event it returns 0 and arms nothing. */
int k3c_sched_next(k3c_sched_job *j, k3c_engine_event *ev, k3c_sched_wake wake, void *ctx);
/* The same, waiting for the event (after the last one, the last one again). */
void k3c_sched_wait(k3c_sched_job *j, k3c_engine_event *ev);
/* No wake may come after this returns. */
void k3c_sched_disarm(k3c_sched_job *j);
/* The engine's message when the job ended with K3C_FINISH_ERROR ("" otherwise). */
const char *k3c_sched_error(const k3c_sched_job *j);
/* Ends the job (a client went away, or its consumer stopped at a stop string): its sequence leaves the engine before
 * the next step, and the job's last event, K3C_FINISH_CANCELLED, is queued at once. A no-op once it ended. */
void k3c_sched_cancel(k3c_sched_job *j);
void k3c_sched_release(k3c_sched_job *j);

/* The engine's gauges and counters (queued, running, steps, step_seqs, batch_max). */
void k3c_sched_get_stats(k3c_sched *s, k3c_engine_stats *st);

#endif
