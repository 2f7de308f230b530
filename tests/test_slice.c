/* test_slice.c — sliced recompute (docs/TRAINING.md §1.4 "Sliced recompute"): a tiny K3 model (KDA, gated MLA, latent
 * MoE, two AttnRes blocks) whose recomputed layers run in slices of the sequence gives the loss, every gradient and
 * the step statistics of the unsliced model (float64 within 1e-12 relative, float32 within the golden tests'
 * tolerance), over packed documents with slice boundaries inside documents, on a document boundary and one token after
 * a document's start, T not a multiple of the slice, slices shorter than the KDA chunk; bad slices are clear errors;
 * the planned activation arena shrinks with the slice. */
#include "test.h"
#include "ops/backend.h"
#include "model/model.h"
#include "model_step.h"

#define T_TEST 43
/* documents of 11, 13, 15 and 4 tokens: with slices of 8 the boundary at 24 is a document's, the one at 40 falls one
   token after a document's start (the short conv's tail masked), 8, 16 and 32 fall inside documents */
static const int32_t CU[5] = {0, 11, 24, 39, 43};

typedef struct {
    double loss;
    double *g;
    float smax[64];
    int32_t ids[T_TEST * 8];
    float logits[T_TEST * 8];
    int rc;
    char msg[1024];
} run_out;

static int load_cfg(k3c_config *cfg) {
    k3c_err err = {0};
    int rc = k3c_config_load("configs/k3_test_tiny.json", cfg, &err);
    CHECK(rc == K3C_OK, "%s", err.msg);
    return rc;
}

/* One forward + backward; recompute: 0 none, 1 every layer, 2 the odd layers. */
#define RUN_BODY(S)                                                                                                    \
    static void run_##S(const k3c_config *cfg, int chunk, int recompute, int64_t slice, run_out *o) {                  \
        k3c_err err = {0};                                                                                             \
        int32_t ids[T_TEST];                                                                                           \
        for (int t = 0; t < T_TEST; t++) ids[t] = (int32_t)((t * 7 + 5) % 32);                                         \
        k3c_model_batch b = {T_TEST, 4, ids, CU, NULL, 0, 0, NULL, NULL, NULL, NULL};                                  \
        k3c_model m;                                                                                                   \
        memset(o, 0, sizeof *o);                                                                                       \
        if ((o->rc = k3c_model_create_##S(cfg, 1, &m, &err))) {                                                        \
            snprintf(o->msg, sizeof o->msg, "%s", err.msg);                                                            \
            return;                                                                                                    \
        }                                                                                                              \
        k3c_model_init_##S(&m, 3, 0.3);                                                                                \
        m.kda_chunk = chunk;                                                                                           \
        m.recompute_slice = slice;                                                                                     \
        for (int l = 0; l < cfg->num_layers; l++) m.recompute[l] = recompute == 1 || (recompute == 2 && l % 2);        \
        k3c_step_stats stats;                                                                                          \
        o->rc = k3c_step_stats_init_##S(&m, T_TEST, &stats, &err);                                                     \
        m.stats = o->rc ? NULL : &stats;                                                                               \
        if (!o->rc) o->rc = test_model_step_##S(&m, &b, &o->loss, &o->g, &err);                                      \
        if (!o->rc) {                                                                                                  \
            memcpy(o->smax, stats.smax, sizeof(float) * (size_t)(cfg->num_layers * cfg->mla_heads));                   \
            const k3c_route_stats *r = &stats.route[2]; /* an MoE layer that recomputes in every mode */               \
            CHECK(r->T == T_TEST && r->k * T_TEST <= T_TEST * 8 && r->n * T_TEST <= T_TEST * 8,                        \
                  "route statistics of %lld tokens", (long long)r->T);                                                 \
            memcpy(o->ids, r->topk_ids, sizeof(int32_t) * (size_t)(r->k * T_TEST));                                    \
            memcpy(o->logits, r->logits, sizeof(float) * (size_t)(r->n * T_TEST));                                     \
        } else {                                                                                                       \
            snprintf(o->msg, sizeof o->msg, "%s", err.msg);                                                            \
        }                                                                                                              \
        if (m.stats) k3c_step_stats_free_##S(&m, &stats);                                                              \
        k3c_model_free_##S(&m);                                                                                        \
    }
RUN_BODY(f64)
RUN_BODY(f32)

