/* test_engine.c — the inference engine: prefill + decode logits equal the full-sequence training forward at every
 * position (golden Kimi-Linear and K3 models, a random K3 with several AttnRes blocks), at arbitrary prefill splits and
 * in batched steps; greedy ids equal the golden's; prefix snapshots resume exactly; the sampler's distributions. */
#include "test.h"
#include "model/model.h"
#include "serve/engine.h"

/* Row-wise relative error bound of the engine's logits against the training forward (fp32, CPU). */
#define TOL_LOGITS 1e-5
#define PAD_ID 31 /* a <|media_pad|> stand-in inside the tiny vocabulary */

static int32_t *read_i32(const k3c_safetensors *st, const char *name, int64_t *n) {
    const k3c_st_tensor *t = k3c_st_find(st, name);
    if (!t || t->dtype != K3C_I32) return NULL;
    *n = (int64_t)(t->nbytes / 4);
    int32_t *v = malloc(t->nbytes);
    memcpy(v, t->data, t->nbytes);
    return v;
}

/* Image rows: n embeddings [n, D] replacing the token embeddings at ascending positions pos (NULL: none). */
typedef struct {
    int64_t n;
    const int32_t *pos;
    const float *emb;
} img_rows;

/* Logits [T, V] of the training forward over ids (one document, image rows from im), in float64 when m64 (else
 * float32), as double. */
static double *ref_logits(k3c_model *m, k3c_model *m64, const int32_t *ids, int64_t T, const img_rows *im,
                          k3c_err *err) {
    k3c_model *r = m64 ? m64 : m;
    k3c_arena ar;
    size_t bytes = m64 ? k3c_model_plan_bytes_f64(r, T, 1) : k3c_model_plan_bytes_f32(r, T, 1);
    if ((m64 ? k3c_model_arena_init_f64 : k3c_model_arena_init_f32)(r, bytes, &ar, err)) return NULL;
    k3c_model_batch b = {.T = T, .n_docs = 1, .ids = ids};
    double *emb64 = NULL;
    if (im && im->n) { /* the model's precision */
        const int64_t ne = im->n * m->cfg.hidden_size;
        emb64 = malloc(sizeof(double) * (size_t)ne);
        for (int64_t i = 0; i < ne; i++) emb64[i] = im->emb[i];
        b.n_embeds = im->n, b.embed_pos = im->pos, b.embeds = m64 ? (const void *)emb64 : (const void *)im->emb;
    }
    k3c_acts *acts;
    const int64_t n = T * m->cfg.vocab_size;
    double *out = malloc(sizeof(double) * (size_t)n), *l64;
    float *l32;
    int rc = m64 ? k3c_model_forward_f64(r, &b, &ar, &acts, NULL, &l64, err)
                 : k3c_model_forward_f32(r, &b, &ar, &acts, NULL, &l32, err);
    for (int64_t i = 0; !rc && i < n; i++) out[i] = m64 ? l64[i] : (double)l32[i];
    (m64 ? k3c_model_arena_free_f64 : k3c_model_arena_free_f32)(r, &ar);
    free(emb64);
    if (rc) {
        free(out);
        return NULL;
    }
    return out;
}

/* Worst row-wise relative error (L2 over the vocabulary) of got [T, V] against ref. */
static double worst_row(const float *got, const double *ref, int64_t T, int64_t V) {
    double worst = 0;
    for (int64_t t = 0; t < T; t++) {
        double num = 0, den = 0;
        for (int64_t v = 0; v < V; v++) {
            double d = got[t * V + v] - ref[t * V + v];
            num += d * d;
            den += ref[t * V + v] * ref[t * V + v];
        }
        double e = sqrt(num / (den > 0 ? den : 1));
        if (!(e <= worst)) worst = e; /* NaN sticks */
    }
    return worst;
}

/* Runs ids through the engine in pieces of the given lengths (cycled; 1 = a decode step), all rows' logits. */
static float *engine_logits(const k3c_weights *w, const int32_t *ids, int64_t T, const int64_t *pieces, int np,
                            const img_rows *im, k3c_err *err) {
    k3c_eng_dims d;
    k3c_eng_dims_of(&w->cfg, &d);
    k3c_eng_state st;
    k3c_eng_ws *ws = NULL;
    float *out = malloc(sizeof(float) * (size_t)(T * d.V));
    const float **rows = calloc((size_t)T, sizeof *rows); /* per position: its image row or NULL */
    for (int64_t i = 0; im && i < im->n; i++) rows[im->pos[i]] = im->emb + i * d.D;
    int rc = k3c_eng_state_init(&st, &d, T, err);
    if (!rc) rc = k3c_eng_ws_init(w, T, T, &ws, err);
    for (int64_t t = 0, i = 0; !rc && t < T; i++) {
        int64_t len = pieces[i % np] < T - t ? pieces[i % np] : T - t;
        k3c_eng_seg seg = {&st, 0, len, im ? rows + t : NULL};
        rc = k3c_eng_forward(w, ws, ids + t, &seg, 1, NULL, len, out + t * d.V, err);
        t += len;
    }
    free(rows);
    k3c_eng_ws_free(ws);
    k3c_eng_state_free(&st);
    if (rc) {
        free(out);
        return NULL;
    }
    return out;
}

