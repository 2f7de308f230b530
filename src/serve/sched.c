/* sched.c — the scheduler of sched.h over today's engine: `slots` worker threads take jobs from a FIFO and run
 * k3c_generate, one at a time through a model lock (the engine recomputes the prefix and is not re-entrant). */
#include "serve/sched.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct k3c_sched_job {
    k3c_sched *s;
    k3c_sched_req req; /* req.prompt points at seq */
    int32_t *seq;      /* prompt + room for max_new ids */
    k3c_sched_sink sink;
    int refs; /* the caller's handle + the scheduler's */
    atomic_int cancelled;
    int queued, stop_hit;
    int64_t n_gen;
    k3c_sched_job *next;
};

struct k3c_sched {
    k3c_model *m;
    pthread_mutex_t mu, model_mu;
    pthread_cond_t cv;
    k3c_sched_job *head, *tail, **running; /* running: one entry per slot (NULL when idle) */
    int n_queued, n_running, queue_max, slots, closing, n_workers;
    pthread_t *workers;
};

void k3c_gen_params_default(k3c_gen_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1;
    p->top_p = 1;
    p->repetition_penalty = 1;
}

const char *k3c_sched_finish_name(k3c_sched_finish f) {
    static const char *const names[] = {"stop", "length", "cancelled", "error"};
    return f >= K3C_SCHED_FINISH_STOP && f <= K3C_SCHED_FINISH_ERROR ? names[f] : "error";
}

static void job_unref(k3c_sched_job *j) {
    k3c_sched *s = j->s;
    pthread_mutex_lock(&s->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&s->mu);
    if (last) {
        free(j->seq);
        free(j);
    }
}

static int gen_token(void *ctx, int32_t id, int64_t i) {
    k3c_sched_job *j = ctx;
    (void)i;
    if (atomic_load(&j->cancelled)) return 1;
    int is_stop = 0;
    for (int k = 0; k < j->req.n_stop_ids; k++) is_stop |= id == j->req.stop_ids[k];
    j->n_gen++;
    int r = j->sink.on_token(j->sink.ctx, id, is_stop);
    if (is_stop || r) j->stop_hit = 1;
    return is_stop || r;
}

/* Runs a job on the engine; returns how it finished (err filled for K3C_SCHED_FINISH_ERROR). */
static k3c_sched_finish run_job(k3c_sched *s, k3c_sched_job *j, k3c_err *err) {
    int rc = 0;
    pthread_mutex_lock(&s->model_mu);
    if (!atomic_load(&j->cancelled) && j->req.max_new > 0) {
        const k3c_gen_params *p = &j->req.params;
        k3c_gen_opts o = {.sampler = {.temperature = p->temperature,
                                      .top_p = p->top_p,
                                      .seed = p->seed,
                                      .top_k = p->top_k,
                                      .min_p = p->min_p,
                                      .repetition_penalty = p->repetition_penalty,
                                      .presence_penalty = p->presence_penalty,
                                      .frequency_penalty = p->frequency_penalty},
                          .max_new = j->req.max_new,
                          .stop_id = -1,
                          .on_token = gen_token,
                          .ctx = j};
        int64_t len = 0;
        rc = k3c_generate(s->m, j->seq, j->req.n_prompt, &o, &len, err);
    }
    pthread_mutex_unlock(&s->model_mu);
    return rc                           ? K3C_SCHED_FINISH_ERROR
           : atomic_load(&j->cancelled) ? K3C_SCHED_FINISH_CANCELLED
           : j->stop_hit                ? K3C_SCHED_FINISH_STOP
                                        : K3C_SCHED_FINISH_LENGTH;
}

