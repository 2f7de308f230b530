/* decode_cpu.c — the CPU table of the inference engine's ops (ops/decode.h): the engine's per-segment sequence mixing
 * (conv tails, KDA state, latent-cache attention with an online softmax over BLAS tiles) and its routed experts grouped
 * by expert. Spec: docs/MODEL.md §3.1, §4.2 (absorbed form), §6.2 + §9.2; docs/ENGINE.md "The step". */
#include "base/carve.h"
#include "base/check.h"
#include "ops/decode.h"
#include "ops/kda.h"
#include "ops/l2norm.h"
#include "ops/short_conv.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#define ATT_BQ 64 /* query rows per attention tile */
#define ATT_BK 64 /* cached tokens per key tile */
#define KDA_CHUNK 16

static int cpu_qmat_mul(void *ctx, const k3c_qmat *W, const float *X, int64_t n, float *Y, int accumulate,
                        k3c_err *err) {
    (void)ctx;
    if (k3c_qmat_check(W, "qmat_mul", err)) return K3C_EINVAL;
    if (n < 0) return k3c_errf(err, K3C_EINVAL, "qmat_mul: negative n %lld", (long long)n);
    k3c_qmat_mul(W, X, n, Y, accumulate);
    return K3C_OK;
}

static int cpu_qmat_mul_many(void *ctx, const k3c_qmat_job *jobs, int njobs, k3c_err *err) {
    (void)ctx, (void)err;
    k3c_qmat_mul_many(jobs, njobs);
    return K3C_OK;
}

static size_t cpu_heads_ws(const k3c_qmat *W, int64_t n) { return sizeof(float) * (size_t)(n * (W->rows + W->cols)); }

/* Gathers each head's rows into a dense block, multiplies, scatters: the products k3c_qmat_mul makes of dense rows. */
static int cpu_qmat_mul_heads(void *ctx, const k3c_qmat *W, int64_t heads, const float *X, int64_t ldx, int64_t hx,
                              int64_t n, float *Y, int64_t ldy, int64_t hy, void *ws, k3c_err *err) {
    (void)ctx, (void)err;
    const int64_t R = W->rows, C = W->cols;
    float *xs = ws, *ys = xs + n * C;
    for (int64_t h = 0; h < heads; h++) {
        for (int64_t j = 0; j < n; j++) memcpy(xs + j * C, X + h * hx + j * ldx, sizeof(float) * (size_t)C);
        k3c_qmat_mul(&W[h], xs, n, ys, 0);
        for (int64_t j = 0; j < n; j++) memcpy(Y + h * hy + j * ldy, ys + j * R, sizeof(float) * (size_t)R);
    }
    return K3C_OK;
}

static int cpu_embed(const k3c_qmat *E, const int32_t *ids, int64_t n, float *y, k3c_err *err) {
    (void)err;
    for (int64_t i = 0; i < n; i++) k3c_qmat_row(E, ids[i], y + i * E->cols);
    return K3C_OK;
}

static int cpu_qkv_conv(const k3c_dec_batch *b, const k3c_dec_dims *d, int64_t off, const float *const x[3],
                        const float *const w[3], float *const y[3], k3c_err *err) {
    const int64_t P = d->H * d->dk;
    for (int i = 0; i < 3; i++)
        for (int s = 0; s < b->nseg; s++) {
            const k3c_dec_seg *g = &b->segs[s];
            float *tail = g->kda + off + i * P * (d->W - 1);
            k3c_short_conv_dims cd = {g->len, P, (int)d->W, 1};
            CHECK_RC(k3c_short_conv_fwd_f32(&cd, NULL, x[i] + g->row0 * P, w[i], tail, y[i] + g->row0 * P, tail, err));
        }
    k3c_l2norm_dims ld = {b->n * d->H, d->dk, 1e-6};
    CHECK_RC(k3c_l2norm_fwd_f32(&ld, y[0], y[0], NULL, err));
    return k3c_l2norm_fwd_f32(&ld, y[1], y[1], NULL, err);
}