/* The engine (float32) against the float64 training forward, the exact answer: within TOL_LOGITS, or, where float32
 * rounding alone puts the float32 training forward further than TOL_LOGITS/2 from it (k3_tiny_a and the random K3: about
 * 1e-5), within twice that distance: two float32 computations of the same sum in different orders, each ε from the
 * exact value, may be 2ε apart, so no float32 engine can promise less. */
static void exact_vs_forward(const char *name, k3c_model *m, k3c_model *m64, const int32_t *ids, int64_t T,
                             const img_rows *im) {
    k3c_err err = {0};
    k3c_weights w;
    if (k3c_weights_from_model(m, &w, &err)) {
        CHECK(0, "%s: %s", name, err.msg);
        return;
    }
    double *ref = ref_logits(m, m64, ids, T, im, &err), *r32 = ref_logits(m, NULL, ids, T, im, &err);
    CHECK(ref && r32, "%s: %s", name, err.msg);
    double floor32 = 0, tol = TOL_LOGITS;
    if (ref && r32) {
        float *f = malloc(sizeof(float) * (size_t)(T * m->cfg.vocab_size));
        for (int64_t i = 0; i < T * m->cfg.vocab_size; i++) f[i] = (float)r32[i];
        floor32 = worst_row(f, ref, T, m->cfg.vocab_size);
        free(f);
        if (2 * floor32 > tol) tol = 2 * floor32;
        if (getenv("K3C_TEST_VERBOSE")) printf("  %s: float32 training forward vs float64: %.3e\n", name, floor32);
    }
    static const int64_t one[] = {1}, all[] = {1 << 30}, split[] = {7, 1, 1, 1, 11, 1, 5, 2, 16};
    const struct {
        const char *what;
        const int64_t *p;
        int n;
    } sched[] = {
        {"token by token", one, 1}, {"one prefill", all, 1}, {"prefill 7, decode 3, prefill 11, ...", split, 9}};
    for (int s = 0; ref && s < 3; s++) {
        float *got = engine_logits(&w, ids, T, sched[s].p, sched[s].n, im, &err);
        CHECK(got, "%s: %s", name, err.msg);
        if (!got) continue;
        char what[160];
        snprintf(what, sizeof what, "%s, %s: worst row relative error", name, sched[s].what);
        CHECK_LE(worst_row(got, ref, T, m->cfg.vocab_size), tol, what);
        free(got);
    }
    free(ref);
    free(r32);
    k3c_weights_free(&w);
}

