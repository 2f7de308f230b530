/* engine.c — the inference engine's scheduler: the one queue of submitted prompts (any thread may submit or cancel
 * while one steps), max_seqs slots with their decode state, time limits, one batched forward per step (prompt chunks
 * and decode tokens of every active sequence), per-sequence sampling and finishing, and the prefix cache of state
 * snapshots (the KDA state cannot be rewound, so a prompt resumes only from a snapshot taken at a prompt end or every
 * snapshot_every tokens). docs/ENGINE.md. */
#include "base/check.h"
#include "serve/engine.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t id;
    int32_t *toks; /* prompt then output ids */
    int64_t n_tok, n_prompt, n_out;
    k3c_request req; /* req.embeds / embed_pos point at emb / emb_pos */
    float *emb;      /* [n_emb, D] image rows of the prompt, at positions emb_pos (ascending) */
    int32_t *emb_pos;
    int64_t n_emb;
    double t_submit, t_admit; /* k3c_now() when queued and when it took a slot */
} eng_seq;

typedef struct {
    int used, fresh; /* fresh: admitted at this step, its state not yet reset */
    int64_t lead;    /* the sequence with the same prompt, still in its prefill, whose state at the prompt's end this
                        one takes instead of running the prompt itself (0: none) */
    eng_seq s;
    k3c_eng_state st; /* allocated once per slot, max_ctx tokens */
} eng_slot;

typedef struct {
    int32_t *ids;
    k3c_eng_state st; /* the state after ids[0..st.pos) */
    uint64_t used;    /* LRU clock */
} eng_snap;

struct k3c_engine {
    k3c_weights *own; /* the views built over a model (k3c_engine_open), freed with the engine */
    const k3c_weights *w;
    k3c_engine_opts o;
    k3c_eng_dims d;
    k3c_eng_ws *ws;
    eng_slot *slot; /* touched by the stepping thread alone */
    /* Under mu, shared with submitting and cancelling threads: the FIFO of waiting sequences, the id each slot runs
     * (0: free, or cancelled), the cancelled ids still in a slot, the id counter and the step counters. */
    pthread_mutex_t mu;
    eng_seq *queue;
    int n_queue, cap_queue;
    int64_t *slot_id, *cancelled;
    int n_cancelled;
    int64_t next_id;
    int32_t *ids;
    k3c_eng_seg *segs;
    int64_t *out_rows;
    const float **row_emb; /* per row of the step: the image embedding replacing its token's, or NULL */
    int *seg_slot, *out_slot;
    float *logits; /* [max_seqs, V] of the last step */
    void *sample_ws;
    eng_snap *snap;
    int n_snap;
    uint64_t clock;
    int64_t prefix_hits, prefix_tokens_reused; /* the stepping thread's; copied into stats under mu */
    int64_t prefills_shared;                   /* sequences that took a lead's prompt-end state */
    int ev_base;                               /* events of the last step before its first sampled one */
    int *ev_row;                               /* per sampled event of the last step: its logits row */
    int64_t rows;                              /* the step's rows at most */
    k3c_engine_stats stats;
};

static int opts_fill(const k3c_config *c, const k3c_engine_opts *in, k3c_engine_opts *o, k3c_err *err) {
    *o = in ? *in : (k3c_engine_opts){0};
    if (o->max_seqs == 0) o->max_seqs = 8;
    if (o->max_ctx == 0) o->max_ctx = c->max_positions > 0 && c->max_positions < 4096 ? c->max_positions : 4096;
    if (o->prefill_chunk == 0) o->prefill_chunk = 256;
    if (o->max_snapshots == 0) o->max_snapshots = 64;
    if (o->max_seqs < 1 || o->max_ctx < 2 || o->prefill_chunk < 1 || o->snapshot_every < 0 || o->max_snapshots < 1 ||
        o->threads < 0)
        return k3c_errf(err, K3C_EINVAL,
                        "engine: needs max_seqs >= 1, max_ctx >= 2, prefill_chunk >= 1, snapshot_every >= 0, "
                        "max_snapshots >= 1, threads >= 0");
    return K3C_OK;
}