static void compare(const k3c_config *cfg, const char *what, const run_out *o, const run_out *ref, double tol) {
    char name[160];
    if (o->rc || ref->rc) {
        CHECK(0, "%s: %s", what, o->rc ? o->msg : ref->msg);
        return;
    }
    snprintf(name, sizeof name, "%s: loss rel err", what);
    CHECK_LE(fabs(o->loss - ref->loss) / fabs(ref->loss), tol, name);
    snprintf(name, sizeof name, "%s: worst gradient rel err", what);
    CHECK_LE(test_worst_param_err(cfg, o->g, ref->g, NULL), tol, name);
    double ds = 0;
    const int nsm = (int)(cfg->num_layers * cfg->mla_heads);
    for (int i = 0; i < nsm; i++) ds = fmax(ds, fabs(o->smax[i] - ref->smax[i]) / fmax(fabs(ref->smax[i]), 1e-30));
    snprintf(name, sizeof name, "%s: S_max rel err", what);
    CHECK_LE(ds, fmax(tol, 1e-7), name); /* S_max is float32 in both precisions */
    CHECK(ref->smax[2 * cfg->mla_heads] != 0, "%s: the MLA layer recorded no S_max", what);
    CHECK(memcmp(o->ids, ref->ids, sizeof o->ids) == 0, "%s: routed experts differ", what);
    double dl = 0;
    for (int i = 0; i < T_TEST * 8; i++) dl = fmax(dl, fabs((double)o->logits[i] - ref->logits[i]));
    snprintf(name, sizeof name, "%s: router logits (float32) max abs err", what);
    CHECK_LE(dl, fmax(tol, 1e-6), name);
}

static void sliced_equals_unsliced(void) {
    k3c_config cfg;
    if (load_cfg(&cfg)) return;
    const int chunks[2] = {16, 0};
    const int64_t slices[5] = {8, 5, 16, 3, 42};
    for (int c = 0; c < 2; c++) {
        run_out ref;
        run_f64(&cfg, chunks[c], 0, 0, &ref);
        for (int s = 0; s < 5; s++)
            for (int rec = 1; rec <= 2; rec++) {
                run_out o;
                char what[128];
                run_f64(&cfg, chunks[c], rec, slices[s], &o);
                snprintf(what, sizeof what, "f64 chunk %d, slice %lld, recompute %s", chunks[c], (long long)slices[s],
                         rec == 1 ? "all" : "odd layers");
                compare(&cfg, what, &o, &ref, 1e-12);
                free(o.g);
            }
        free(ref.g);
    }
    /* float32: the slices sum the parameter gradients in another order and the chunked KDA aligns its chunks to the
       slice, so the bits differ; the golden tests' tolerance */
    run_out ref, o;
    run_f32(&cfg, 16, 1, 0, &ref);
    run_f32(&cfg, 16, 1, 8, &o);
    compare(&cfg, "f32 chunk 16, slice 8", &o, &ref, 1e-4);
    free(o.g);
    free(ref.g);
}

/* The model as pipeline stages (layer ranges) with sliced layers: a later stage reads its boundary tensors in place
 * (the AttnRes block sources before it among them) and leaves their gradients. */
static void stages_sliced(void) {
    k3c_config cfg;
    if (load_cfg(&cfg)) return;
    enum { MAXS = 5 };
    static const int cuts[][MAXS] = {{0, 3, 4}, {0, 1, 2, 3, 4}};
    static const int n_cuts[] = {3, 5};
    const int64_t T = T_TEST, D = cfg.hidden_size;
    k3c_err err = {0};
    int32_t ids[T_TEST];
    for (int t = 0; t < T_TEST; t++) ids[t] = (int32_t)((t * 7 + 5) % 32);
    k3c_model_batch b = {T_TEST, 4, ids, CU, NULL, 0, 0, NULL, NULL, NULL, NULL};
    run_out ref;
    run_f64(&cfg, 16, 0, 0, &ref);
    for (int c = 0; c < 2 && !ref.rc; c++) {
        const int S = n_cuts[c] - 1;
        k3c_model m[MAXS];
        k3c_arena ar[MAXS];
        k3c_acts *acts[MAXS];
        double *bnd[MAXS], *grd[MAXS], loss = 0;
        for (int s = 0; s < S; s++) {
            CHECK_OK(k3c_model_create_f64(&cfg, 1, &m[s], &err), &err);
            k3c_model_init_f64(&m[s], 3, 0.3);
            m[s].kda_chunk = 16;
            m[s].recompute_slice = 8;
            for (int l = 0; l < cfg.num_layers; l++) m[s].recompute[l] = 1;
            size_t plan = k3c_model_plan_bytes_range_f64(&m[s], T, 4, cuts[c][s], cuts[c][s + 1]);
            CHECK_OK(k3c_arena_init(&ar[s], plan, &err), &err);
            double *in[K3C_ATTNRES_MAX_SOURCES], *x[K3C_ATTNRES_MAX_SOURCES], l = 0;
            for (int k = 0; s > 0 && k < K3C_ATTNRES_MAX_SOURCES; k++) in[k] = bnd[s - 1] + k * T * D;
            CHECK_OK(k3c_model_forward_range_f64(&m[s], &b, cuts[c][s], cuts[c][s + 1], in, &ar[s], &acts[s], &l, &err),
                     &err);
            loss += l;
            int n = s + 1 < S ? k3c_acts_boundary_f64(acts[s], 0, x) : 0;
            bnd[s] = malloc(sizeof(double) * (size_t)(n * T * D + 1));
            grd[s] = malloc(sizeof(double) * (size_t)(n * T * D + 1));
            for (int k = 0; k < n; k++) memcpy(bnd[s] + k * T * D, x[k], sizeof(double) * T * D);
        }
        run_out o = {.loss = loss, .rc = 0};
        o.g = calloc(m[0].table.total, sizeof(double));
        for (int s = S - 1; s >= 0; s--) {
            const double *dout[K3C_ATTNRES_MAX_SOURCES];
            double *dx[K3C_ATTNRES_MAX_SOURCES];
            for (int k = 0; k < K3C_ATTNRES_MAX_SOURCES; k++) dout[k] = grd[s] + k * T * D;
            CHECK_OK(k3c_model_backward_range_f64(&m[s], acts[s], 1.0, s + 1 < S ? dout : NULL, &err), &err);
            int n = s > 0 ? k3c_acts_boundary_f64(acts[s], 1, dx) : 0;
            for (int k = 0; k < n; k++) memcpy(grd[s - 1] + k * T * D, dx[k], sizeof(double) * T * D);
            for (size_t i = 0; i < m[s].table.total; i++) o.g[i] += ((double *)m[s].g)[i];
        }
        char what[96], name[160];
        snprintf(what, sizeof what, "f64 %d stages, slices of 8", S);
        snprintf(name, sizeof name, "%s: loss rel err", what);
        CHECK_LE(fabs(o.loss - ref.loss) / fabs(ref.loss), 1e-12, name);
        snprintf(name, sizeof name, "%s: worst gradient rel err", what);
        CHECK_LE(test_worst_param_err(&cfg, o.g, ref.g, NULL), 1e-12, name);
        free(o.g);
        for (int s = 0; s < S; s++) {
            free(bnd[s]);
            free(grd[s]);
            k3c_arena_free(&ar[s]);
            k3c_model_free_f64(&m[s]);
        }
    }
    free(ref.g);
}

