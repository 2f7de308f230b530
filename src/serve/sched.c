/* sched.c — the scheduler of sched.h: one engine thread steps the inference engine (its queue, slots, time limits and
 * stop ids are the engine's) and hands each event to its job's mailbox, which the job's consumer empties on its own
 * thread (docs/SERVING.md §4). */
#include "serve/sched.h"

#include "base/check.h"
#include "serve/weights.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct k3c_sched_job {
    k3c_sched *s;
    atomic_int refs; /* the caller's handle + the scheduler's while the sequence is in the engine */
    int64_t seq;     /* the engine's id */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    k3c_engine_event *ev; /* the mailbox: ev[head .. head+n) not yet taken, then end once ended */
    int head, n, cap, ended, end_taken;
    k3c_engine_event end;
    k3c_sched_wake wake;
    void *wake_ctx;
    char error[sizeof(((k3c_err *)0)->msg)];
};

struct k3c_sched {
    atomic_int refs; /* the owner's + one per job, so a job outliving k3c_sched_free can still lock mu */
    k3c_engine *e;
    pthread_mutex_t mu; /* jobs[], closing; taken before a job's mu and the engine's */
    pthread_cond_t cv;
    k3c_sched_job **jobs; /* the jobs whose sequence is in the engine */
    int n_jobs, cap_jobs, closing, started;
    k3c_engine_event *ev; /* the engine thread's */
    int cap_ev;
    int64_t max_ctx;
    pthread_t thread;
};

static void sched_unref(k3c_sched *s) {
    if (atomic_fetch_sub(&s->refs, 1) != 1) return;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->jobs);
    free(s->ev);
    free(s);
}

static void job_unref(k3c_sched_job *j) {
    if (atomic_fetch_sub(&j->refs, 1) != 1) return;
    k3c_sched *s = j->s;
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j->ev);
    free(j);
    sched_unref(s);
}

/* Room for one more event in the mailbox (j->mu held). */
static int room(k3c_sched_job *j) {
    if (j->head > 0 && j->head + j->n == j->cap) {
        memmove(j->ev, j->ev + j->head, sizeof *j->ev * (size_t)j->n);
        j->head = 0;
    }
    if (j->head + j->n < j->cap) return 1;
    const int cap = j->cap ? 2 * j->cap : 16;
    k3c_engine_event *t = realloc(j->ev, sizeof *t * (size_t)cap);
    if (!t) return 0;
    j->ev = t, j->cap = cap;
    return 1;
}

/* Puts ev in j's mailbox (the last event in j->end, which needs no memory) and wakes its consumer. An event after the
 * last one is dropped (a sequence cancelled while a step ran it); one that finds no memory ends the job instead. */
static void post(k3c_sched_job *j, const k3c_engine_event *ev, const char *error) {
    pthread_mutex_lock(&j->mu);
    if (!j->ended) {
        if (ev->finish != K3C_FINISH_NONE || !room(j)) {
            j->ended = 1;
            j->end = *ev;
            if (ev->finish == K3C_FINISH_NONE) {
                j->end = (k3c_engine_event){.seq = j->seq, .token.id = -1, .finish = K3C_FINISH_ERROR};
                error = "scheduler: out of memory";
            }
            if (error) snprintf(j->error, sizeof j->error, "%s", error);
        } else {
            j->ev[j->head + j->n++] = *ev;
        }
        pthread_cond_broadcast(&j->cv);
        if (j->wake) {
            k3c_sched_wake fn = j->wake;
            j->wake = NULL;
            fn(j->wake_ctx);
        }
    }
    pthread_mutex_unlock(&j->mu);
}

static void post_end(k3c_sched_job *j, k3c_finish why) {
    k3c_engine_event ev = {.seq = j->seq, .token.id = -1, .finish = why};
    post(j, &ev, NULL);
}

static int find(const k3c_sched *s, int64_t seq) {
    for (int i = 0; i < s->n_jobs; i++)
        if (s->jobs[i]->seq == seq) return i;
    return -1;
}

/* Takes job i out of the table (mu held): the scheduler's reference goes. */
static void drop(k3c_sched *s, int i) {
    k3c_sched_job *j = s->jobs[i];
    s->jobs[i] = s->jobs[--s->n_jobs];
    job_unref(j);
}