static size_t cpu_kda_ws(const k3c_dec_dims *d, int64_t n) {
    k3c_kda_dims kd = {n, d->H, d->dk, d->dk, 1, KDA_CHUNK, 0, 0};
    return k3c_kda_chunk_fwd_workspace_f32(&kd);
}

/* One token: the recurrence is the decode step; a run of tokens: the chunked form, from and into the state. */
static int cpu_kda(const k3c_dec_batch *b, const k3c_dec_dims *d, int64_t off, const float *q, const float *k,
                   const float *v, const float *g, const float *beta, double gate_bound, float *o, void *ws,
                   k3c_err *err) {
    const int64_t P = d->H * d->dk;
    for (int s = 0; s < b->nseg; s++) {
        const k3c_dec_seg *sg = &b->segs[s];
        float *S = sg->kda + off;
        const int64_t r = sg->row0 * P;
        k3c_kda_dims kd = {sg->len, d->H, d->dk, d->dk, 1, KDA_CHUNK, 0, gate_bound};
        if (sg->len == 1)
            CHECK_RC(k3c_kda_recurrent_fwd_f32(&kd, NULL, q + r, k + r, v + r, g + r, beta + sg->row0 * d->H, S, o + r,
                                               S, NULL, err));
        else
            CHECK_RC(k3c_kda_chunk_fwd_f32(&kd, NULL, q + r, k + r, v + r, g + r, beta + sg->row0 * d->H, S, o + r, S,
                                           ws, err));
    }
    return K3C_OK;
}

static float *cache_of(const k3c_dec_dims *d, const k3c_dec_seg *g, int j) {
    return g->mla + (size_t)((j * g->cap) * (d->rkv + d->rope));
}

static int cpu_cache_put(const k3c_dec_batch *b, const k3c_dec_dims *d, int j, const float *cn, const float *kva,
                         k3c_err *err) {
    (void)err;
    const int64_t lw = d->rkv + d->rope;
    for (int s = 0; s < b->nseg; s++) {
        const k3c_dec_seg *g = &b->segs[s];
        float *cache = cache_of(d, g, j) + g->pos * lw;
        for (int64_t t = 0; t < g->len; t++) {
            memcpy(cache + t * lw, cn + (g->row0 + t) * d->rkv, sizeof(float) * (size_t)d->rkv);
            memcpy(cache + t * lw + d->rkv, kva + (g->row0 + t) * lw + d->rkv, sizeof(float) * (size_t)d->rope);
        }
    }
    return K3C_OK;
}

static size_t att_floats(const k3c_dec_dims *d) { return (size_t)(ATT_BQ * ATT_BK + ATT_BQ * d->rkv + 2 * ATT_BQ); }
/* One scratch per processor: the attention runs on at most that many threads, whatever the thread count is later. */
static size_t cpu_attend_ws(const k3c_dec_dims *d) {
    return sizeof(float) * att_floats(d) * (size_t)omp_get_num_procs();
}

/* One (segment, head): queries qlat [len, lat_w] at positions pos0.. attend over the cache [0, pos0+len) with an online
 * softmax over key tiles (MQA: every head reads the one cached [c_KV; k_pe] per token); out [len, rkv]. */
