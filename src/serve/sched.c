/* sched.c — the scheduler of sched.h over the batched inference engine (docs/ENGINE.md): one
 * engine thread admits queued jobs into the engine as slots free up and steps every active sequence together
 * (continuous batching), routing each sequence's events to its job's sink. */
#include "serve/sched.h"

#include "serve/weights.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct k3c_sched_job {
    k3c_sched *s;
    k3c_sched_req req; /* req.prompt points at prompt, req.embeds / embed_pos at emb / emb_pos */
    int32_t *prompt, *emb_pos;
    float *emb;
    k3c_sched_sink sink;
    int refs; /* the caller's handle + the scheduler's */
    atomic_int cancelled;
    int queued;
    double t_submit, t_admit; /* k3c_now() when queued and when it took a slot */
    int64_t seq, n_gen;       /* the engine's id while in a slot */
    k3c_sched_job *next;
};

struct k3c_sched {
    k3c_engine *e; /* touched by the engine thread alone */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    k3c_sched_job *head, *tail; /* waiting for a slot */
    k3c_sched_job **running;    /* one entry per slot (NULL when free); only the engine thread writes it */
    k3c_engine_event *ev;
    int n_queued, n_running, queue_max, slots, closing, started;
    int64_t max_ctx, hidden;
    k3c_sched_stats stats; /* steps, step_seqs, batch_max (the gauges are n_queued / n_running) */
    pthread_t thread;
};

void k3c_gen_params_default(k3c_gen_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1;
    p->top_p = 1;
    p->repetition_penalty = 1;
}

const char *k3c_sched_finish_name(k3c_sched_finish f) {
    static const char *const names[] = {"stop", "length", "cancelled", "error", "timeout", "queue_timeout"};
    return f >= K3C_SCHED_FINISH_STOP && f <= K3C_SCHED_FINISH_QUEUE_TIMEOUT ? names[f] : "error";
}

static void job_free(k3c_sched_job *j) {
    free(j->prompt);
    free(j->emb);
    free(j->emb_pos);
    free(j);
}

static void job_unref(k3c_sched_job *j) {
    k3c_sched *s = j->s;
    pthread_mutex_lock(&s->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&s->mu);
    if (last) job_free(j);
}

static k3c_request engine_request(const k3c_sched_req *q) {
    const k3c_gen_params *p = &q->params;
    k3c_request r = {.sampler = {.temperature = p->temperature,
                                 .top_p = p->top_p,
                                 .seed = p->seed,
                                 .top_k = p->top_k,
                                 .min_p = p->min_p,
                                 .repetition_penalty = p->repetition_penalty,
                                 .presence_penalty = p->presence_penalty,
                                 .frequency_penalty = p->frequency_penalty,
                                 .logprobs = p->logprobs ? p->top_logprobs : 0},
                     .max_new = q->max_new,
                     .n_stop = q->n_stop_ids,
                     .n_embeds = q->n_embeds,
                     .embed_pos = q->embed_pos,
                     .embeds = q->embeds};
    memcpy(r.stop_ids, q->stop_ids, sizeof(int32_t) * (size_t)q->n_stop_ids);
    return r;
}

/* Frees slot i (engine thread, mu held) and reports the job's end outside the lock. */
static void finish_slot(k3c_sched *s, int i, k3c_sched_finish why, const k3c_err *err) {
    k3c_sched_job *j = s->running[i];
    s->running[i] = NULL; /* free before on_done: a caller may submit its next request from there on */
    s->n_running--;
    pthread_mutex_unlock(&s->mu);
    j->sink.on_done(j->sink.ctx, why, j->n_gen, err);
    job_unref(j);
    pthread_mutex_lock(&s->mu);
}