/* Bad slices and settings that cannot run in slices: clear errors naming the setting, nothing run. */
static void bad_slices(void) {
    k3c_config cfg;
    if (load_cfg(&cfg)) return;
    run_out o;
    run_f64(&cfg, 16, 1, 2, &o);
    CHECK(o.rc == K3C_EINVAL && strstr(o.msg, "recompute_slice = 2") && strstr(o.msg, "tail"),
          "slice of 2 tokens (the conv tail is 3): rc %d '%s'", o.rc, o.msg);
    free(o.g);
    run_f64(&cfg, 16, 1, -4, &o);
    CHECK(o.rc == K3C_EINVAL && strstr(o.msg, "recompute_slice = -4"), "negative slice: rc %d '%s'", o.rc, o.msg);
    free(o.g);
    run_f64(&cfg, 16, 0, 2, &o); /* no layer recomputes: the slice is unused */
    CHECK(o.rc == K3C_OK, "slice without recompute: %s", o.msg);
    free(o.g);
    k3c_err err = {0};
    k3c_model m;
    CHECK_OK(k3c_model_create_f64(&cfg, 1, &m, &err), &err);
    k3c_model_init_f64(&m, 3, 0.3);
    m.recompute_slice = 8;
    m.recompute[1] = 1;
    m.aux_loss_alpha = 1e-3;
    int32_t ids[T_TEST] = {0};
    k3c_model_batch b = {T_TEST, 4, ids, CU, NULL, 0, 0, NULL, NULL, NULL, NULL};
    k3c_arena ar;
    k3c_acts *acts;
    double loss;
    CHECK_OK(k3c_arena_init(&ar, k3c_model_plan_bytes_f64(&m, T_TEST, 4), &err), &err);
    int rc = k3c_model_forward_f64(&m, &b, &ar, &acts, &loss, NULL, &err);
    CHECK(rc == K3C_EUNSUPPORTED && strstr(err.msg, "auxiliary"), "slices with the auxiliary loss: rc %d '%s'", rc,
          err.msg);
    k3c_arena_free(&ar);
    k3c_model_free_f64(&m);
}

/* The planned activation arena of a long sequence shrinks with the slice. */
static void plan_shrinks(void) {
    k3c_config cfg;
    if (load_cfg(&cfg)) return;
    k3c_err err = {0};
    k3c_model m;
    CHECK_OK(k3c_model_create_f32(&cfg, 1, &m, &err), &err);
    m.kda_chunk = 16;
    size_t none = k3c_model_plan_bytes_f32(&m, 4096, 1);
    for (int l = 0; l < cfg.num_layers; l++) m.recompute[l] = 1;
    size_t whole = k3c_model_plan_bytes_f32(&m, 4096, 1);
    m.recompute_slice = 512;
    size_t sliced = k3c_model_plan_bytes_f32(&m, 4096, 1);
    m.recompute_slice = 4096;
    size_t one = k3c_model_plan_bytes_f32(&m, 4096, 1);
    printf("  planned bytes, T = 4096: no recompute %zu, recompute %zu, recompute in slices of 512 %zu\n", none, whole,
           sliced);
    CHECK(sliced < whole && whole < none, "slices of 512 plan %zu bytes, the whole layer %zu", sliced, whole);
    CHECK(one == whole, "a slice of the whole sequence plans %zu bytes, not the unsliced %zu", one, whole);
    k3c_model_free_f32(&m);
}

int main(void) {
    sliced_equals_unsliced();
    stages_sliced();
    bad_slices();
    plan_shrinks();
    return test_summary();
}