int k3c_engine_open_weights(const k3c_weights *w, const k3c_engine_opts *opts, k3c_engine **out, k3c_err *err) {
    *out = NULL;
    k3c_engine *e = calloc(1, sizeof *e);
    if (!e) return k3c_errf(err, K3C_ENOMEM, "engine: out of memory");
    int rc = opts_fill(&w->cfg, opts, &e->o, err);
    if (rc) {
        free(e);
        return rc;
    }
    if (e->o.threads > 0) k3c_set_num_threads(e->o.threads);
    e->w = w;
    k3c_eng_dims_of(&w->cfg, &e->d);
    e->d.be = w->be; /* states live beside the weights */
    const int S = e->o.max_seqs;
    const int64_t V = e->d.V, rows = e->o.prefill_chunk > S ? e->o.prefill_chunk : S;
    e->rows = rows;
    e->next_id = 1;
    pthread_mutex_init(&e->mu, NULL);
    e->slot = calloc((size_t)S, sizeof *e->slot);
    e->slot_id = calloc((size_t)S, sizeof *e->slot_id);
    e->cancelled = malloc(sizeof(int64_t) * (size_t)S);
    e->ids = malloc(sizeof(int32_t) * (size_t)rows);
    e->segs = malloc(sizeof(k3c_eng_seg) * (size_t)S);
    e->out_rows = malloc(sizeof(int64_t) * (size_t)S);
    e->row_emb = malloc(sizeof(const float *) * (size_t)rows);
    e->seg_slot = malloc(sizeof(int) * (size_t)S);
    e->out_slot = malloc(sizeof(int) * (size_t)S);
    e->ev_row = malloc(sizeof(int) * (size_t)S);
    e->logits = malloc(sizeof(float) * (size_t)(S * V));
    e->sample_ws = malloc(k3c_sample_workspace(V));
    e->snap = calloc((size_t)e->o.max_snapshots, sizeof *e->snap);
    if (!e->slot || !e->slot_id || !e->cancelled || !e->ids || !e->segs || !e->out_rows || !e->row_emb ||
        !e->seg_slot || !e->out_slot || !e->ev_row || !e->logits || !e->sample_ws || !e->snap)
        rc = k3c_errf(err, K3C_ENOMEM, "engine: out of memory");
    for (int i = 0; !rc && i < S; i++) rc = k3c_eng_state_init(&e->slot[i].st, &e->d, e->o.max_ctx, err);
    if (!rc) rc = k3c_eng_ws_init(w, rows, S, &e->ws, err);
    if (rc) {
        k3c_engine_close(e);
        return rc;
    }
    e->stats.kda_state_bytes = k3c_eng_state_bytes(&e->d, 0);
    e->stats.latent_bytes_per_tok = k3c_eng_state_bytes(&e->d, 1) - e->stats.kda_state_bytes;
    e->stats.state_bytes = k3c_eng_state_bytes(&e->d, e->o.max_ctx);
    *out = e;
    return K3C_OK;
}

int k3c_engine_open(const k3c_model *m, const k3c_engine_opts *o, k3c_engine **out, k3c_err *err) {
    *out = NULL;
    k3c_weights *w = calloc(1, sizeof *w);
    if (!w) return k3c_errf(err, K3C_ENOMEM, "engine: out of memory");
    int rc = k3c_weights_from_model(m, w, err);
    if (!rc) rc = k3c_engine_open_weights(w, o, out, err);
    if (rc) {
        k3c_weights_free(w); /* a no-op when k3c_weights_from_model failed (it cleans up itself) */
        free(w);
        return rc;
    }
    (*out)->own = w;
    return K3C_OK;
}

static void seq_free(eng_seq *s) {
    if (s->req.constraint && s->req.constraint->release) s->req.constraint->release(s->req.constraint->ctx);
    free(s->toks);
    free(s->emb);
    free(s->emb_pos);
    memset(s, 0, sizeof *s);
}

static void snap_free(eng_snap *p) {
    free(p->ids);
    k3c_eng_state_free(&p->st);
    memset(p, 0, sizeof *p);
}

