/* train.c — `k3c vision train`: the text model and the vision tower trained together on interleaved image-text
 * samples (the tower's embeddings replace the <|media_pad|> rows, d_embeds flows back into the tower), the update
 * through the step's tail over two parameter groups, and held-out accuracy by scoring every candidate answer; both on
 * the backend of the options (CPU or a device). Spec: docs/VISION.md "Training data" and "Demo". */
#include "base/check.h"
#include "model/model.h"
#include "ops/optim.h"
#include "train/schedule.h"
#include "train/step_tail.h"
#include "vision/vision.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EVAL_GROUP 16 /* eval samples per forward */

typedef struct {
    k3c_config cfg;
    k3c_model m;
    k3c_vision *v;
    k3c_tok *tok;
    const k3c_backend_f32 *be; /* where the model and the tower run */
    k3c_optim opt;
    float *ostate;          /* the model's optimizer state (backend memory) */
    void *opt_inst;         /* the backend's optimizer instance for the model */
    k3c_flat_group tower;   /* the tower's parameters, AdamW */
    k3c_step_tail tail;     /* group 0 the model, group 1 the tower */
    k3c_arena arena;
    size_t arena_cap;
    int32_t pad;
} vtrain;

/* One document of a packed batch: ids (images from s, in order) and targets (NULL: none counted). */
typedef struct {
    const k3c_vsample *s;
    const int32_t *ids, *tg;
    int64_t n;
} vdoc;

typedef struct {
    int32_t *ids, *tg, *cu, *pos;
    float *px;
    k3c_grid_thw *g;
    int64_t T, L, N;
    int nd, ng;
} vbatch;

static void vbatch_free(vbatch *b) {
    free(b->ids), free(b->tg), free(b->cu), free(b->pos), free(b->px), free(b->g);
    memset(b, 0, sizeof *b);
}

static int pack(const vtrain *t, const vdoc *d, int nd, vbatch *b, k3c_err *err) {
    memset(b, 0, sizeof *b);
    const int64_t per = 3 * t->v->cfg.patch_size * t->v->cfg.patch_size;
    for (int i = 0; i < nd; i++) b->T += d[i].n, b->L += d[i].s->n_patches, b->ng += d[i].s->n_img;
    b->ids = malloc(sizeof(int32_t) * (size_t)b->T), b->tg = malloc(sizeof(int32_t) * (size_t)b->T);
    b->cu = malloc(sizeof(int32_t) * (size_t)(nd + 1)), b->pos = malloc(sizeof(int32_t) * (size_t)b->T);
    b->px = malloc(sizeof(float) * (size_t)(b->L * per + 1)), b->g = malloc(sizeof *b->g * (size_t)(b->ng + 1));
    if (!b->ids || !b->tg || !b->cu || !b->pos || !b->px || !b->g) {
        vbatch_free(b);
        return k3c_errf(err, K3C_ENOMEM, "vision train: out of memory");
    }
    int64_t T = 0, L = 0;
    b->cu[0] = 0;
    for (int i = 0; i < nd; i++) {
        memcpy(b->ids + T, d[i].ids, sizeof(int32_t) * (size_t)d[i].n);
        for (int64_t k = 0; k < d[i].n; k++) b->tg[T + k] = d[i].tg ? d[i].tg[k] : -1;
        memcpy(b->px + L * per, d[i].s->pixels, sizeof(float) * (size_t)(d[i].s->n_patches * per));
        memcpy(b->g + b->nd, d[i].s->grid, sizeof *b->g * (size_t)d[i].s->n_img);
        b->nd += d[i].s->n_img;
        T += d[i].n, L += d[i].s->n_patches;
        b->cu[i + 1] = (int32_t)T;
    }
    b->nd = nd;
    b->N = k3c_vision_pad_positions(b->ids, b->T, t->pad, b->pos);
    return K3C_OK;
}