static void golden_exact(const char *rel) {
    const char *dir = test_shared(rel);
    char gpath[512];
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
    k3c_err err = {0};
    k3c_model m, m64;
    k3c_safetensors *gs;
    if (k3c_model_open_f32(dir, 0, &m, &err) || k3c_model_open_f64(dir, 0, &m64, &err) ||
        k3c_st_open(gpath, &gs, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    int64_t n;
    int32_t *ids = read_i32(gs, "input_ids", &n);
    CHECK(ids, "%s: no input_ids", gpath);
    const k3c_st_tensor *t = k3c_st_find(gs, "input_ids");
    int64_t T = t && t->ndim == 2 ? t->shape[1] : n; /* the first row of a [B, T] batch */
    if (ids) exact_vs_forward(rel, &m, &m64, ids, T, NULL);
    free(ids);
    k3c_st_close(gs);
    k3c_model_free_f32(&m);
    k3c_model_free_f64(&m64);
}

/* A random K3 (configs/k3_test_tiny.json: 4 layers, AttnRes blocks of 2, MLA at layer 3), weights of std 0.1 like the
 * goldens' (at std 0.3 float32 rounding alone moves its logits by 1e-5), random pseudo-queries so the depth mixes are
 * not uniform. */
static int random_k3(k3c_model *m, k3c_err *err) {
    k3c_config cfg;
    if (k3c_config_load("configs/k3_test_tiny.json", &cfg, err) || k3c_model_create_f32(&cfg, 0, m, err)) return -1;
    k3c_model_init_f32(m, 11, 0.1);
    float *w = m->w;
    for (int i = 0; i < m->table.n; i++) {
        const k3c_param *p = &m->table.p[i];
        size_t len = strlen(p->name);
        if (len > 15 && !strcmp(p->name + len - 15, "res_proj.weight"))
            for (int64_t j = 0; j < p->numel; j++) w[p->offset + j] = (float)(0.5 * k3c_normal_at(77 + i, j));
    }
    return 0;
}

static void random_k3_exact(void) {
    k3c_err err = {0};
    k3c_model m;
    if (random_k3(&m, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    CHECK(m.cfg.attn_res_block > 0 && (m.cfg.num_layers + m.cfg.attn_res_block - 1) / m.cfg.attn_res_block >= 2,
          "the random K3 needs at least 2 AttnRes blocks");
    int32_t ids[70];
    for (int t = 0; t < 70; t++) ids[t] = (int32_t)((t * 13 + 7) % m.cfg.vocab_size);
    k3c_model m64; /* the same weights in float64 */
    if (k3c_model_create_f64(&m.cfg, 0, &m64, &err)) {
        CHECK(0, "%s", err.msg);
        k3c_model_free_f32(&m);
        return;
    }
    for (size_t i = 0; i < m.table.total; i++) ((double *)m64.w)[i] = ((float *)m.w)[i];
    exact_vs_forward("random K3 (2 AttnRes blocks)", &m, &m64, ids, 70, NULL);
    /* two images (4 and 9 rows, the second split across prompt chunks and decode steps) replacing placeholder rows */
    int32_t pos[13];
    float *emb = malloc(sizeof(float) * (size_t)(13 * m.cfg.hidden_size));
    for (int i = 0; i < 13; i++) pos[i] = i < 4 ? 3 + i : 14 + i;
    for (int i = 0; i < 13 * m.cfg.hidden_size; i++) emb[i] = (float)k3c_normal_at(91, (uint64_t)i);
    for (int i = 0; i < 13; i++) ids[pos[i]] = PAD_ID;
    const img_rows im = {13, pos, emb};
    exact_vs_forward("random K3 with image rows", &m, &m64, ids, 70, &im);
    free(emb);
    k3c_model_free_f32(&m);
    k3c_model_free_f64(&m64);
}

/* ---------------------------------------------------------------- the engine API */

#define MAXQ 8
#define MAXT 64

/* What each sequence produced: ids, finish reason and the logits row behind every id. */
typedef struct {
    int64_t id;
    int n, finish;
    int32_t tok[MAXT];
    float *logits; /* [MAXT, V] */
} run_out;

/* Submits prompts[i] (lengths len[i], settings req[i]) to e, steps until all finished, collects everything. */
static int run_engine(k3c_engine *e, int nq, const int32_t *const *prompts, const int64_t *len, const k3c_request *req,
                      int64_t V, run_out *out, k3c_err *err) {
    for (int i = 0; i < nq; i++) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].logits = malloc(sizeof(float) * (size_t)(MAXT * V));
        if (k3c_engine_submit(e, prompts[i], len[i], &req[i], &out[i].id, err)) return -1;
    }
    k3c_engine_event ev[MAXQ];
    for (int n_ev, guard = 0; k3c_engine_pending(e) > 0 && guard < 1000; guard++) { /* a prompt chunk has no event */
        if (k3c_engine_step(e, ev, MAXQ, &n_ev, err)) return -1;
        for (int j = 0; j < n_ev; j++)
            for (int i = 0; i < nq; i++)
                if (out[i].id == ev[j].seq && out[i].n < MAXT) {
                    memcpy(out[i].logits + out[i].n * V, k3c_engine_event_logits(e, j), sizeof(float) * (size_t)V);
                    out[i].tok[out[i].n++] = ev[j].token.id;
                    out[i].finish = ev[j].finish;
                }
    }
    return k3c_engine_pending(e) == 0 ? 0 : k3c_errf(err, K3C_EINVAL, "engine did not finish");
}

static void free_runs(run_out *o, int n) {
    for (int i = 0; i < n; i++) free(o[i].logits);
}

/* The three requests together on an engine of `slots` slots (prompt chunks of 8) into ob, and each alone on a one-slot
 * engine with the same chunks into os (only the company in the batch differs); returns the batched engine, open (the
 * caller reads it and closes it). */
static k3c_engine *batched_and_solo(const k3c_model *m, int slots, const int32_t *const *pr, const int64_t *len,
                                    const k3c_request *req, run_out *ob, run_out *os) {
    k3c_err err = {0};
    const int64_t V = m->cfg.vocab_size;
    k3c_engine_opts bo = {.max_seqs = slots, .prefill_chunk = 8, .max_ctx = 64}, so = bo;
    so.max_seqs = 1;
    k3c_engine *eb = NULL, *es = NULL;
    CHECK_OK(k3c_engine_open(m, &bo, &eb, &err), &err);
    CHECK_OK(k3c_engine_open(m, &so, &es, &err), &err);
    CHECK_OK(run_engine(eb, 3, pr, len, req, V, ob, &err), &err);
    for (int i = 0; i < 3; i++) CHECK_OK(run_engine(es, 1, pr + i, len + i, req + i, V, os + i, &err), &err);
    k3c_engine_close(es);
    return eb;
}

/* Greedy ids of the K3 golden's prompt through the engine API. */
static void golden_greedy(const k3c_model *m, const k3c_safetensors *gs) {
    k3c_err err = {0};
    int64_t np, ng;
    int32_t *prompt = read_i32(gs, "prompt_ids", &np), *want = read_i32(gs, "greedy_ids", &ng);
    k3c_engine *e;
    CHECK_OK(k3c_engine_open(m, NULL, &e, &err), &err);
    k3c_request r = {.sampler = {.top_p = 1}, .max_new = ng};
    run_out o;
    const int32_t *pp[1] = {prompt};
    CHECK_OK(run_engine(e, 1, pp, &np, &r, m->cfg.vocab_size, &o, &err), &err);
    CHECK(o.n == ng && !memcmp(o.tok, want, sizeof(int32_t) * (size_t)ng) && o.finish == K3C_FINISH_LENGTH,
          "greedy continuation differs from the golden's greedy_ids (%d ids)", o.n);
    free_runs(&o, 1);
    k3c_engine_close(e);
    free(prompt);
    free(want);
}

/* Three sequences of different lengths and settings through two slots (the third joins when one leaves; prompt chunks
 * of 8 run beside decode rows) produce the ids of solo runs and logits within TOL_LOGITS of them (a row's products
 * depend on the other rows only through the BLAS kernel chosen for the batch size: a few 1e-6). */
static void batching(const k3c_model *m, const int32_t *ids) {
    const int64_t V = m->cfg.vocab_size, len[3] = {5, 30, 17};
    const int32_t *pr[3] = {ids, ids + 3, ids + 11};
    k3c_request req[3] = {{.sampler = {.top_p = 1}, .max_new = 3},
                          {.sampler = {.temperature = 0.9, .top_p = 0.9, .seed = 5, .top_k = 50}, .max_new = 9},
                          {.sampler = {.top_p = 1, .repetition_penalty = 1.3, .logprobs = 2}, .max_new = 6}};
    run_out ob[3], os[3];
    k3c_engine *eb = batched_and_solo(m, 2, pr, len, req, ob, os);
    double worst = 0;
    for (int i = 0; i < 3; i++) {
        CHECK(ob[i].n == req[i].max_new && ob[i].n == os[i].n && !memcmp(ob[i].tok, os[i].tok, sizeof(int32_t) * 9),
              "sequence %d: batched ids differ from its solo run", i);
        for (int t = 0; t < ob[i].n; t++) {
            double *r = malloc(sizeof(double) * (size_t)V);
            for (int64_t v = 0; v < V; v++) r[v] = os[i].logits[t * V + v];
            double e = worst_row(ob[i].logits + t * V, r, 1, V);
            if (!(e <= worst)) worst = e;
            free(r);
        }
    }
    CHECK_LE(worst, TOL_LOGITS, "batched vs solo logits, worst row");
    free_runs(ob, 3);
    free_runs(os, 3);
    k3c_engine_close(eb);
}

/* Prefix cache: after prompt A (20 ids), prompt B sharing A's first 13 ids resumes from the snapshot at 8 (13 is no
 * snapshot boundary) and produces exactly the logits of a cold engine, whose prompt chunks end at the same multiples of
 * 8; prompt C extending A's prompt resumes at its end (20), where the cold run's chunk [16, 24) is split as [16, 20)
 * + [20, 24): the same ids, logits within TOL_LOGITS (the chunked KDA sums in another order). */
static void prefix_cache(const k3c_model *m, const int32_t *ids) {
    k3c_err err = {0};
    const int64_t V = m->cfg.vocab_size;
    int32_t B[22], C[25];
    memcpy(B, ids, sizeof(int32_t) * 13);
    for (int t = 13; t < 22; t++) B[t] = ids[40 - t];
    memcpy(C, ids, sizeof(int32_t) * 20);
    for (int t = 20; t < 25; t++) C[t] = ids[t + 7];
    const int32_t *pa[1] = {ids}, *pb[1] = {B}, *pc[1] = {C};
    const int64_t la = 20, lb = 22, lc = 25;
    k3c_request r = {.sampler = {.top_p = 1}, .max_new = 4};
    k3c_engine_opts o = {.max_seqs = 2, .snapshot_every = 8, .max_ctx = 64};
    k3c_engine *warm, *cold;
    run_out oa, ob, oc, xb, xc;
    CHECK_OK(k3c_engine_open(m, &o, &warm, &err), &err);
    CHECK_OK(run_engine(warm, 1, pa, &la, &r, V, &oa, &err), &err);
    CHECK_OK(run_engine(warm, 1, pb, &lb, &r, V, &ob, &err), &err);
    k3c_engine_stats st;
    k3c_engine_get_stats(warm, &st);
    CHECK(st.prefix_hits == 1 && st.prefix_tokens_reused == 8, "B resumes from the snapshot at 8 (hits %lld, %lld ids)",
          (long long)st.prefix_hits, (long long)st.prefix_tokens_reused);
    CHECK_OK(run_engine(warm, 1, pc, &lc, &r, V, &oc, &err), &err);
    k3c_engine_get_stats(warm, &st);
    CHECK(st.prefix_hits == 2 && st.prefix_tokens_reused == 28, "C resumes at A's prompt end (%lld ids reused)",
          (long long)st.prefix_tokens_reused);
    for (int i = 0; i < 2; i++) {
        CHECK_OK(k3c_engine_open(m, &o, &cold, &err), &err);
        run_out *x = i ? &xc : &xb, *w = i ? &oc : &ob;
        CHECK_OK(run_engine(cold, 1, i ? pc : pb, i ? &lc : &lb, &r, V, x, &err), &err);
        CHECK(x->n == w->n && !memcmp(x->tok, w->tok, sizeof(int32_t) * (size_t)x->n), "prompt %c: resumed ids differ",
              i ? 'C' : 'B');
        double *r = malloc(sizeof(double) * (size_t)(x->n * V));
        for (int64_t j = 0; j < x->n * V; j++) r[j] = x->logits[j];
        double e = worst_row(w->logits, r, x->n, V);
        free(r);
        if (i == 0)
            CHECK(e == 0, "prompt B: resumed logits must equal the cold run's bit for bit (%.3e)", e);
        else
            CHECK_LE(e, TOL_LOGITS, "prompt C: resumed vs cold logits, worst row");
        k3c_engine_close(cold);
    }
    free_runs(&oa, 1), free_runs(&ob, 1), free_runs(&oc, 1), free_runs(&xb, 1), free_runs(&xc, 1);
    k3c_engine_close(warm);
}

/* Image prompts and the prefix cache: the same placeholder ids with two different images give different logits; the
 * second resumes only from the snapshot before its first image row (8, not its prompt end) and equals a cold run bit
 * for bit; a text prompt with those ids resumes from there too; bad override positions are refused. */
static void image_prefix(const k3c_model *m, const int32_t *ids) {
    k3c_err err = {0};
    const int64_t V = m->cfg.vocab_size, D = m->cfg.hidden_size, T = 24;
    int32_t P[24], pos[6];
    memcpy(P, ids, sizeof P);
    for (int i = 0; i < 6; i++) P[pos[i] = 10 + i] = PAD_ID;
    float *emb = malloc(sizeof(float) * (size_t)(12 * D));
    for (int64_t i = 0; i < 12 * D; i++) emb[i] = (float)(0.5 * k3c_normal_at(93, (uint64_t)i));
    k3c_request ra = {.sampler = {.top_p = 1}, .max_new = 3, .n_embeds = 6, .embed_pos = pos, .embeds = emb}, rb = ra,
                rt = {.sampler = {.top_p = 1}, .max_new = 3};
    rb.embeds = emb + 6 * D;
    k3c_engine_opts o = {.max_seqs = 1, .snapshot_every = 8, .max_ctx = 64};
    k3c_engine *warm, *cold;
    run_out oa, ob, xb, ot;
    const int32_t *pp[1] = {P};
    CHECK_OK(k3c_engine_open(m, &o, &warm, &err), &err);
    CHECK_OK(k3c_engine_open(m, &o, &cold, &err), &err);
    CHECK_OK(run_engine(warm, 1, pp, &T, &ra, V, &oa, &err), &err);
    CHECK_OK(run_engine(warm, 1, pp, &T, &rb, V, &ob, &err), &err);
    CHECK_OK(run_engine(cold, 1, pp, &T, &rb, V, &xb, &err), &err);
    k3c_engine_stats st;
    k3c_engine_get_stats(warm, &st);
    CHECK(st.prefix_hits == 1 && st.prefix_tokens_reused == 8,
          "the second image resumes before its first image row only (hits %lld, %lld ids)", (long long)st.prefix_hits,
          (long long)st.prefix_tokens_reused);
    CHECK(memcmp(oa.logits, ob.logits, sizeof(float) * (size_t)V) != 0, "two images give different logits");
    CHECK(!memcmp(ob.logits, xb.logits, sizeof(float) * (size_t)(ob.n * V)) && ob.n == xb.n,
          "the resumed image prompt equals a cold run bit for bit");
    CHECK_OK(run_engine(warm, 1, pp, &T, &rt, V, &ot, &err), &err);
    k3c_engine_get_stats(warm, &st);
    CHECK(st.prefix_tokens_reused == 16, "a text prompt with the placeholder ids resumes at 8 too (%lld ids reused)",
          (long long)st.prefix_tokens_reused);
    int64_t seq;
    int32_t bad[2] = {12, 11};
    k3c_request rbad = ra;
    rbad.n_embeds = 2, rbad.embed_pos = bad;
    CHECK(k3c_engine_submit(warm, P, T, &rbad, &seq, &err) == K3C_EINVAL, "descending override positions are refused");
    bad[0] = 11, bad[1] = 24;
    CHECK(k3c_engine_submit(warm, P, T, &rbad, &seq, &err) == K3C_EINVAL, "an override past the prompt is refused");
    free_runs(&oa, 1), free_runs(&ob, 1), free_runs(&xb, 1), free_runs(&ot, 1);
    k3c_engine_close(warm);
    k3c_engine_close(cold);
    free(emb);
}

/* The n samples of one prompt share its prefill: three sequences of a 30-id prompt (chunks of 8) submitted together
 * prefill once — one sequence runs each prompt step, the others fork from its state at the prompt end and sample their
 * first token from its last row — and each gives the ids of its solo run with logits within TOL_LOGITS. When the lead
 * is cancelled during its prefill, the one waiting on it runs the prompt itself and still matches its solo run. */
static void shared_prefill(const k3c_model *m, const int32_t *ids) {
    k3c_err err = {0};
    const int64_t V = m->cfg.vocab_size, len[3] = {30, 30, 30}, max_new = 6;
    const int32_t *pr[3] = {ids, ids, ids};
    k3c_request req[3];
    for (int i = 0; i < 3; i++)
        req[i] =
            (k3c_request){.sampler = {.temperature = 0.9, .top_p = 1, .seed = 21 + (uint64_t)i}, .max_new = max_new};
    run_out ob[3], os[3];
    k3c_engine *eb = batched_and_solo(m, 3, pr, len, req, ob, os);
    k3c_engine_stats st;
    k3c_engine_get_stats(eb, &st);
    CHECK(st.prefills_shared == 2 && st.step_seqs == 4 + 3 * (uint64_t)(max_new - 1),
          "one prefill for three samples: %lld forked, %llu sequence-steps (want 2 and %lld)",
          (long long)st.prefills_shared, (unsigned long long)st.step_seqs, (long long)(4 + 3 * (max_new - 1)));
    double worst = 0;
    int same = 0, differ = 0;
    for (int i = 0; i < 3; i++) {
        same += ob[i].n == max_new && os[i].n == max_new && !memcmp(ob[i].tok, os[i].tok, sizeof(int32_t) * max_new);
        differ += i && memcmp(ob[i].tok, ob[0].tok, sizeof(int32_t) * max_new);
        double *r = malloc(sizeof(double) * (size_t)(max_new * V));
        for (int64_t j = 0; j < max_new * V; j++) r[j] = os[i].logits[j];
        double e = worst_row(ob[i].logits, r, ob[i].n < max_new ? ob[i].n : max_new, V);
        if (!(e <= worst)) worst = e;
        free(r);
    }
    CHECK(same == 3 && differ >= 1, "forked samples: %d of 3 as their solo runs, %d differ from the first", same,
          differ);
    CHECK_LE(worst, TOL_LOGITS, "forked vs solo logits, worst row");
    /* the lead cancelled after one prompt step: the other runs the prompt itself */
    int64_t a, b;
    CHECK_OK(k3c_engine_submit(eb, ids, 30, &req[0], &a, &err), &err);
    CHECK_OK(k3c_engine_submit(eb, ids, 30, &req[1], &b, &err), &err);
    k3c_engine_event ev[3];
    int n_ev = 0;
    CHECK_OK(k3c_engine_step(eb, ev, 3, &n_ev, &err), &err);
    CHECK_OK(k3c_engine_cancel(eb, a, &err), &err);
    run_out ow = {.id = b, .logits = malloc(sizeof(float) * (size_t)(MAXT * V))};
    for (int guard = 0; k3c_engine_pending(eb) > 0 && guard < 100; guard++) {
        CHECK_OK(k3c_engine_step(eb, ev, 3, &n_ev, &err), &err);
        for (int j = 0; j < n_ev; j++)
            if (ev[j].seq == b && ow.n < MAXT) ow.tok[ow.n++] = ev[j].token.id;
    }
    k3c_engine_get_stats(eb, &st);
    CHECK(ow.n == max_new && !memcmp(ow.tok, os[1].tok, sizeof(int32_t) * max_new) && st.prefills_shared == 2,
          "its lead cancelled, the waiting sequence ran the prompt itself (%d ids, %lld forked)", ow.n,
          (long long)st.prefills_shared);
    free(ow.logits);
    free_runs(ob, 3);
    free_runs(os, 3);
    k3c_engine_close(eb);
}

/* Cancel and bad submissions. */
static void api_edges(const k3c_model *m, const int32_t *ids) {
    k3c_err err = {0};
    k3c_engine *e;
    k3c_engine_opts o = {.max_seqs = 2, .max_ctx = 32};
    CHECK_OK(k3c_engine_open(m, &o, &e, &err), &err);
    k3c_request r = {.sampler = {.top_p = 1}, .max_new = 5};
    int64_t a, b, c;
    CHECK_OK(k3c_engine_submit(e, ids, 6, &r, &a, &err), &err);
    CHECK_OK(k3c_engine_submit(e, ids, 9, &r, &b, &err), &err);
    CHECK_OK(k3c_engine_submit(e, ids, 4, &r, &c, &err), &err);
    k3c_engine_event ev[2];
    int n;
    CHECK_OK(k3c_engine_step(e, ev, 2, &n, &err), &err);
    CHECK(n == 2, "two slots: two events (%d)", n);
    CHECK_OK(k3c_engine_cancel(e, a, &err), &err);
    CHECK_OK(k3c_engine_cancel(e, c, &err), &err); /* still waiting */
    CHECK(k3c_engine_cancel(e, a, &err) == K3C_ENOTFOUND, "a cancelled id is unknown");
    int left = 0;
    while (k3c_engine_step(e, ev, 2, &n, &err) == 0 && n > 0)
        for (int j = 0; j < n; j++) left += ev[j].seq == b ? 1 : 1000;
    CHECK(left == 4 && k3c_engine_pending(e) == 0, "only b continues (%d events)", left);
    int32_t bad[2] = {0, (int32_t)m->cfg.vocab_size};
    CHECK(k3c_engine_submit(e, bad, 2, &r, &a, &err) == K3C_EINVAL, "an id outside the vocabulary is refused");
    CHECK(k3c_engine_submit(e, ids, 0, &r, &a, &err) == K3C_EINVAL, "an empty prompt is refused");
    CHECK(k3c_engine_submit(e, ids, 32, &r, &a, &err) == K3C_EINVAL, "a prompt filling max_ctx is refused");
    CHECK(k3c_engine_step(e, ev, 1, &n, &err) == K3C_EINVAL, "an event buffer smaller than max_seqs is refused");
    k3c_engine_close(e);
}

/* ---------------------------------------------------------------- stored formats */

/* The absorbed views of a bf16 kv_b: uk_t[h] is W_UK,hᵀ exactly, uv[h] the W_UV,h rows. */
static void absorb_bf16(const k3c_model *m) {
    k3c_err err = {0};
    k3c_weights w;
    if (k3c_weights_from_model(m, &w, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    const k3c_config *c = &w.cfg;
    const int64_t H = c->mla_heads, nope = c->qk_nope_dim, dv = c->v_head_dim, rkv = c->kv_lora_rank;
    int l = 0;
    while (c->mixer[l] != K3C_MIXER_MLA) l++;
    k3c_weights_layer *L = &w.layer[l];
    const int64_t rows = L->kv_b.rows;
    uint16_t *kb = k3c_weights_alloc(&w, sizeof(uint16_t) * (size_t)(rows * rkv));
    for (int64_t i = 0; i < rows * rkv; i++) kb[i] = k3c_f32_to_bf16(((const float *)L->kv_b.w)[i]);
    L->kv_b = (k3c_qmat){K3C_QMAT_BF16, rows, rkv, kb, NULL};
    CHECK_OK(k3c_weights_absorb(&w, &err), &err);
    int exact = L->uk_t[0].type == K3C_QMAT_BF16;
    float *a = malloc(sizeof(float) * (size_t)(nope > rkv ? nope : rkv)), *b = malloc(sizeof(float) * (size_t)rkv);
    for (int64_t h = 0; h < H; h++)
        for (int64_t j = 0; j < rkv; j++) {
            k3c_qmat_row(&L->uk_t[h], j, a); /* row j of W_UKᵀ = column j of W_UK */
            for (int64_t i = 0; i < nope; i++) exact &= a[i] == k3c_bf16_to_f32(kb[(h * (nope + dv) + i) * rkv + j]);
        }
    for (int64_t h = 0; h < H; h++)
        for (int64_t r = 0; r < dv; r++) {
            k3c_qmat_row(&L->uv[h], r, a);
            k3c_qmat_row(&L->kv_b, h * (nope + dv) + nope + r, b);
            exact &= !memcmp(a, b, sizeof(float) * (size_t)rkv);
        }
    CHECK(exact, "bf16 kv_b: the absorbed W_UK,hᵀ copies and W_UV,h views are exact");
    free(a);
    free(b);
    k3c_weights_free(&w);
}

/* The engine over the checkpoint's MXFP4 experts, kept packed (per-expert views into the file), gives the logits of
 * the float32 views of the same (exactly decoded) weights, up to summation order. */
static void mxfp4_experts(const k3c_model *m, const char *dir, const int32_t *ids, int64_t T) {
    k3c_err err = {0};
    k3c_weights w;
    k3c_checkpoint *ck;
    if (k3c_weights_from_model(m, &w, &err) || k3c_ckpt_open(dir, &ck, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    int packed = 0;
    for (int l = 0; l < w.cfg.num_layers; l++) {
        if (w.cfg.ffn[l] != K3C_FFN_MOE) continue;
        k3c_qmat *v[3] = {w.layer[l].w1, w.layer[l].w2, w.layer[l].w3};
        for (int64_t e = 0; e < w.cfg.num_experts; e++)
            for (int j = 0; j < 3; j++) {
                char name[256];
                snprintf(name, sizeof name, "%smodel.layers.%d.block_sparse_moe.experts.%lld.w%d.weight_packed",
                         w.cfg.tensor_prefix, l, (long long)e, j + 1);
                const k3c_st_tensor *p = k3c_ckpt_find(ck, name);
                snprintf(name + strlen(name) - 6, 8, "scale");
                const k3c_st_tensor *sc = k3c_ckpt_find(ck, name);
                if (!p || !sc) continue;
                v[j][e] = (k3c_qmat){K3C_QMAT_MXFP4, v[j][e].rows, v[j][e].cols, p->data, sc->data};
                packed++;
            }
    }
    CHECK(packed == 3 * w.cfg.num_experts * k3c_config_num_moe(&w.cfg), "%d expert matrices found packed", packed);
    CHECK_OK(k3c_weights_check(&w, &err), &err);
    k3c_weights f;
    static const int64_t split[] = {7, 1, 1, 1, 11};
    float *got = engine_logits(&w, ids, T, split, 5, NULL, &err), *ref = NULL;
    if (!k3c_weights_from_model(m, &f, &err)) {
        ref = engine_logits(&f, ids, T, split, 5, NULL, &err);
        k3c_weights_free(&f);
    }
    CHECK(got && ref, "%s", err.msg);
    if (got && ref) {
        double *r = malloc(sizeof(double) * (size_t)(T * w.cfg.vocab_size));
        for (int64_t i = 0; i < T * w.cfg.vocab_size; i++) r[i] = ref[i];
        CHECK_LE(worst_row(got, r, T, w.cfg.vocab_size), 1e-5, "MXFP4 expert views vs float32 views, worst row");
        free(r);
    }
    free(got);
    free(ref);
    k3c_ckpt_close(ck);
    k3c_weights_free(&w);
}

static void engine_api(void) {
    const char *dir = test_shared("golden/k3_tiny_a");
    char gpath[512];
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
    k3c_err err = {0};
    k3c_model m;
    k3c_safetensors *gs;
    if (k3c_model_open_f32(dir, 0, &m, &err) || k3c_st_open(gpath, &gs, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    int64_t n;
    int32_t *ids = read_i32(gs, "input_ids", &n);
    golden_greedy(&m, gs);
    absorb_bf16(&m);
    if (ids && n >= 48) {
        mxfp4_experts(&m, dir, ids, 48);
        batching(&m, ids);
        prefix_cache(&m, ids);
        shared_prefill(&m, ids);
        image_prefix(&m, ids);
        api_edges(&m, ids);
    }
    free(ids);
    k3c_st_close(gs);
    k3c_model_free_f32(&m);
}

int main(void) {
    engine_api();
    golden_exact("golden/kimi_linear_tiny_a");
    golden_exact("golden/k3_tiny_a");
    random_k3_exact();
    printf("%d passed, %d failed\n", test_passed_, test_failed_);
    return test_failed_ != 0;
}