void k3c_engine_close(k3c_engine *e) {
    if (!e) return;
    for (int i = 0; e->slot && i < e->o.max_seqs; i++) {
        seq_free(&e->slot[i].s);
        k3c_eng_state_free(&e->slot[i].st);
    }
    for (int i = 0; i < e->n_queue; i++) seq_free(&e->queue[i]);
    for (int i = 0; e->snap && i < e->n_snap; i++) snap_free(&e->snap[i]);
    k3c_eng_ws_free(e->ws);
    if (e->own) k3c_weights_free(e->own);
    free(e->own);
    free(e->slot), free(e->queue), free(e->ids), free(e->segs), free(e->out_rows), free(e->row_emb), free(e->seg_slot);
    free(e->out_slot), free(e->ev_row), free(e->logits), free(e->sample_ws), free(e->snap), free(e->slot_id);
    free(e->cancelled);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

/* Overrides: positions strictly ascending inside the prompt. */
static int embeds_check(const k3c_request *r, int64_t n, k3c_err *err) {
    if (r->n_embeds == 0) return K3C_OK;
    if (r->n_embeds < 0 || r->n_embeds > n || !r->embeds || !r->embed_pos)
        return k3c_errf(err, K3C_EINVAL, "engine: %lld embedding overrides for a prompt of %lld ids",
                        (long long)r->n_embeds, (long long)n);
    for (int64_t i = 0; i < r->n_embeds; i++)
        if (r->embed_pos[i] < 0 || r->embed_pos[i] >= n || (i && r->embed_pos[i] <= r->embed_pos[i - 1]))
            return k3c_errf(err, K3C_EINVAL,
                            "engine: embedding override %lld at position %d: positions must ascend inside the prompt",
                            (long long)i, r->embed_pos[i]);
    return K3C_OK;
}

/* Slots in use (mu held). */
static int n_running(const k3c_engine *e) {
    int n = 0;
    for (int i = 0; i < e->o.max_seqs; i++) n += e->slot_id[i] != 0;
    return n;
}

/* Appends s to the queue with the next id (mu held): K3C_ENOMEM when the queue is at its bound. */
static int queue_push(k3c_engine *e, eng_seq *s, k3c_err *err) {
    const int bound = e->o.max_queue < 0 ? 0 : e->o.max_queue;
    if (e->o.max_queue != 0 && e->n_queue >= bound + (e->o.max_seqs - n_running(e)))
        return k3c_errf(err, K3C_ENOMEM, "engine: queue full (%d waiting)", e->n_queue);
    if (e->n_queue == e->cap_queue) {
        int cap = e->cap_queue ? 2 * e->cap_queue : 16;
        eng_seq *q = realloc(e->queue, sizeof *q * (size_t)cap);
        if (!q) return k3c_errf(err, K3C_ENOMEM, "engine: out of memory");
        e->queue = q, e->cap_queue = cap;
    }
    s->id = e->next_id++;
    e->queue[e->n_queue++] = *s;
    return K3C_OK;
}

static void queue_remove(k3c_engine *e, int i) {
    memmove(e->queue + i, e->queue + i + 1, sizeof *e->queue * (size_t)(e->n_queue - i - 1));
    e->n_queue--;
}

int k3c_engine_submit(k3c_engine *e, const int32_t *prompt, int64_t n, const k3c_request *r, int64_t *seq,
                      k3c_err *err) {
    if (!prompt || !r || n < 1 || n >= e->o.max_ctx)
        return k3c_errf(err, K3C_EINVAL, "engine: a prompt needs 1 .. %lld ids (max_ctx %lld minus one), got %lld",
                        (long long)(e->o.max_ctx - 1), (long long)e->o.max_ctx, (long long)n);
    CHECK_RC(k3c_sampler_check(&r->sampler, err));
    if (r->max_new < 1 || r->n_stop < 0 || r->n_stop > K3C_MAX_STOP_IDS)
        return k3c_errf(err, K3C_EINVAL, "engine: needs max_new >= 1 (got %lld) and 0..%d stop ids (got %d)",
                        (long long)r->max_new, K3C_MAX_STOP_IDS, r->n_stop);
    for (int64_t i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= e->d.V)
            return k3c_errf(err, K3C_EINVAL, "engine: prompt id %d at %lld is outside [0, %lld)", prompt[i],
                            (long long)i, (long long)e->d.V);
    CHECK_RC(embeds_check(r, n, err));
    if (r->max_queue_s < 0 || r->max_gen_s < 0)
        return k3c_errf(err, K3C_EINVAL, "engine: time limits must be >= 0 (got %g, %g)", r->max_queue_s, r->max_gen_s);
    const int64_t room = n + r->max_new < e->o.max_ctx ? n + r->max_new : e->o.max_ctx;
    eng_seq s = {0, malloc(sizeof(int32_t) * (size_t)room), n, n, 0, *r, NULL, NULL, r->n_embeds, k3c_now(), 0};
    const size_t nb = sizeof(float) * (size_t)(r->n_embeds * e->d.D);
    if (s.n_emb && (s.emb = malloc(nb)) && (s.emb_pos = malloc(sizeof(int32_t) * (size_t)s.n_emb))) {
        memcpy(s.emb, r->embeds, nb);
        memcpy(s.emb_pos, r->embed_pos, sizeof(int32_t) * (size_t)s.n_emb);
    }
    s.req.embeds = s.emb, s.req.embed_pos = s.emb_pos;
    if (!s.toks || (s.n_emb && !s.emb_pos)) {
        seq_free(&s);
        return k3c_errf(err, K3C_ENOMEM, "engine: out of memory");
    }
    memcpy(s.toks, prompt, sizeof(int32_t) * (size_t)n);
    pthread_mutex_lock(&e->mu);
    int rc = queue_push(e, &s, err);
    if (!rc) *seq = s.id;
    pthread_mutex_unlock(&e->mu);
    if (rc) seq_free(&s);
    return rc;
}

/* A sequence in a slot leaves it at the start of the next step: only the stepping thread touches slots. */
int k3c_engine_cancel(k3c_engine *e, int64_t seq, k3c_err *err) {
    int rc = K3C_ENOTFOUND;
    pthread_mutex_lock(&e->mu);
    for (int i = 0; rc && i < e->o.max_seqs; i++)
        if (e->slot_id[i] == seq) {
            e->slot_id[i] = 0;
            e->cancelled[e->n_cancelled++] = seq;
            rc = K3C_OK;
        }
    for (int i = 0; rc && i < e->n_queue; i++)
        if (e->queue[i].id == seq) {
            seq_free(&e->queue[i]);
            queue_remove(e, i);
            rc = K3C_OK;
        }
    pthread_mutex_unlock(&e->mu);
    return rc ? k3c_errf(err, K3C_ENOTFOUND, "engine: no waiting or active sequence %lld", (long long)seq) : K3C_OK;
}

int k3c_engine_pending(const k3c_engine *e) {
    k3c_engine *m = (k3c_engine *)e; /* the lock, not the engine's state, changes */
    pthread_mutex_lock(&m->mu);
    int n = e->n_queue + n_running(e);
    pthread_mutex_unlock(&m->mu);
    return n;
}

void k3c_engine_get_stats(const k3c_engine *e, k3c_engine_stats *s) {
    k3c_engine *m = (k3c_engine *)e;
    pthread_mutex_lock(&m->mu);
    *s = e->stats;
    s->queued = e->n_queue;
    s->running = n_running(e);
    pthread_mutex_unlock(&m->mu);
}

const char *k3c_finish_name(k3c_finish f) {
    static const char *const names[] = {"none", "stop", "length", "timeout", "queue_timeout", "cancelled", "error"};
    return f >= K3C_FINISH_NONE && f <= K3C_FINISH_ERROR ? names[f] : "error";
}

/* ---------------------------------------------------------------- prefix cache */

/* The longest snapshot that is a prefix of toks[0..n) and leaves at least one token to run (the last prompt token's
 * logits are never stored). */
static eng_snap *snap_find(k3c_engine *e, const int32_t *toks, int64_t n) {
    eng_snap *best = NULL;
    for (int i = 0; i < e->n_snap; i++) {
        eng_snap *p = &e->snap[i];
        if (p->st.pos <= n - 1 && (!best || p->st.pos > best->st.pos) &&
            !memcmp(p->ids, toks, sizeof(int32_t) * (size_t)p->st.pos))
            best = p;
    }
    if (best) best->used = ++e->clock;
    return best;
}

/* Keeps the state after toks[0..st->pos) (least recently used snapshot evicted when full). A failed allocation only
 * means no snapshot. */
static void snap_store(k3c_engine *e, const int32_t *toks, const k3c_eng_state *st) {
    const int64_t L = st->pos;
    for (int i = 0; i < e->n_snap; i++)
        if (e->snap[i].st.pos == L && !memcmp(e->snap[i].ids, toks, sizeof(int32_t) * (size_t)L)) {
            e->snap[i].used = ++e->clock;
            return;
        }
    eng_snap *p = &e->snap[e->n_snap];
    if (e->n_snap == e->o.max_snapshots) {
        p = &e->snap[0];
        for (int i = 1; i < e->n_snap; i++)
            if (e->snap[i].used < p->used) p = &e->snap[i];
        snap_free(p);
    } else {
        e->n_snap++;
    }
    if (!(p->ids = malloc(sizeof(int32_t) * (size_t)L)) || k3c_eng_state_init(&p->st, &e->d, L, NULL)) {
        snap_free(p);
        *p = e->snap[--e->n_snap]; /* keep the array dense */
        return;
    }
    memcpy(p->ids, toks, sizeof(int32_t) * (size_t)L);
    if (k3c_eng_state_copy(&p->st, st, &e->d, NULL)) {
        snap_free(p);
        *p = e->snap[--e->n_snap];
        return;
    }
    p->used = ++e->clock;
}

/* ---------------------------------------------------------------- the step */

/* Prompt tokens a snapshot may cover: all of them, or those before the first image row (snapshots are keyed by ids,
 * and every image has the same placeholder ids). */
static int64_t cache_limit(const eng_seq *s) { return s->n_emb ? s->emb_pos[0] : s->n_prompt; }

static void slot_free(k3c_engine *e, int i) {
    seq_free(&e->slot[i].s);
    e->slot[i].used = 0;
}

static void end_event(k3c_engine_event *ev, int64_t seq, k3c_finish why) {
    memset(ev, 0, sizeof *ev);
    ev->seq = seq;
    ev->token.id = -1;
    ev->finish = why;
}

static int queue_expired(const eng_seq *q, double now) {
    return q->req.max_queue_s > 0 && now - q->t_submit > q->req.max_queue_s;
}

/* The start of a step, under mu: cancelled sequences leave their slots, sequences past their time limits end (a slot
 * freed so stays empty this step, so each slot reports one event at most; waiting ones are reported while cap leaves
 * room beyond max_seqs), and the waiting sequences take the free slots. */
static void begin_step(k3c_engine *e, k3c_engine_event *ev, int cap, int *n_ev) {
    const double now = k3c_now();
    const int S = e->o.max_seqs;
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < S; i++) e->slot[i].fresh = 0;
    for (int k = 0; k < e->n_cancelled; k++)
        for (int i = 0; i < S; i++)
            if (e->slot[i].used && e->slot[i].s.id == e->cancelled[k]) slot_free(e, i);
    e->n_cancelled = 0;
    for (int i = 0; i < S; i++) {
        eng_slot *sl = &e->slot[i];
        if (sl->used && sl->s.req.max_gen_s > 0 && now - sl->s.t_admit > sl->s.req.max_gen_s) {
            end_event(&ev[(*n_ev)++], sl->s.id, K3C_FINISH_TIMEOUT);
            e->slot_id[i] = 0;
            slot_free(e, i);
            sl->fresh = -1;
        }
    }
    for (int i = 0; i < e->n_queue && *n_ev < cap - S;)
        if (queue_expired(&e->queue[i], now)) {
            end_event(&ev[(*n_ev)++], e->queue[i].id, K3C_FINISH_QUEUE_TIMEOUT);
            seq_free(&e->queue[i]);
            queue_remove(e, i);
        } else {
            i++;
        }
    int q = 0; /* the first waiting sequence not past its limit (those past it wait to be reported) */
    for (int i = 0; i < S; i++) {
        eng_slot *sl = &e->slot[i];
        while (q < e->n_queue && queue_expired(&e->queue[q], now)) q++;
        if (sl->used || sl->fresh || q == e->n_queue) continue;
        sl->s = e->queue[q];
        queue_remove(e, q);
        sl->used = sl->fresh = 1;
        sl->s.t_admit = now;
        e->slot_id[i] = sl->s.id;
    }
    pthread_mutex_unlock(&e->mu);
}