static int ensure_arena(vtrain *t, int64_t T, int nd, k3c_err *err) {
    const size_t need = k3c_model_plan_bytes_f32(&t->m, T, nd);
    if (need <= t->arena_cap) return K3C_OK;
    if (t->arena_cap) k3c_model_arena_free_f32(&t->m, &t->arena);
    t->arena_cap = 0;
    CHECK_RC(k3c_model_arena_init_f32(&t->m, need + need / 4, &t->arena, err));
    t->arena_cap = need + need / 4;
    return K3C_OK;
}

/* Tower, then model over a packed batch: the loss (train: and every gradient, tower included) or the logits. */
static int run(vtrain *t, const vbatch *b, int train, double *loss, float **logits, k3c_err *err) {
    k3c_vision_acts_f32 *va = NULL;
    const float *emb = NULL;
    int64_t N = 0;
    CHECK_RC(k3c_vision_forward_f32(t->v, b->px, b->g, b->ng, &va, NULL, &emb, &N, err));
    /* the model takes the image rows from the host (and returns their gradient there) */
    const size_t rows = sizeof(float) * (size_t)(N * t->cfg.hidden_size + 1);
    float *embh = malloc(rows), *demb = train ? malloc(rows) : NULL;
    int rc = N != b->N               ? k3c_errf(err, K3C_EINVAL, "vision train: %lld image tokens for %lld <|media_pad|> ids",
                                                (long long)N, (long long)b->N)
             : !embh || (train && !demb) ? k3c_errf(err, K3C_ENOMEM, "vision train: out of memory")
                                         : ensure_arena(t, b->T, b->nd, err);
    if (!rc) rc = t->be->download(embh, emb, rows - sizeof(float), err);
    k3c_model_batch mb = {.T = b->T,
                          .n_docs = b->nd,
                          .ids = b->ids,
                          .cu_seqlens = b->cu,
                          .targets = train ? b->tg : NULL,
                          .n_embeds = N,
                          .embed_pos = b->pos,
                          .embeds = embh,
                          .d_embeds = demb};
    k3c_acts *acts;
    if (!rc) k3c_arena_reset(&t->arena, 0);
    if (!rc) rc = k3c_model_forward_f32(&t->m, &mb, &t->arena, &acts, train ? loss : NULL, logits, err);
    if (!rc && train) {
        rc = t->be->zero(t->m.g, (int64_t)t->m.table.total, err);
        if (!rc) rc = t->be->zero(t->v->g, (int64_t)t->v->total, err);
        if (!rc) rc = k3c_model_backward_f32(&t->m, acts, 1.0, err);
        if (!rc) rc = k3c_vision_backward_f32(t->v, va, demb, NULL, err);
    }
    free(embh);
    free(demb);
    k3c_vision_acts_free_f32(va);
    return rc;
}

static int train_step(vtrain *t, const k3c_vdata *d, const k3c_vtrain_opts *o, int64_t step, double *loss,
                      int64_t *tokens, k3c_err *err) {
    vdoc *docs = malloc(sizeof *docs * (size_t)o->batch);
    if (!docs) return k3c_errf(err, K3C_ENOMEM, "vision train: out of memory");
    for (int64_t i = 0; i < o->batch; i++) { /* sampled with replacement, keyed by (seed, step, i) */
        const k3c_vsample *s = &d->s[(size_t)(k3c_uniform_at(o->seed, (uint64_t)(step * o->batch + i)) * d->n)];
        docs[i] = (vdoc){s, s->ids, s->targets, s->n};
    }
    vbatch b;
    int rc = pack(t, docs, (int)o->batch, &b, err);
    free(docs);
    if (!rc) rc = run(t, &b, 1, loss, NULL, err);
    *tokens += b.T;
    vbatch_free(&b);
    if (rc) return rc;
    k3c_schedule sch = {K3C_SCHED_COSINE, 1, o->steps / 20 + 1, o->steps, 0.1};
    const double f = k3c_schedule_lr(&sch, step), lr[2] = {o->lr * f, o->tower_lr * f};
    /* the model and the tower clipped each by its own norm; no QK-Clip or balancing (the router biases stay) */
    const k3c_tail_config c = {o->grad_clip, 0, K3C_BALANCE_NONE, -1, 0};
    k3c_tail_result r;
    CHECK_RC(k3c_step_tail_run(&t->tail, &c, lr, step, &r, err));
    if (r.skipped)
        return k3c_errf(err, K3C_ENUMERIC, "vision train: step %lld: %s (%s): update not applied", (long long)step,
                        r.why, isfinite(r.grad_norm[0]) ? "the tower's" : "the model's");
    return K3C_OK;
}