/* Ends every job (mu held): their sequences leave the engine. */
static void cancel_all(k3c_sched *s) {
    while (s->n_jobs > 0) {
        k3c_sched_job *j = s->jobs[s->n_jobs - 1];
        k3c_engine_cancel(s->e, j->seq, NULL);
        post_end(j, K3C_FINISH_CANCELLED);
        drop(s, s->n_jobs - 1);
    }
}

static void *engine_thread(void *arg) {
    k3c_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (s->closing) cancel_all(s);
        if (s->n_jobs == 0) {
            if (s->closing) break;
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        k3c_err err = {0};
        int n_ev = 0;
        k3c_engine_step(s->e, s->ev, s->cap_ev, &n_ev, &err); /* a failure ends its sequences by ERROR events */
        pthread_mutex_lock(&s->mu);
        for (int k = 0; k < n_ev; k++) {
            const int i = find(s, s->ev[k].seq);
            if (i < 0) continue; /* cancelled meanwhile */
            post(s->jobs[i], &s->ev[k], s->ev[k].finish == K3C_FINISH_ERROR ? err.msg : NULL);
            if (s->ev[k].finish != K3C_FINISH_NONE) drop(s, i);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int k3c_sched_new(const k3c_weights *w, int slots, int queue_max, k3c_sched **out, k3c_err *err) {
    *out = NULL;
    if (!w || slots < 1 || slots > 256 || queue_max < 0)
        return k3c_errf(err, K3C_EINVAL, "scheduler: need a model, 1..256 slots and a queue bound >= 0 (got %d, %d)",
                        slots, queue_max);
    k3c_sched *s = calloc(1, sizeof *s);
    if (!s) return k3c_errf(err, K3C_ENOMEM, "scheduler: out of memory");
    atomic_init(&s->refs, 1);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->cap_ev = 2 * slots; /* a step's sampled tokens and time-outs, and as many waiting ones past their limit */
    const k3c_config *c = &w->cfg;
    s->max_ctx =
        c->max_positions > 0 && c->max_positions < K3C_SCHED_MAX_CTX ? c->max_positions : K3C_SCHED_MAX_CTX;
    k3c_engine_opts eo = {.max_seqs = slots, .max_ctx = s->max_ctx, .max_queue = queue_max > 0 ? queue_max : -1};
    int rc = !(s->ev = malloc(sizeof *s->ev * (size_t)s->cap_ev)) ? k3c_errf(err, K3C_ENOMEM, "scheduler: out of memory")
                                                                  : k3c_engine_open_weights(w, &eo, &s->e, err);
    if (!rc && pthread_create(&s->thread, NULL, engine_thread, s))
        rc = k3c_errf(err, K3C_ENOMEM, "scheduler: cannot start the engine thread");
    s->started = !rc;
    if (rc) {
        k3c_sched_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

int64_t k3c_sched_max_ctx(const k3c_sched *s) { return s->max_ctx; }

void k3c_sched_close(k3c_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->closing = 1;
    if (!s->started) cancel_all(s);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void k3c_sched_free(k3c_sched *s) {
    if (!s) return;
    k3c_sched_close(s);
    if (s->started) pthread_join(s->thread, NULL);
    if (s->e) k3c_engine_close(s->e);
    s->e = NULL;
    sched_unref(s);
}

static k3c_sched_job *job_new(k3c_sched *s) {
    k3c_sched_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->s = s;
    atomic_init(&j->refs, 1);
    atomic_fetch_add(&s->refs, 1);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    return j;
}

/* Queues one job (mu held). */
static int submit_locked(k3c_sched *s, const int32_t *prompt, int64_t n, const k3c_request *r, k3c_sched_job *j,
                         k3c_err *err) {
    if (s->closing) return k3c_errf(err, K3C_ENOMEM, "scheduler: shutting down");
    if (r->max_new == 0) {
        post_end(j, K3C_FINISH_LENGTH);
        return K3C_OK;
    }
    if (s->n_jobs == s->cap_jobs) {
        const int cap = s->cap_jobs ? 2 * s->cap_jobs : 16;
        k3c_sched_job **t = realloc(s->jobs, sizeof *t * (size_t)cap);
        if (!t) return k3c_errf(err, K3C_ENOMEM, "scheduler: out of memory");
        s->jobs = t, s->cap_jobs = cap;
    }
    CHECK_RC(k3c_engine_submit(s->e, prompt, n, r, &j->seq, err));
    atomic_fetch_add(&j->refs, 1);
    s->jobs[s->n_jobs++] = j;
    return K3C_OK;
}

int k3c_sched_submit_all(k3c_sched *s, int count, const int32_t *const *prompts, const int64_t *n,
                         const k3c_request *r, k3c_sched_job **jobs, k3c_err *err) {
    for (int i = 0; i < count; i++) jobs[i] = NULL;
    for (int i = 0; i < count; i++)
        if (!prompts[i] || n[i] < 1 || r[i].max_new < 0)
            return k3c_errf(err, K3C_EINVAL,
                            "scheduler: request %d needs a prompt of at least one id and max_new >= 0", i);
    int rc = K3C_OK, i = 0;
    for (; !rc && i < count; i++)
        if (!(jobs[i] = job_new(s))) rc = k3c_errf(err, K3C_ENOMEM, "scheduler: out of memory");
    pthread_mutex_lock(&s->mu);
    for (i = 0; !rc && i < count; i++) rc = submit_locked(s, prompts[i], n[i], &r[i], jobs[i], err);
    if (rc) /* all or none: the ones queued leave again */
        for (int k = 0; k < i - 1; k++) {
            const int at = find(s, jobs[k]->seq);
            if (at >= 0 && s->jobs[at] == jobs[k]) {
                k3c_engine_cancel(s->e, jobs[k]->seq, NULL);
                drop(s, at);
            }
        }
    else
        pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (rc) {
        for (int k = 0; k < count; k++) {
            if (jobs[k]) job_unref(jobs[k]);
            jobs[k] = NULL;
        }
        if (rc != K3C_ENOMEM) k3c_err_wrap(err, "scheduler");
        return rc;
    }
    return K3C_OK;
}

int k3c_sched_submit(k3c_sched *s, const int32_t *prompt, int64_t n, const k3c_request *r, k3c_sched_job **job,
                     k3c_err *err) {
    return k3c_sched_submit_all(s, 1, &prompt, &n, r, job, err);
}

/* Takes the next event (mu held). */
static int take(k3c_sched_job *j, k3c_engine_event *ev) {
    if (j->n > 0) {
        *ev = j->ev[j->head++];
        j->n--;
        return 1;
    }
    if (!j->ended || j->end_taken) return 0;
    *ev = j->end;
    j->end_taken = 1;
    return 1;
}

int k3c_sched_next(k3c_sched_job *j, k3c_engine_event *ev, k3c_sched_wake wake, void *ctx) {
    pthread_mutex_lock(&j->mu);
    int got = take(j, ev);
    if (!got && !j->ended && wake) j->wake = wake, j->wake_ctx = ctx;
    pthread_mutex_unlock(&j->mu);
    return got;
}

void k3c_sched_wait(k3c_sched_job *j, k3c_engine_event *ev) {
    pthread_mutex_lock(&j->mu);
    while (!take(j, ev)) {
        if (j->end_taken) { /* asked again after the last event: the last one again */
            *ev = j->end;
            break;
        }
        pthread_cond_wait(&j->cv, &j->mu);
    }
    pthread_mutex_unlock(&j->mu);
}

void k3c_sched_disarm(k3c_sched_job *j) {
    pthread_mutex_lock(&j->mu);
    j->wake = NULL;
    pthread_mutex_unlock(&j->mu);
}

const char *k3c_sched_error(const k3c_sched_job *j) { return j->error; }

void k3c_sched_cancel(k3c_sched_job *j) {
    pthread_mutex_lock(&j->mu);
    const int ended = j->ended;
    pthread_mutex_unlock(&j->mu);
    if (ended) return; /* every job has ended once k3c_sched_free runs: j->s is not touched after it */
    k3c_sched *s = j->s;
    pthread_mutex_lock(&s->mu);
    const int i = find(s, j->seq);
    if (i >= 0 && s->jobs[i] == j) {
        k3c_engine_cancel(s->e, j->seq, NULL);
        post_end(j, K3C_FINISH_CANCELLED);
        drop(s, i);
    }
    pthread_mutex_unlock(&s->mu);
}

void k3c_sched_release(k3c_sched_job *j) {
    if (j) job_unref(j);
}

void k3c_sched_get_stats(k3c_sched *s, k3c_engine_stats *st) { k3c_engine_get_stats(s->e, st); }