/* Whether a and b are the same prompt: ids, and image rows at the same positions with the same values. */
static int same_prompt(const eng_seq *a, const eng_seq *b, int64_t D) {
    return a->n_prompt == b->n_prompt && a->n_emb == b->n_emb &&
           !memcmp(a->toks, b->toks, sizeof(int32_t) * (size_t)a->n_prompt) &&
           (!a->n_emb || (!memcmp(a->emb_pos, b->emb_pos, sizeof(int32_t) * (size_t)a->n_emb) &&
                          !memcmp(a->emb, b->emb, sizeof(float) * (size_t)(a->n_emb * D))));
}

/* The slot of slot i's lead while that one is still in its prefill, else -1 (and slot i runs its own prompt). */
static int lead_slot(k3c_engine *e, int i) {
    for (int j = 0; e->slot[i].lead && j < e->o.max_seqs; j++)
        if (j != i && e->slot[j].used && e->slot[j].s.id == e->slot[i].lead &&
            e->slot[j].st.pos < e->slot[j].s.n_prompt)
            return j;
    e->slot[i].lead = 0;
    return -1;
}

/* The admitted sequences start from an empty state. One whose prompt another sequence is still running (the n
 * samples of one request) waits for that prefill and forks from its end; the others resume from the longest snapshot
 * that leaves at least one prompt token to run (its logits give the first sample). */