/* Takes queued jobs into free slots (mu held; on_done of a job the engine refuses runs outside it). */
static void admit(k3c_sched *s) {
    for (int i = 0; i < s->slots && s->head; i++) {
        if (s->running[i]) continue;
        k3c_sched_job *j = s->head;
        s->head = j->next;
        if (!s->head) s->tail = NULL;
        j->queued = 0;
        s->n_queued--;
        s->running[i] = j;
        s->n_running++;
        j->t_admit = k3c_now();
        if (s->closing) atomic_store(&j->cancelled, 1);
        k3c_err err = {0};
        k3c_request r = engine_request(&j->req);
        if (atomic_load(&j->cancelled))
            finish_slot(s, i, K3C_SCHED_FINISH_CANCELLED, NULL);
        else if (j->req.max_new == 0)
            finish_slot(s, i, K3C_SCHED_FINISH_LENGTH, NULL);
        else if (k3c_engine_submit(s->e, j->prompt, j->req.n_prompt, &r, &j->seq, &err))
            finish_slot(s, i, K3C_SCHED_FINISH_ERROR, &err);
    }
}

/* Ends the sequences whose job was cancelled (mu held). */
static void drop_cancelled(k3c_sched *s) {
    for (int i = 0; i < s->slots; i++)
        if (s->running[i] && atomic_load(&s->running[i]->cancelled)) {
            k3c_engine_cancel(s->e, s->running[i]->seq, NULL);
            finish_slot(s, i, K3C_SCHED_FINISH_CANCELLED, NULL);
        }
}

/* Ends the jobs past their time limits (mu held): running ones over max_gen_s, queued ones over max_queue_s. */
static void expire(k3c_sched *s) {
    const double now = k3c_now();
    for (int i = 0; i < s->slots; i++) {
        const k3c_sched_job *j = s->running[i];
        if (j && j->req.max_gen_s > 0 && now - j->t_admit > j->req.max_gen_s) {
            k3c_engine_cancel(s->e, j->seq, NULL);
            finish_slot(s, i, K3C_SCHED_FINISH_TIMEOUT, NULL);
        }
    }
    for (k3c_sched_job **pp = &s->head, *prev = NULL; *pp;) {
        k3c_sched_job *j = *pp;
        if (!(j->req.max_queue_s > 0 && now - j->t_submit > j->req.max_queue_s)) {
            prev = j, pp = &j->next;
            continue;
        }
        *pp = j->next;
        if (s->tail == j) s->tail = prev;
        j->queued = 0;
        s->n_queued--;
        pthread_mutex_unlock(&s->mu);
        j->sink.on_done(j->sink.ctx, K3C_SCHED_FINISH_QUEUE_TIMEOUT, 0, NULL);
        job_unref(j);
        pthread_mutex_lock(&s->mu);
        pp = &s->head, prev = NULL; /* the queue may have changed meanwhile */
    }
}

static int slot_of(const k3c_sched *s, int64_t seq) {
    for (int i = 0; i < s->slots; i++)
        if (s->running[i] && s->running[i]->seq == seq) return i;
    return -1;
}

static int is_stop_id(const k3c_sched_req *r, int32_t id) {
    for (int k = 0; k < r->n_stop_ids; k++)
        if (r->stop_ids[k] == id) return 1;
    return 0;
}

/* One engine step over every active sequence, its events routed to their jobs (mu not held: sinks run unlocked, and
 * only this thread touches the engine and running[]'s occupants). */
static void step(k3c_sched *s) {
    k3c_err err = {0};
    int n_ev = 0;
    if (k3c_engine_step(s->e, s->ev, s->slots, &n_ev, &err)) { /* the engine dropped the step's sequences */
        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < s->slots; i++)
            if (s->running[i]) {
                k3c_engine_cancel(s->e, s->running[i]->seq, NULL);
                finish_slot(s, i, K3C_SCHED_FINISH_ERROR, &err);
            }
        pthread_mutex_unlock(&s->mu);
        return;
    }
    for (int k = 0; k < n_ev; k++) {
        const k3c_engine_event *ev = &s->ev[k];
        int i = slot_of(s, ev->seq);
        if (i < 0) continue;
        k3c_sched_job *j = s->running[i];
        const int is_stop = is_stop_id(&j->req, ev->token.id);
        j->n_gen++;
        const int ended = atomic_load(&j->cancelled) ? 0 : j->sink.on_token(j->sink.ctx, &ev->token, is_stop);
        pthread_mutex_lock(&s->mu);
        if (atomic_load(&j->cancelled)) {
            if (!ev->finish) k3c_engine_cancel(s->e, ev->seq, NULL);
            finish_slot(s, i, K3C_SCHED_FINISH_CANCELLED, NULL);
        } else if (ev->finish || ended) {
            if (!ev->finish) k3c_engine_cancel(s->e, ev->seq, NULL);
            finish_slot(s, i,
                        ev->finish == K3C_FINISH_LENGTH && !ended ? K3C_SCHED_FINISH_LENGTH : K3C_SCHED_FINISH_STOP,
                        NULL);
        }
        pthread_mutex_unlock(&s->mu);
    }
}