static void attend(const k3c_dec_dims *d, const float *cache, int64_t pos0, const float *qlat, int64_t len, float scale,
                   float *out, float *scr) {
    const int64_t lw = d->rkv + d->rope, rkv = d->rkv;
    float *Sb = scr, *acc = Sb + ATT_BQ * ATT_BK, *mx = acc + ATT_BQ * rkv, *sum = mx + ATT_BQ;
    for (int64_t q0 = 0; q0 < len; q0 += ATT_BQ) {
        const int64_t nq = len - q0 < ATT_BQ ? len - q0 : ATT_BQ, last = pos0 + q0 + nq; /* keys [0, last) */
        for (int64_t i = 0; i < nq; i++) mx[i] = -INFINITY, sum[i] = 0;
        memset(acc, 0, sizeof(float) * (size_t)(nq * rkv));
        for (int64_t k0 = 0; k0 < last; k0 += ATT_BK) {
            const int64_t nk = last - k0 < ATT_BK ? last - k0 : ATT_BK;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)nk, (int)lw, scale, qlat + q0 * lw,
                        (int)lw, cache + k0 * lw, (int)lw, 0.0f, Sb, ATT_BK);
            for (int64_t i = 0; i < nq; i++) {
                const int64_t p = pos0 + q0 + i; /* the query's position: keys j <= p */
                float *s = Sb + i * ATT_BK, m = mx[i];
                for (int64_t j = 0; j < nk; j++)
                    if (k0 + j > p)
                        s[j] = -INFINITY;
                    else if (s[j] > m)
                        m = s[j];
                const float corr = mx[i] == -INFINITY ? 0.0f : expf(mx[i] - m);
                float z = 0;
                for (int64_t j = 0; j < nk; j++) z += s[j] = k0 + j > p ? 0.0f : expf(s[j] - m);
                sum[i] = sum[i] * corr + z;
                mx[i] = m;
                if (corr != 1.0f)
                    for (int64_t e = 0; e < rkv; e++) acc[i * rkv + e] *= corr;
            }
            /* values are the cached latents themselves: the first rkv entries of each cached row */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, (int)rkv, (int)nk, 1.0f, Sb, ATT_BK,
                        cache + k0 * lw, (int)lw, 1.0f, acc, (int)rkv);
        }
        for (int64_t i = 0; i < nq; i++)
            for (int64_t e = 0; e < rkv; e++) out[(q0 + i) * rkv + e] = acc[i * rkv + e] / sum[i];
    }
}

static int cpu_attend(const k3c_dec_batch *b, const k3c_dec_dims *d, int j, const float *qlat, float scale, float *olat,
                      void *ws, k3c_err *err) {
    (void)err;
    const int64_t Hm = d->Hm, n = b->n, lw = d->rkv + d->rope, rkv = d->rkv, jobs = (int64_t)b->nseg * Hm;
    const int procs = omp_get_num_procs(), nthr = k3c_num_threads() < procs ? k3c_num_threads() : procs;
    float *scr = ws;
#pragma omp parallel for schedule(dynamic) num_threads(nthr) if (jobs > 1)
    for (int64_t job = 0; job < jobs; job++) {
        const k3c_dec_seg *g = &b->segs[job / Hm];
        const int64_t h = job % Hm;
        attend(d, cache_of(d, g, j), g->pos, qlat + (h * n + g->row0) * lw, g->len, scale,
               olat + (h * n + g->row0) * rkv, scr + (size_t)omp_get_thread_num() * att_floats(d));
    }
    return K3C_OK;
}

/* The expert step's buffers for n tokens: grouped inputs and outputs [n·k, lat], the GLU's [n·k, I] ×3, slots, counts. */
typedef struct {
    float *xg, *u, *fg, *fu, *fh;
    int32_t *slot, *cnt;
    k3c_qmat_job *jobs; /* 2 × E: one batch of products (k3c_qmat_mul_many) */
} moe_bufs;

static void moe_plan(const k3c_dec_moe *m, int64_t n, k3c_carver *cv, moe_bufs *b) {
    const int64_t nk = n * m->k;
    b->xg = K3C_CARVE(cv, float, nk * m->lat), b->u = K3C_CARVE(cv, float, nk * m->lat);
    b->fg = K3C_CARVE(cv, float, nk * m->inter), b->fu = K3C_CARVE(cv, float, nk * m->inter);
    b->fh = K3C_CARVE(cv, float, nk * m->inter);
    b->slot = K3C_CARVE(cv, int32_t, nk), b->cnt = K3C_CARVE(cv, int32_t, m->E + 1);
    b->jobs = K3C_CARVE(cv, k3c_qmat_job, 2 * m->E);
}

static size_t cpu_moe_ws(const k3c_dec_moe *m, int64_t n) {
    moe_bufs b;
    k3c_carver cv = k3c_carver_measure(64);
    moe_plan(m, n, &cv, &b);
    return cv.off;
}