static int start_fresh(k3c_engine *e, k3c_err *err) {
    for (int i = 0; i < e->o.max_seqs; i++) {
        e->slot[i].lead = e->slot[i].fresh == 1 ? 0 : e->slot[i].lead;
        if (e->slot[i].fresh == 1) CHECK_RC(k3c_eng_state_reset(&e->slot[i].st, &e->d, err));
    }
    for (int i = 0; i < e->o.max_seqs; i++) {
        eng_slot *sl = &e->slot[i];
        if (sl->fresh != 1) continue;
        /* a lead runs its own prompt: a slot admitted before this one, or one already running. A constraint masks the
         * logits row in place, so constrained sequences neither lead nor follow (each runs its own prompt). */
        for (int j = 0; !sl->lead && !sl->s.req.constraint && j < e->o.max_seqs; j++)
            if (j != i && e->slot[j].used && !e->slot[j].lead && !e->slot[j].s.req.constraint &&
                (j < i || e->slot[j].fresh != 1) &&
                e->slot[j].st.pos < e->slot[j].s.n_prompt && same_prompt(&sl->s, &e->slot[j].s, e->d.D))
                sl->lead = e->slot[j].s.id;
        if (sl->lead) continue;
        const int64_t lim = sl->s.n_emb ? cache_limit(&sl->s) + 1 : sl->s.n_prompt;
        eng_snap *p = e->o.snapshot_every > 0 ? snap_find(e, sl->s.toks, lim) : NULL;
        if (p) {
            CHECK_RC(k3c_eng_state_copy(&sl->st, &p->st, &e->d, err));
            e->prefix_hits++;
            e->prefix_tokens_reused += p->st.pos;
        }
    }
    return K3C_OK;
}