static void *worker(void *arg) {
    k3c_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->closing && !s->head) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head) break; /* closing and nothing left */
        k3c_sched_job *j = s->head;
        s->head = j->next;
        if (!s->head) s->tail = NULL;
        j->queued = 0;
        s->n_queued--;
        int slot = 0;
        while (s->running[slot]) slot++; /* a worker per slot: one is always free here */
        s->running[slot] = j;
        s->n_running++;
        if (s->closing) atomic_store(&j->cancelled, 1);
        pthread_mutex_unlock(&s->mu);
        k3c_err err = {0};
        k3c_sched_finish why = run_job(s, j, &err);
        pthread_mutex_lock(&s->mu);
        s->running[slot] = NULL; /* free before on_done: a caller may submit its next request from there on */
        s->n_running--;
        pthread_mutex_unlock(&s->mu);
        j->sink.on_done(j->sink.ctx, why, j->n_gen, why == K3C_SCHED_FINISH_ERROR ? &err : NULL);
        job_unref(j);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int k3c_sched_new(k3c_model *m, int slots, int queue_max, k3c_sched **out, k3c_err *err) {
    *out = NULL;
    if (!m || slots < 1 || slots > 256 || queue_max < 0)
        return k3c_errf(err, K3C_EINVAL, "scheduler: need a model, 1..256 slots and a queue bound >= 0 (got %d, %d)",
                        slots, queue_max);
    k3c_sched *s = calloc(1, sizeof *s);
    if (!s || !(s->workers = calloc((size_t)slots, sizeof *s->workers)) ||
        !(s->running = calloc((size_t)slots, sizeof *s->running))) {
        if (s) free(s->workers);
        free(s);
        return k3c_errf(err, K3C_ENOMEM, "scheduler: out of memory");
    }
    s->m = m;
    s->slots = slots;
    s->queue_max = queue_max;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->model_mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    for (; s->n_workers < slots; s->n_workers++)
        if (pthread_create(&s->workers[s->n_workers], NULL, worker, s)) {
            k3c_sched_free(s);
            return k3c_errf(err, K3C_ENOMEM, "scheduler: cannot start engine thread %d", s->n_workers);
        }
    *out = s;
    return 0;
}

void k3c_sched_close(k3c_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->closing = 1;
    for (int i = 0; i < s->slots; i++)
        if (s->running[i]) atomic_store(&s->running[i]->cancelled, 1);
    for (k3c_sched_job *j = s->head; j; j = j->next) atomic_store(&j->cancelled, 1);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void k3c_sched_free(k3c_sched *s) {
    if (!s) return;
    k3c_sched_close(s);
    for (int i = 0; i < s->n_workers; i++) pthread_join(s->workers[i], NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->model_mu);
    pthread_cond_destroy(&s->cv);
    free(s->workers);
    free(s->running);
    free(s);
}

int k3c_sched_submit(k3c_sched *s, const k3c_sched_req *r, const k3c_sched_sink *sink, k3c_sched_job **job,
                     k3c_err *err) {
    *job = NULL;
    if (!r->prompt || r->n_prompt < 1 || r->max_new < 0 || r->n_stop_ids < 0 ||
        r->n_stop_ids > K3C_SCHED_MAX_STOP_IDS || !sink->on_token || !sink->on_done)
        return k3c_errf(err, K3C_EINVAL,
                        "scheduler: a request needs a prompt of at least one id, max_new >= 0, at "
                        "most %d stop ids and both callbacks",
                        K3C_SCHED_MAX_STOP_IDS);
    k3c_sched_job *j = calloc(1, sizeof *j);
    size_t n = (size_t)(r->n_prompt + r->max_new);
    if (!j || !(j->seq = malloc(sizeof(int32_t) * n))) {
        free(j);
        return k3c_errf(err, K3C_ENOMEM, "scheduler: out of memory");
    }
    memcpy(j->seq, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    j->s = s;
    j->req = *r;
    j->req.prompt = j->seq;
    j->sink = *sink;
    j->refs = 2;
    j->queued = 1;
    pthread_mutex_lock(&s->mu);
    if (s->closing || s->n_queued >= s->queue_max + (s->slots - s->n_running)) {
        int closing = s->closing;
        pthread_mutex_unlock(&s->mu);
        free(j->seq);
        free(j);
        return k3c_errf(err, K3C_ENOMEM, closing ? "scheduler: shutting down" : "scheduler: queue full (%d waiting)",
                        s->queue_max);
    }
    if (s->tail)
        s->tail->next = j;
    else
        s->head = j;
    s->tail = j;
    s->n_queued++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    *job = j;
    return 0;
}

void k3c_sched_cancel(k3c_sched_job *j) {
    k3c_sched *s = j->s;
    atomic_store(&j->cancelled, 1);
    pthread_mutex_lock(&s->mu);
    int unlinked = 0;
    if (j->queued)
        for (k3c_sched_job **pp = &s->head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->next)
            if (*pp == j) {
                *pp = j->next;
                if (s->tail == j) s->tail = prev;
                j->queued = 0;
                s->n_queued--;
                unlinked = 1;
                break;
            }
    pthread_mutex_unlock(&s->mu);
    if (unlinked) {
        j->sink.on_done(j->sink.ctx, K3C_SCHED_FINISH_CANCELLED, 0, NULL);
        job_unref(j);
    }
}

void k3c_sched_release(k3c_sched_job *j) {
    if (j) job_unref(j);
}

void k3c_sched_load(k3c_sched *s, int *queued, int *running) {
    pthread_mutex_lock(&s->mu);
    *queued = s->n_queued;
    *running = s->n_running;
    pthread_mutex_unlock(&s->mu);
}