static void *engine_thread(void *arg) {
    k3c_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        drop_cancelled(s);
        expire(s);
        admit(s);
        if (s->n_running == 0) {
            if (s->closing && !s->head) break;
            if (!s->head) pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        s->stats.steps++;
        s->stats.step_seqs += (uint64_t)s->n_running;
        if (s->n_running > s->stats.batch_max) s->stats.batch_max = s->n_running;
        pthread_mutex_unlock(&s->mu);
        step(s);
        pthread_mutex_lock(&s->mu);
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
    if (!s || !(s->running = calloc((size_t)slots, sizeof *s->running)) ||
        !(s->ev = calloc((size_t)slots, sizeof *s->ev))) {
        if (s) free(s->running);
        free(s);
        return k3c_errf(err, K3C_ENOMEM, "scheduler: out of memory");
    }
    s->slots = slots;
    s->queue_max = queue_max;
    const k3c_config *c = &w->cfg;
    s->hidden = c->hidden_size;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->max_ctx =
        c->max_positions > 0 && c->max_positions < K3C_SCHED_MAX_CTX ? c->max_positions : K3C_SCHED_MAX_CTX;
    k3c_engine_opts eo = {.max_seqs = slots, .max_ctx = s->max_ctx};
    int rc = k3c_engine_open_weights(w, &eo, &s->e, err);
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
    for (int i = 0; i < s->slots; i++)
        if (s->running[i]) atomic_store(&s->running[i]->cancelled, 1);
    for (k3c_sched_job *j = s->head; j; j = j->next) atomic_store(&j->cancelled, 1);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void k3c_sched_free(k3c_sched *s) {
    if (!s) return;
    k3c_sched_close(s);
    if (s->started) pthread_join(s->thread, NULL);
    if (s->e) k3c_engine_close(s->e);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->running);
    free(s->ev);
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
    k3c_request er = engine_request(r);
    int rc = k3c_sampler_check(&er.sampler, err);
    if (rc) return rc;
    k3c_sched_job *j = calloc(1, sizeof *j);
    const size_t ne = (size_t)(r->n_embeds > 0 ? r->n_embeds : 0), D = (size_t)s->hidden;
    if (!j || !(j->prompt = malloc(sizeof(int32_t) * (size_t)r->n_prompt)) ||
        (ne && (!(j->emb = malloc(sizeof(float) * ne * D)) || !(j->emb_pos = malloc(sizeof(int32_t) * ne))))) {
        if (j) job_free(j);
        return k3c_errf(err, K3C_ENOMEM, "scheduler: out of memory");
    }
    memcpy(j->prompt, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    if (ne) memcpy(j->emb, r->embeds, sizeof(float) * ne * D), memcpy(j->emb_pos, r->embed_pos, sizeof(int32_t) * ne);
    j->s = s;
    j->req = *r;
    j->req.prompt = j->prompt;
    j->req.embeds = j->emb, j->req.embed_pos = j->emb_pos;
    j->sink = *sink;
    j->refs = 2;
    j->queued = 1;
    j->t_submit = k3c_now();
    pthread_mutex_lock(&s->mu);
    if (s->closing || s->n_queued >= s->queue_max + (s->slots - s->n_running)) {
        int closing = s->closing;
        pthread_mutex_unlock(&s->mu);
        job_free(j);
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
    atomic_store(&j->cancelled, 1); /* a running job: the engine thread drops it before its next step */
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

void k3c_sched_get_stats(k3c_sched *s, k3c_sched_stats *st) {
    pthread_mutex_lock(&s->mu);
    *st = s->stats;
    st->queued = s->n_queued;
    st->running = s->n_running;
    pthread_mutex_unlock(&s->mu);
}