/* The end of a step, under mu: finished slots free for submitters' queue bound, and the counters. */
static void end_step(k3c_engine *e, int nseg) {
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->o.max_seqs; i++)
        if (!e->slot[i].used) e->slot_id[i] = 0;
    if (nseg > 0) {
        e->stats.steps++;
        e->stats.step_seqs += (uint64_t)nseg;
        if (nseg > e->stats.batch_max) e->stats.batch_max = nseg;
    }
    e->stats.prefix_hits = e->prefix_hits;
    e->stats.prefix_tokens_reused = e->prefix_tokens_reused;
    e->stats.prefills_shared = e->prefills_shared;
    e->stats.snapshots = e->n_snap;
    pthread_mutex_unlock(&e->mu);
}

/* The image rows among prompt positions pos .. pos+len−1, laid out at step row n (NULL when there are none). */
static const float *const *image_rows(k3c_engine *e, const eng_seq *s, int64_t pos, int64_t len, int64_t n) {
    int64_t j = 0, any = 0;
    while (j < s->n_emb && s->emb_pos[j] < pos) j++;
    for (int64_t i = 0; i < len; i++) {
        const int hit = j < s->n_emb && s->emb_pos[j] == pos + i;
        e->row_emb[n + i] = hit ? s->emb + (j++) * e->d.D : NULL;
        any |= hit;
    }
    return any ? e->row_emb + n : NULL;
}