static int cpu_moe(const k3c_dec_moe *m, const float *x, int64_t n, const int32_t *ids, const float *topw, float *out,
                   void *ws, k3c_err *err) {
    const int64_t E = m->E, k = m->k, lat = m->lat;
    moe_bufs b;
    k3c_carver cv = k3c_carver_at(ws, cpu_moe_ws(m, n), 64);
    moe_plan(m, n, &cv, &b);
    /* group the routed slots by expert (counting sort, stable): one product per expert over all its rows */
    memset(b.cnt, 0, sizeof(int32_t) * (size_t)(E + 1));
    for (int64_t i = 0; i < n * k; i++) b.cnt[ids[i] + 1]++;
    for (int64_t e = 0; e < E; e++) b.cnt[e + 1] += b.cnt[e];
    for (int64_t i = 0; i < n * k; i++) {
        int32_t at = b.slot[i] = b.cnt[ids[i]]++; /* slot i's row in the grouped buffers */
        memcpy(b.xg + at * lat, x + (i / k) * lat, sizeof(float) * (size_t)lat);
    }
    for (int64_t e = E; e > 0; e--) b.cnt[e] = b.cnt[e - 1]; /* back to start offsets */
    b.cnt[0] = 0;
    /* the gate and up products of every active expert as one batch, the GLU over all rows, the down products as one
       batch: the top-k experts of a decode token are one parallel region each time instead of three per expert, and
       each row's products are those of a lone call */
    const int64_t Im = m->inter;
    int nj = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t r0 = b.cnt[e], nr = b.cnt[e + 1] - r0;
        if (nr == 0) continue;
        b.jobs[nj++] = (k3c_qmat_job){&m->w1[e], b.xg + r0 * lat, nr, b.fg + r0 * Im, 0};
        b.jobs[nj++] = (k3c_qmat_job){&m->w3[e], b.xg + r0 * lat, nr, b.fu + r0 * Im, 0};
    }
    k3c_qmat_mul_many(b.jobs, nj);
    k3c_glu_sizes gs = {n * k, Im, m->act};
    CHECK_RC(k3c_glu_fwd_f32(&gs, b.fg, b.fu, b.fh, err));
    nj = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t r0 = b.cnt[e], nr = b.cnt[e + 1] - r0;
        if (nr > 0) b.jobs[nj++] = (k3c_qmat_job){&m->w2[e], b.fh + r0 * Im, nr, b.u + r0 * lat, 0};
    }
    k3c_qmat_mul_many(b.jobs, nj);
    /* combine each token's k expert outputs in slot order */
    for (int64_t t = 0; t < n; t++) {
        float *ut = out + t * lat;
        memset(ut, 0, sizeof(float) * (size_t)lat);
        for (int64_t j = 0; j < k; j++) {
            const float wj = topw[t * k + j], *src = b.u + (int64_t)b.slot[t * k + j] * lat;
            for (int64_t e = 0; e < lat; e++) ut[e] += wj * src[e];
        }
    }
    return K3C_OK;
}

static void *cpu_graph_open(void) { return NULL; }
static void cpu_graph_close(void *g) { (void)g; }
static int cpu_run(void *g, int64_t key, int (*fn)(void *arg, k3c_err *err), void *arg, k3c_err *err) {
    (void)g, (void)key;
    return fn(arg, err);
}

const k3c_dec_ops k3c_dec_cpu = {
    .name = "cpu",
    .qmat_mul = cpu_qmat_mul,
    .qmat_mul_many = cpu_qmat_mul_many,
    .heads_workspace = cpu_heads_ws,
    .qmat_mul_heads = cpu_qmat_mul_heads,
    .embed = cpu_embed,
    .qkv_conv = cpu_qkv_conv,
    .kda_workspace = cpu_kda_ws,
    .kda = cpu_kda,
    .cache_put = cpu_cache_put,
    .attend_workspace = cpu_attend_ws,
    .attend = cpu_attend,
    .moe_workspace = cpu_moe_ws,
    .moe = cpu_moe,
    .glu = k3c_glu_fwd_f32,
    .graph_open = cpu_graph_open,
    .graph_close = cpu_graph_close,
    .run = cpu_run,
};