/* *lp = Σ log p(ids[from..n) | ids[0..from)) of document rows [r0, r0 + n) of the logits [T, V] (the model's
 * backend memory): the rows that predict ids[from..n) are downloaded into host[n - from, V]. */
static int doc_logprob(const vtrain *t, const float *logits, int64_t r0, const int32_t *ids, int64_t from, int64_t n,
                       float *host, double *lp, k3c_err *err) {
    const int64_t V = t->cfg.vocab_size;
    *lp = 0;
    if (n > from)
        CHECK_RC(t->be->download(host, logits + (r0 + from - 1) * V, sizeof(float) * (size_t)((n - from) * V), err));
    for (int64_t k = from; k < n; k++) {
        const float *row = host + (k - from) * V;
        double mx = row[0], z = 0;
        for (int64_t v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
        for (int64_t v = 0; v < V; v++) z += exp(row[v] - mx);
        *lp += row[ids[k]] - mx - log(z);
    }
    return K3C_OK;
}

/* The distinct answers of the eval set and their ids. */
typedef struct {
    const char **text;
    k3c_tok_ids *ids;
    int n;
} answers;

static void answers_free(answers *a) {
    for (int i = 0; a->ids && i < a->n; i++) k3c_tok_ids_free(&a->ids[i]);
    free(a->text), free(a->ids);
}

static int collect_answers(const vtrain *t, const k3c_vdata *e, answers *a, k3c_err *err) {
    memset(a, 0, sizeof *a);
    a->text = calloc(e->n, sizeof *a->text), a->ids = calloc(e->n, sizeof *a->ids);
    if (!a->text || !a->ids) return k3c_errf(err, K3C_ENOMEM, "vision train: out of memory");
    for (size_t i = 0; i < e->n; i++) {
        if (!e->s[i].answer) return k3c_errf(err, K3C_EINVAL, "eval sample %zu has no \"answer\"", i);
        int seen = 0;
        for (int j = 0; j < a->n && !seen; j++) seen = !strcmp(a->text[j], e->s[i].answer);
        if (seen) continue;
        a->text[a->n] = e->s[i].answer;
        CHECK_RC(k3c_tok_encode(t->tok, a->text[a->n], strlen(a->text[a->n]), 0, &a->ids[a->n], err));
        a->n++;
    }
    return K3C_OK;
}

/* Eval samples s[0..ns) against every answer (one packed forward, a document per sample and candidate): *right
 * counts those whose own answer scores best. */
static int score_group(vtrain *t, const k3c_vsample *s, int ns, const answers *a, int64_t *right, k3c_err *err) {
    const int nd = ns * a->n;
    vdoc *docs = calloc((size_t)nd, sizeof *docs);
    int32_t *buf = NULL;
    size_t total = 0, longest = 1;
    for (int i = 0; i < ns; i++)
        for (int j = 0; j < a->n; j++) total += (size_t)s[i].answer_at + a->ids[j].n;
    for (int j = 0; j < a->n; j++) longest = a->ids[j].n > longest ? a->ids[j].n : longest;
    float *rows = malloc(sizeof(float) * longest * (size_t)t->cfg.vocab_size); /* one candidate's logit rows */
    int rc = docs && rows && (buf = malloc(sizeof(int32_t) * total)) ? K3C_OK
                                                                    : k3c_errf(err, K3C_ENOMEM, "out of memory");
    for (int d = 0, off = 0; !rc && d < nd; d++) {
        const k3c_vsample *x = &s[d / a->n];
        const k3c_tok_ids *c = &a->ids[d % a->n];
        memcpy(buf + off, x->ids, sizeof(int32_t) * (size_t)x->answer_at);
        memcpy(buf + off + x->answer_at, c->ids, sizeof(int32_t) * c->n);
        docs[d] = (vdoc){x, buf + off, NULL, x->answer_at + (int64_t)c->n};
        off += (int)docs[d].n;
    }
    vbatch b = {0};
    float *logits = NULL;
    if (!rc) rc = pack(t, docs, nd, &b, err);
    if (!rc) rc = run(t, &b, 0, NULL, &logits, err);
    for (int i = 0; !rc && i < ns; i++) {
        int best = -1, mine = -1;
        double best_lp = -INFINITY;
        for (int j = 0; !rc && j < a->n; j++) {
            const vdoc *d = &docs[i * a->n + j];
            double lp;
            rc = doc_logprob(t, logits, b.cu[i * a->n + j], d->ids, s[i].answer_at, d->n, rows, &lp, err);
            if (!rc && lp > best_lp) best_lp = lp, best = j;
            if (!strcmp(a->text[j], s[i].answer)) mine = j;
        }
        *right += best == mine;
    }
    vbatch_free(&b);
    free(rows);
    free(buf);
    free(docs);
    return rc;
}

static int evaluate(vtrain *t, const k3c_vdata *e, const k3c_vtrain_opts *o, k3c_vtrain_result *res, k3c_err *err) {
    answers a;
    int rc = collect_answers(t, e, &a, err);
    const size_t n = o->eval_max > 0 && (size_t)o->eval_max < e->n ? (size_t)o->eval_max : e->n;
    int64_t right = 0;
    for (size_t i = 0; !rc && i < n; i += EVAL_GROUP)
        rc = score_group(t, &e->s[i], (int)(n - i < EVAL_GROUP ? n - i : EVAL_GROUP), &a, &right, err);
    res->n_eval = (int64_t)n;
    res->accuracy = n ? (double)right / (double)n : 0;
    res->chance = a.n ? 1.0 / a.n : 0;
    answers_free(&a);
    return rc;
}

static int open_all(vtrain *t, const k3c_vtrain_opts *o, k3c_err *err) {
    char path[4200];
    CHECK_RC(k3c_config_load(o->dir, &t->cfg, err));
    if (!t->cfg.vision.present) return k3c_errf(err, K3C_ECONFIG, "%s: config.json has no vision_config", o->dir);
    CHECK_RC(k3c_tok_load_dir(o->dir, NULL, &t->tok, err));
    t->pad = (int32_t)(t->cfg.vision.media_pad_id >= 0 ? t->cfg.vision.media_pad_id
                                                       : k3c_tok_special_id(t->tok, "<|media_pad|>"));
    snprintf(path, sizeof path, "%s/model.safetensors", o->dir);
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    if (f) { /* weights present: continue from them */
        CHECK_RC(k3c_model_open_f32(o->dir, 1, &t->m, err));
        CHECK_RC(k3c_vision_open_f32(o->dir, 1, &t->v, err));
    } else {
        CHECK_RC(k3c_model_create_f32(&t->cfg, 1, &t->m, err));
        k3c_model_init_f32(&t->m, o->seed, 0.02);
        CHECK_RC(k3c_vision_create_f32(&t->cfg.vision, 1, &t->v, err));
        k3c_vision_init_f32(t->v, o->seed + 1);
    }
    CHECK_RC(k3c_model_use_backend_f32(&t->m, o->backend, err));
    CHECK_RC(k3c_vision_use_backend_f32(t->v, o->backend, err));
    t->be = k3c_model_backend_f32(&t->m);
    k3c_optim_defaults(&t->opt);
    t->opt.weight_decay = o->weight_decay;
    CHECK_RC(k3c_optim_init(&t->opt, &t->m.table, err));
    const size_t n = t->opt.state_numel + 1;
    t->ostate = t->be->alloc(sizeof(float) * n);
    if (!t->ostate) return k3c_errf(err, K3C_ENOMEM, "vision train: cannot allocate the optimizer state");
    CHECK_RC(t->be->zero(t->ostate, (int64_t)n, err));
    CHECK_RC(t->be->optim_open(t->be->ctx, &t->opt, &t->m.table, &t->opt_inst, err));
    CHECK_RC(k3c_flat_group_open(&t->tower, t->be, "vision tower", k3c_vision_weights(t->v), k3c_vision_grads(t->v),
                                 k3c_vision_param_count(t->v), &t->opt, err));
    t->tail.m = &t->m;
    t->tail.group[0] = (k3c_param_group){&t->m.table, &t->opt, t->opt_inst, t->m.w, t->m.g, t->ostate};
    t->tail.group[1] = t->tower.group;
    t->tail.n_groups = 2;
    return K3C_OK;
}

static void close_all(vtrain *t) {
    if (t->be) { /* backend memory first, while the model that holds the backend lives */
        k3c_step_tail_free(&t->tail);
        k3c_flat_group_close(&t->tower);
        if (t->opt_inst) t->be->optim_close(t->opt_inst);
        if (t->ostate && t->be->sync(NULL) == K3C_OK) t->be->free(t->ostate);
    }
    if (t->arena_cap) k3c_model_arena_free_f32(&t->m, &t->arena);
    k3c_optim_free(&t->opt);
    k3c_vision_free(t->v);
    if (t->m.w) k3c_model_free_f32(&t->m);
    k3c_tok_free(t->tok);
}

static int save(vtrain *t, const char *dir, k3c_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    remove(path); /* the text model is written alone first, then the index naming both files */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_RC(k3c_model_save_f32(&t->m, path, err));
    return k3c_vision_save_beside(t->v, dir, err);
}

static int train_loop(vtrain *t, const k3c_vdata *d, const k3c_vtrain_opts *o, k3c_vtrain_result *res, k3c_err *err) {
    const double t0 = k3c_now();
    for (int64_t step = 1; step <= o->steps; step++) {
        double loss = 0;
        CHECK_RC(train_step(t, d, o, step, &loss, &res->tokens, err));
        if (!isfinite(loss))
            return k3c_errf(err, K3C_ENUMERIC, "vision train: step %lld: loss %g", (long long)step, loss);
        if (step == 1) res->first_loss = loss;
        res->last_loss = loss;
        if (o->log && (step % o->log_every == 0 || step == o->steps))
            fprintf(o->log, "step %lld/%lld loss %.4f %.1f s\n", (long long)step, (long long)o->steps, loss,
                    k3c_now() - t0);
        if (o->log) fflush(o->log);
    }
    res->train_s = k3c_now() - t0;
    return K3C_OK;
}

int k3c_vision_train(const k3c_vtrain_opts *o, k3c_vtrain_result *res, k3c_err *err) {
    memset(res, 0, sizeof *res);
    if (o->steps < 0 || o->batch < 1 || o->max_tokens < 2 || o->log_every < 1 || !(o->lr >= 0) || !(o->tower_lr >= 0))
        return k3c_errf(err, K3C_EINVAL, "vision train: needs steps >= 0, batch >= 1, max_tokens >= 2, lr >= 0");
    vtrain t = {0};
    k3c_vdata d = {0}, e = {0};
    int rc = open_all(&t, o, err);
    if (!rc) rc = k3c_vdata_load(o->data, t.tok, &t.cfg.vision, o->max_tokens, &d, err);
    if (!rc && o->eval) rc = k3c_vdata_load(o->eval, t.tok, &t.cfg.vision, o->max_tokens, &e, err);
    if (!rc && o->log && (d.report || e.report))
        fprintf(o->log, "%s%s", d.report ? d.report : "", e.report ? e.report : "");
    res->n_train = (int64_t)d.n, res->bad_train = d.n_bad, res->bad_eval = e.n_bad;
    if (!rc) rc = train_loop(&t, &d, o, res, err);
    const double t1 = k3c_now();
    if (!rc && o->eval) rc = evaluate(&t, &e, o, res, err);
    res->eval_s = k3c_now() - t1;
    if (!rc) rc = save(&t, o->dir, err);
    k3c_vdata_free(&d);
    k3c_vdata_free(&e);
    close_all(&t);
    return rc;
}