/* Lays out the step's rows: the last sampled token of every decoding sequence, and prompt chunks of the others from
 * what is left of the step's rows (prefill_chunk, or max_seqs when larger: all sequences' prompts share it, so the
 * step's buffers do not grow with the slots), each ending at a snapshot boundary when snapshots are on; a prompt may
 * wait a step for rows. Logits only where a token will be sampled. Returns the row count. */
static int64_t layout(k3c_engine *e, int *nseg, int64_t *n_out) {
    int64_t n = 0, N = e->o.snapshot_every, budget = e->rows;
    *nseg = 0, *n_out = 0;
    for (int i = 0; i < e->o.max_seqs; i++) budget -= e->slot[i].used && e->slot[i].st.pos >= e->slot[i].s.n_prompt;
    for (int i = 0; i < e->o.max_seqs; i++) {
        eng_slot *sl = &e->slot[i];
        if (!sl->used || lead_slot(e, i) >= 0) continue;
        const int64_t pos = sl->st.pos;
        int64_t len = 1;
        if (pos < sl->s.n_prompt) {
            len = sl->s.n_prompt - pos < e->o.prefill_chunk ? sl->s.n_prompt - pos : e->o.prefill_chunk;
            if (len > budget) len = budget;
            if (N > 0 && (pos / N + 1) * N < pos + len) len = (pos / N + 1) * N - pos;
            if (len <= 0) continue;
            budget -= len;
        }
        memcpy(e->ids + n, sl->s.toks + pos, sizeof(int32_t) * (size_t)len);
        e->segs[*nseg] = (k3c_eng_seg){&sl->st, n, len, image_rows(e, &sl->s, pos, len, n)};
        e->seg_slot[(*nseg)++] = i;
        n += len;
        if (pos + len >= sl->s.n_prompt) {
            e->out_rows[*n_out] = n - 1;
            e->out_slot[(*n_out)++] = i;
        }
    }
    return n;
}

static int is_stop(const k3c_request *r, int32_t id) {
    for (int i = 0; i < r->n_stop; i++)
        if (r->stop_ids[i] == id) return 1;
    return 0;
}

/* Samples slot i's next token from its logits row (masked in place by the sequence's constraint, so every sampler
 * setting and the logprobs see the allowed ids only) and reports it; a finished sequence leaves its slot. */
static void sample_one(k3c_engine *e, int i, float *logits, k3c_engine_event *ev) {
    eng_slot *sl = &e->slot[i];
    eng_seq *s = &sl->s;
    k3c_history h = {s->toks, s->n_prompt, s->toks + s->n_prompt, s->n_out};
    memset(ev, 0, sizeof *ev);
    ev->seq = s->id;
    const k3c_constraint *c = s->req.constraint;
    if (c) {
        int64_t left = s->req.max_new - s->n_out;
        if (e->o.max_ctx - s->n_tok < left) left = e->o.max_ctx - s->n_tok;
        if (c->mask(c->ctx, logits, e->d.V, left)) {
            end_event(ev, s->id, K3C_FINISH_ERROR);
            slot_free(e, i);
            return;
        }
    }
    int32_t id = k3c_sample_seq(&s->req.sampler, logits, e->d.V, (uint64_t)s->n_tok, &h, &ev->token, e->sample_ws);
    if (c && c->accept(c->ctx, id)) {
        end_event(ev, s->id, K3C_FINISH_ERROR);
        slot_free(e, i);
        return;
    }
    s->toks[s->n_tok++] = id;
    s->n_out++;
    ev->finish = is_stop(&s->req, id)                                     ? K3C_FINISH_STOP
                 : s->n_out >= s->req.max_new || s->n_tok >= e->o.max_ctx ? K3C_FINISH_LENGTH
                                                                          : K3C_FINISH_NONE;
    if (ev->finish) slot_free(e, i);
}

/* The sequences waiting on a prefill that ended at this step take its state (before anything is sampled, so a failed
 * copy fails the step like a failed forward). */
static int fork_prefills(k3c_engine *e, int64_t n_out, k3c_err *err) {
    for (int64_t j = 0; j < n_out; j++) {
        const eng_slot *sl = &e->slot[e->out_slot[j]];
        for (int f = 0; sl->s.n_out == 0 && f < e->o.max_seqs; f++)
            if (e->slot[f].used && e->slot[f].lead == sl->s.id)
                CHECK_RC(k3c_eng_state_copy(&e->slot[f].st, &sl->st, &e->d, err));
    }
    return K3C_OK;
}

/* Samples every logits row of the step; a row that ended a prompt also gives the first token of each sequence forked
 * from that prefill (each with its own sampler), before its own sequence's (which may leave its slot). */
static void sample_all(k3c_engine *e, int64_t n_out, k3c_engine_event *ev, int *n_ev) {
    for (int64_t j = 0; j < n_out; j++) {
        const int i = e->out_slot[j];
        float *row = e->logits + j * e->d.V;
        for (int f = 0; e->slot[i].s.n_out == 0 && f < e->o.max_seqs; f++) {
            if (!e->slot[f].used || e->slot[f].lead != e->slot[i].s.id) continue;
            e->slot[f].lead = 0;
            e->prefills_shared++;
            e->ev_row[*n_ev - e->ev_base] = (int)j;
            sample_one(e, f, row, &ev[(*n_ev)++]);
        }
        e->ev_row[*n_ev - e->ev_base] = (int)j;
        sample_one(e, i, row, &ev[(*n_ev)++]);
    }
}

int k3c_engine_step(k3c_engine *e, k3c_engine_event *ev, int cap, int *n_ev, k3c_err *err) {
    *n_ev = 0;
    if (cap < e->o.max_seqs)
        return k3c_errf(err, K3C_EINVAL, "engine step: room for %d events, a step may report %d", cap, e->o.max_seqs);
    begin_step(e, ev, cap, n_ev);
    int nseg = 0, rc = start_fresh(e, err);
    int64_t n_out;
    if (!rc && layout(e, &nseg, &n_out) > 0)
        rc = k3c_eng_forward(e->w, e->ws, e->ids, e->segs, nseg, e->out_rows, n_out, e->logits, err);
    if (!rc && nseg > 0) rc = fork_prefills(e, n_out, err);
    e->ev_base = *n_ev;
    if (rc || nseg == 0) { /* on a failure the states of this step are half-advanced: drop its sequences */
        for (int i = 0; rc && i < e->o.max_seqs; i++)
            if (e->slot[i].used) {
                end_event(&ev[(*n_ev)++], e->slot[i].s.id, K3C_FINISH_ERROR);
                slot_free(e, i);
            }
        end_step(e, 0);
        return rc;
    }
    for (int s = 0; e->o.snapshot_every > 0 && s < nseg; s++) {
        const eng_slot *sl = &e->slot[e->seg_slot[s]];
        if (sl->st.pos <= cache_limit(&sl->s) &&
            (sl->st.pos % e->o.snapshot_every == 0 || sl->st.pos == sl->s.n_prompt))
            snap_store(e, sl->s.toks, &sl->st);
    }
    sample_all(e, n_out, ev, n_ev);
    end_step(e, nseg);
    return K3C_OK;
}

const float *k3c_engine_event_logits(const k3c_engine *e, int i) {
    return e->logits + (int64_t)e->ev_row[i - e->ev_base] * e->d.V;
}
