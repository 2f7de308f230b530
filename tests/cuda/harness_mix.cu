/* harness_mix.cu — runs the CUDA twins of src/cuda/mix.cu (AttnRes fwd / bwd, QK-Clip S_max, zero / add / copy2d)
 * against their CPU float32 ops from libk3c.a on fresh random inputs (seed printed), outputs poisoned with NaN,
 * gradients pre-filled (the backward adds). fp32 tolerance 1e-5 relative; moves exact. docs/CODE.md "Ops". */
#include <time.h>

#include <algorithm>

#include "cuda/cuda_ops.h"
#include "cuda/testing.cuh"

extern "C" {
#include "ops/basic.h"
}

/* A pass / fail line for an exact expectation (return codes, untouched buffers). */
static void expect(harness &h, const char *op, const std::string &shape, const char *what, bool cond) {
    const float got = cond ? 1.f : 0.f, want = 1.f;
    h.compare(op, shape, what, &got, &want, 1, 0.0);
}

/* ‖x − ref‖ / ‖ref − base‖, the measure of harness::compare. */
static double rel_err(const float *x, const float *ref, size_t n, const float *base) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double b = base ? base[i] : 0.0, d = (double)x[i] - ref[i];
        num += d * d, den += ((double)ref[i] - b) * ((double)ref[i] - b);
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---------------------------------------------------------------- AttnRes
 * The dv slots of a case: own buffer, NULL, or an alias of an earlier slot (a source read twice). */
static int dv_slot(int N, int i) {
    if (N == 2 && i == 1) return -1;   /* NULL */
    if (N >= 3 && i == 2) return 1;    /* aliases slot 1 (adjacent) */
    if (N >= 4 && i == 3) return -1;   /* NULL */
    if (N >= 9 && i == 8) return 0;    /* aliases slot 0 (distant) */
    if (N > 130 && i == 130) return 1; /* aliases slot 1 across the 128-source launch groups */
    return i;
}

struct attnres_opts {
    bool dv = true, dw = true, dgamma = true;
};

/* Gradient buffers of one case: dv per owning slot (empty for NULL / aliased slots), dw, dgamma. */
struct grads {
    std::vector<std::vector<float>> dv;
    std::vector<float> dw, dg;
};

static int bwd_op(const k3c_attnres_sizes *s, const float *const *v, const float *w, const float *g, const float *sv,
                  const float *dh, float *const *dv, float *dw, float *dg, void *ws, k3c_err *err) {
    return k3c_attnres_bwd_f32(s, v, w, g, sv, dh, dv, dw, dg, ws, err);
}
static int bwd_op(const k3c_attnres_sizes *s, const double *const *v, const double *w, const double *g,
                  const double *sv, const double *dh, double *const *dv, double *dw, double *dg, void *ws,
                  k3c_err *err) {
    return k3c_attnres_bwd_f64(s, v, w, g, sv, dh, dv, dw, dg, ws, err);
}
template <typename real> static std::vector<real> conv(const std::vector<float> &x) {
    return std::vector<real>(x.begin(), x.end());
}

/* The CPU backward in `real` on the case's float inputs (exactly converted), adding into copies of g0; the dv slots
 * share buffers as `slot` says. Returned as float. */
template <typename real>
static grads cpu_bwd(harness &h, const k3c_attnres_sizes &s, const std::vector<std::vector<float>> &v,
                     const std::vector<float> &w, const std::vector<float> &gamma, const float *saved,
                     const std::vector<float> &dh, const std::vector<int> &slot, const grads &g0,
                     const attnres_opts &o) {
    const int N = (int)s.sources;
    std::vector<std::vector<real>> vr(N), dvr(N);
    std::vector<const real *> vp(N);
    std::vector<real *> dp(N, nullptr);
    for (int i = 0; i < N; i++) vr[i] = conv<real>(v[i]), vp[i] = vr[i].data();
    for (int i = 0; i < N; i++)
        if (slot[i] == i) dvr[i] = conv<real>(g0.dv[i]);
    for (int i = 0; i < N; i++)
        if (slot[i] >= 0) dp[i] = dvr[slot[i]].data();
    std::vector<real> wr = conv<real>(w), gr = conv<real>(gamma), dhr = conv<real>(dh), dw = conv<real>(g0.dw),
                      dg = conv<real>(g0.dg), sv;
    if (saved) sv.assign(saved, saved + 2 * s.tokens * s.sources);
    const size_t bytes = sizeof(real) == 4 ? k3c_attnres_workspace_f32(&s) : k3c_attnres_workspace_f64(&s);
    void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64);
    h.ok(bwd_op(&s, vp.data(), wr.data(), gr.data(), saved ? sv.data() : nullptr, dhr.data(),
                o.dv ? dp.data() : nullptr, o.dw ? dw.data() : nullptr, o.dgamma ? dg.data() : nullptr, ws, &h.err),
         "cpu attnres_bwd");
    free(ws);
    grads out;
    out.dv.resize(N);
    for (int i = 0; i < N; i++)
        if (slot[i] == i) out.dv[i].assign(dvr[i].begin(), dvr[i].end());
    out.dw.assign(dw.begin(), dw.end()), out.dg.assign(dg.begin(), dg.end());
    return out;
}

static void test_attnres(harness &h, k3c_rng *r, int T, int D, int N, attnres_opts o = {}) {
    k3c_attnres_sizes s = {T, D, N, 1e-5};
    const size_t td = (size_t)T * D, tn = (size_t)T * N;
    const std::string shape =
        fmt("T%d D%d N%d%s%s%s", T, D, N, o.dv ? "" : " dv=NULL", o.dw ? "" : " dw=NULL", o.dgamma ? "" : " dg=NULL");
    std::vector<std::vector<float>> v(N);
    std::vector<const float *> vh(N), vd(N);
    std::vector<dbuf *> vbuf(N);
    for (int i = 0; i < N; i++) {
        v[i] = randn(r, td, 0.5 + 1.5 * k3c_rng_uniform(r)); /* sources of different scales */
        vh[i] = v[i].data();
        vbuf[i] = upload(h, v[i]);
        vd[i] = vbuf[i]->as<float>();
    }
    std::vector<float> w = randn(r, D, 2.0 / sqrt((double)D)), gamma(D), dh = randn(r, td);
    for (auto &g : gamma) g = (float)(1.0 + 0.3 * k3c_rng_normal(r));
    dbuf *w_d = upload(h, w), *g_d = upload(h, gamma), *ddh = upload(h, dh);

    /* forward: h and saved (rstd [T, N], α [T, N]); then h again without saved */
    std::vector<float> href(td), sref(2 * tn);
    h.ok(k3c_attnres_fwd_f32(&s, vh.data(), w.data(), gamma.data(), href.data(), sref.data(), &h.err),
         "cpu attnres_fwd");
    dbuf gh(h, td * 4), gs(h, 2 * tn * 4);
    gh.poison(h), gs.poison(h);
    h.ok(
        k3c_attnres_fwd_cuda(&s, vd.data(), w_d->as<float>(), g_d->as<float>(), gh.as<float>(), gs.as<float>(), &h.err),
        "attnres_fwd_cuda");
    std::vector<float> t = download<float>(h, gh), sv = download<float>(h, gs);
    h.compare("attnres_fwd", shape, "h", t.data(), href.data(), td, 1e-5);
    h.compare("attnres_fwd", shape, "rstd", sv.data(), sref.data(), tn, 1e-5);
    h.compare("attnres_fwd", shape, "alpha", sv.data() + tn, sref.data() + tn, tn, 1e-5);
    gh.poison(h);
    h.ok(k3c_attnres_fwd_cuda(&s, vd.data(), w_d->as<float>(), g_d->as<float>(), gh.as<float>(), nullptr, &h.err),
         "attnres_fwd_cuda (no saved)");
    t = download<float>(h, gh);
    h.compare("attnres_fwd (no saved)", shape, "h", t.data(), href.data(), td, 1e-5);

    /* backward, from the CPU forward's saved buffer and recomputing; every gradient pre-filled */
    std::vector<int> slot(N);
    std::vector<int> owners; /* slots that own a buffer */
    for (int i = 0; i < N; i++) {
        slot[i] = dv_slot(N, i);
        if (slot[i] == i) owners.push_back(i);
    }
    grads g0;
    g0.dv.resize(N);
    for (int i : owners) g0.dv[i] = randn(r, td);
    g0.dw = randn(r, D), g0.dg = randn(r, D);
    dbuf *sref_d = upload(h, sref), gws(h, std::max<size_t>(k3c_attnres_workspace_cuda(&s), 1));
    for (int use_saved = 1; use_saved >= 0; use_saved--) {
        const char *op = use_saved ? "attnres_bwd (saved)" : "attnres_bwd (recompute)";
        const float *sv_h = use_saved ? sref.data() : nullptr;
        const grads r32 = cpu_bwd<float>(h, s, v, w, gamma, sv_h, dh, slot, g0, o);
        const grads r64 = cpu_bwd<double>(h, s, v, w, gamma, sv_h, dh, slot, g0, o);
        std::vector<float *> pd(N, nullptr);
        std::vector<dbuf *> gb(N, nullptr);
        for (int i : owners) gb[i] = upload(h, g0.dv[i]);
        for (int i = 0; i < N; i++)
            if (slot[i] >= 0) pd[i] = gb[slot[i]]->as<float>();
        dbuf *gdw = upload(h, g0.dw), *gdg = upload(h, g0.dg);
        gws.poison(h);
        h.ok(k3c_attnres_bwd_cuda(&s, vd.data(), w_d->as<float>(), g_d->as<float>(),
                                  use_saved ? sref_d->as<float>() : nullptr, ddh->as<float>(),
                                  o.dv ? pd.data() : nullptr, o.dw ? gdw->as<float>() : nullptr,
                                  o.dgamma ? gdg->as<float>() : nullptr, gws.p, &h.err),
             "attnres_bwd_cuda");
        /* Against the float32 op: 1e-4, because dz_i = α_i (dp_i − Σ_j α_j dp_j) cancels and so amplifies the last-bit
         * differences of dp (and, recomputing, of rstd and α): D-long sums in another order. Measured over 5 seeds:
         * at most 2e-5 here, while the CPU float32 op is itself up to 2.5e-4 from float64 on such draws (dgamma at
         * T1 D200 N2). Against the float64 op on the same inputs (given the same float saved statistics): the twin must be
         * about as accurate as the float32 op, i.e. within max(3e-5, 3 × the float32 op's own error) (measured: at
         * most 8e-6 where the float32 op was within 5e-6, and at most 1.1 × its error elsewhere). */
        const double tol32 = 1e-4;
        auto tol64 = [](const std::vector<float> &cpu32, const std::vector<float> &cpu64, const float *base) {
            return std::max(3e-5, 3 * rel_err(cpu32.data(), cpu64.data(), cpu32.size(), base));
        };
        for (int i : owners) {
            t = download<float>(h, *gb[i]);
            int users = 0;
            for (int j = 0; j < N; j++) users += slot[j] == i;
            const std::string what = users > 1 ? fmt("dv%d+", i) : fmt("dv%d", i);
            if (o.dv) {
                h.compare(op, shape, what.c_str(), t.data(), r32.dv[i].data(), td, tol32, g0.dv[i].data());
                h.compare(op, shape, (what + " f64").c_str(), t.data(), r64.dv[i].data(), td,
                          tol64(r32.dv[i], r64.dv[i], g0.dv[i].data()), g0.dv[i].data());
            } else {
                expect(h, op, shape, "dv untouched", t == g0.dv[i]);
            }
        }
        const float *bw = o.dw ? g0.dw.data() : nullptr, *bg = o.dgamma ? g0.dg.data() : nullptr;
        t = download<float>(h, *gdw);
        h.compare(op, shape, "dw", t.data(), r32.dw.data(), D, tol32, bw);
        h.compare(op, shape, "dw f64", t.data(), r64.dw.data(), D, tol64(r32.dw, r64.dw, bw), bw);
        t = download<float>(h, *gdg);
        h.compare(op, shape, "dgamma", t.data(), r32.dg.data(), D, tol32, bg);
        h.compare(op, shape, "dgamma f64", t.data(), r64.dg.data(), D, tol64(r32.dg, r64.dg, bg), bg);
        for (auto *b : gb) delete b;
        delete gdw, delete gdg;
    }
    for (auto *b : vbuf) delete b;
    delete w_d, delete g_d, delete ddh, delete sref_d;
}

/* Bad sizes are K3C_EINVAL; T = 0 is a no-op. */
static void test_attnres_edges(harness &h) {
    const std::string shape = "edges";
    float dummy = 0.f;
    const float *v1[1] = {&dummy};
    k3c_attnres_sizes bad0 = {4, 8, 0, 1e-6}, bad257 = {4, 8, 257, 1e-6}, badeps = {4, 8, 1, -1.0};
    expect(h, "attnres_fwd_cuda", shape, "N=0",
           k3c_attnres_fwd_cuda(&bad0, v1, nullptr, nullptr, nullptr, nullptr, &h.err) == K3C_EINVAL);
    expect(h, "attnres_fwd_cuda", shape, "N=257",
           k3c_attnres_fwd_cuda(&bad257, v1, nullptr, nullptr, nullptr, nullptr, &h.err) == K3C_EINVAL);
    expect(h, "attnres_bwd_cuda", shape, "eps<0",
           k3c_attnres_bwd_cuda(&badeps, v1, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                &h.err) == K3C_EINVAL);
    /* T = 0: nothing read or written, dw unchanged, no workspace needed */
    std::vector<float> w0 = {1.f, 2.f, 3.f};
    dbuf *dw = upload(h, w0), *g = upload(h, w0);
    const float *vz[2] = {g->as<float>(), g->as<float>()};
    k3c_attnres_sizes z = {0, 3, 2, 1e-6};
    expect(h, "attnres_fwd_cuda", shape, "T=0",
           k3c_attnres_fwd_cuda(&z, vz, g->as<float>(), g->as<float>(), nullptr, nullptr, &h.err) == 0);
    expect(h, "attnres_bwd_cuda", shape, "T=0",
           k3c_attnres_bwd_cuda(&z, vz, g->as<float>(), g->as<float>(), nullptr, nullptr, nullptr, dw->as<float>(),
                                nullptr, nullptr, &h.err) == 0);
    expect(h, "attnres_bwd_cuda", shape, "T=0 dw", download<float>(h, *dw) == w0);
    delete dw, delete g;
}

/* ---------------------------------------------------------------- QK-Clip S_max */
struct ml_case {
    int T, H, dqk;
    std::vector<int32_t> cu; /* empty = one document */
};

/* Independent reference: a plain double loop over the causal, document-masked pairs. */
static std::vector<double> smax_loop(const ml_case &c, double scale, const std::vector<float> &q,
                                     const std::vector<float> &k) {
    std::vector<double> m(c.H, -INFINITY);
    const std::vector<int32_t> cu = c.cu.empty() ? std::vector<int32_t>{0, c.T} : c.cu;
    for (size_t d = 0; d + 1 < cu.size(); d++)
        for (int i = cu[d]; i < cu[d + 1]; i++)
            for (int j = cu[d]; j <= i; j++)
                for (int hh = 0; hh < c.H; hh++) {
                    const float *qi = &q[((size_t)i * c.H + hh) * c.dqk], *kj = &k[((size_t)j * c.H + hh) * c.dqk];
                    double dot = 0;
                    for (int e = 0; e < c.dqk; e++) dot += (double)qi[e] * kj[e];
                    m[hh] = std::max(m[hh], scale * dot);
                }
    return m;
}

static k3c_attention_sizes ml_sizes(const ml_case &c) {
    k3c_attention_sizes s = {};
    s.T = c.T, s.H = c.H, s.dqk = c.dqk, s.dv = c.dqk, s.n_docs = c.cu.empty() ? 0 : (int64_t)c.cu.size() - 1;
    s.scale = 1.0 / sqrt((double)c.dqk);
    return s;
}

static void test_max_logit(harness &h, k3c_rng *r, const ml_case &c) {
    const k3c_attention_sizes s = ml_sizes(c);
    const size_t tq = (size_t)c.T * c.H * c.dqk;
    const std::string shape = fmt("T%d H%d dqk%d docs%d", c.T, c.H, c.dqk, c.cu.empty() ? 1 : (int)c.cu.size() - 1);
    std::vector<float> q = randn(r, tq, 1.5), k = randn(r, tq, 1.5), ref(c.H);
    const int32_t *cu_h = c.cu.empty() ? nullptr : c.cu.data();
    h.ok(k3c_attention_max_logit_f32(&s, cu_h, q.data(), k.data(), ref.data(), &h.err), "cpu attention_max_logit");
    std::vector<double> loop = smax_loop(c, s.scale, q, k);
    std::vector<float> loopf(loop.begin(), loop.end());
    dbuf *dq = upload(h, q), *dk = upload(h, k), *dcu = c.cu.empty() ? nullptr : upload(h, c.cu);
    const int32_t *cud = dcu ? dcu->as<int32_t>() : nullptr;
    dbuf gm(h, (size_t)c.H * 4);
    gm.poison(h);
    h.ok(k3c_attention_max_logit_cuda(&s, cud, dq->as<float>(), dk->as<float>(), gm.as<float>(), &h.err),
         "attention_max_logit_cuda");
    std::vector<float> got = download<float>(h, gm);
    h.compare("attention_max_logit", shape, "smax", got.data(), ref.data(), c.H, 1e-5);
    h.compare("attention_max_logit", shape, "vs loop", got.data(), loopf.data(), c.H, 1e-5);

    /* an infinite query entry makes its head's maximum +inf (k > 0 somewhere before it): K3C_ENUMERIC, as the CPU */
    if (c.T >= 2) {
        const int i = c.cu.empty() ? c.T - 1 : c.cu[3] - 1, hh = c.H - 1; /* the last token of a long document */
        q[((size_t)i * c.H + hh) * c.dqk] = INFINITY;
        k[((size_t)i * c.H + hh) * c.dqk] = 1.f; /* so its logit with itself is +inf */
        dbuf *dq2 = upload(h, q);
        delete dk;
        dk = upload(h, k);
        const int rc_cpu = k3c_attention_max_logit_f32(&s, cu_h, q.data(), k.data(), ref.data(), &h.err);
        const int rc = k3c_attention_max_logit_cuda(&s, cud, dq2->as<float>(), dk->as<float>(), gm.as<float>(), &h.err);
        expect(h, "attention_max_logit", shape, "inf→ENUMERIC", rc == K3C_ENUMERIC && rc_cpu == K3C_ENUMERIC);
        delete dq2;
    }
    delete dq, delete dk, delete dcu;
}

static void test_max_logit_edges(harness &h) {
    const std::string shape = "edges";
    ml_case c = {0, 3, 48, {}};
    k3c_attention_sizes s = ml_sizes(c);
    dbuf gm(h, 3 * 4), dq(h, 4 * 48 * 3 * 4);
    gm.poison(h);
    expect(h, "attention_max_logit", shape, "T=0 rc",
           k3c_attention_max_logit_cuda(&s, nullptr, dq.as<float>(), dq.as<float>(), gm.as<float>(), &h.err) == 0);
    std::vector<float> m = download<float>(h, gm);
    expect(h, "attention_max_logit", shape, "T=0 -inf", m[0] == -INFINITY && m[1] == -INFINITY && m[2] == -INFINITY);
    h.ok(k3c_cuda_fill_u8(dq.p, 0, dq.bytes, &h.err), "zero q");
    const std::vector<std::vector<int32_t>> bad = {{0, 3, 1, 4}, {0, 2, 3}, {1, 2, 4}};
    for (size_t b = 0; b < bad.size(); b++) {
        c = {4, 3, 48, bad[b]};
        s = ml_sizes(c);
        dbuf *dcu = upload(h, bad[b]);
        const int rc = k3c_attention_max_logit_cuda(&s, dcu->as<int32_t>(), dq.as<float>(), dq.as<float>(),
                                                    gm.as<float>(), &h.err);
        expect(h, "attention_max_logit", shape, fmt("bad cu %zu", b).c_str(), rc == K3C_EINVAL);
        delete dcu;
    }
}

__global__ void fill_kernel(float *p, size_t n, float sd, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (seed + i) * 0x9E3779B97F4A7C15ull;
        z ^= z >> 31, z *= 0x94D049BB133111EBull, z ^= z >> 29;
        p[i] = ((float)(z >> 40) * (1.0f / 16777216.0f) - 0.5f) * 3.4641016f * sd;
    }
}

/* One timing: T = 65536, dqk = 192, one document, H heads; median of 3 after a warm-up. */
static void time_max_logit(harness &h, int H) {
    ml_case c = {65536, H, 192, {}};
    const k3c_attention_sizes s = ml_sizes(c);
    const size_t tq = (size_t)c.T * c.H * c.dqk;
    dbuf q(h, tq * 4), k(h, tq * 4), m(h, (size_t)H * 4);
    fill_kernel<<<4096, 256, 0, cudaStreamPerThread>>>(q.as<float>(), tq, 1.f, 11);
    fill_kernel<<<4096, 256, 0, cudaStreamPerThread>>>(k.as<float>(), tq, 1.f, 12);
    std::vector<float> ms;
    for (int rep = 0; rep < 4; rep++) {
        cudaEvent_t a, b;
        cudaEventCreate(&a), cudaEventCreate(&b);
        cudaEventRecord(a, cudaStreamPerThread);
        h.ok(k3c_attention_max_logit_cuda(&s, nullptr, q.as<float>(), k.as<float>(), m.as<float>(), &h.err),
             "max_logit (timing)");
        cudaEventRecord(b, cudaStreamPerThread);
        h.ok(k3c_cuda_sync(&h.err), "sync (timing)");
        float e;
        cudaEventElapsedTime(&e, a, b);
        cudaEventDestroy(a), cudaEventDestroy(b);
        if (rep) ms.push_back(e);
    }
    std::sort(ms.begin(), ms.end());
    const double flops = 2.0 * c.dqk * H * ((double)c.T * (c.T + 1) / 2);
    printf("TIMING attention_max_logit_cuda T65536 H%d dqk192: %.2f ms (%.1f TFLOP/s useful fp32)\n", H, ms[1],
           flops / (ms[1] * 1e-3) / 1e12);
    fflush(stdout);
}

/* One timing of the mix at model size (T = 8192, D = 4096, N = 9, every dv its own buffer): median of 3 after a
 * warm-up, with the bytes the kernels move (fwd: v twice, h; bwd: v twice, dh twice, dv read + written). */
static void time_attnres(harness &h) {
    const int T = 8192, D = 4096, N = 9;
    k3c_attnres_sizes s = {T, D, N, 1e-6};
    const size_t td = (size_t)T * D;
    std::vector<dbuf *> vb, gb;
    std::vector<const float *> vp;
    std::vector<float *> gp;
    for (int i = 0; i < N; i++) {
        vb.push_back(new dbuf(h, td * 4)), gb.push_back(new dbuf(h, td * 4));
        fill_kernel<<<4096, 256, 0, cudaStreamPerThread>>>(vb[i]->as<float>(), td, 0.5f + 0.1f * i, 100 + i);
        fill_kernel<<<4096, 256, 0, cudaStreamPerThread>>>(gb[i]->as<float>(), td, 1.f, 200 + i);
        vp.push_back(vb[i]->as<float>()), gp.push_back(gb[i]->as<float>());
    }
    dbuf w(h, D * 4), g(h, D * 4), dw(h, D * 4), dg(h, D * 4), out(h, td * 4), dh(h, td * 4),
        sv(h, 2 * (size_t)T * N * 4), ws(h, k3c_attnres_workspace_cuda(&s));
    fill_kernel<<<64, 256, 0, cudaStreamPerThread>>>(w.as<float>(), D, 0.03f, 1);
    fill_kernel<<<64, 256, 0, cudaStreamPerThread>>>(g.as<float>(), D, 1.f, 2);
    fill_kernel<<<4096, 256, 0, cudaStreamPerThread>>>(dh.as<float>(), td, 1.f, 3);
    for (int pass = 0; pass < 2; pass++) {
        std::vector<float> ms;
        for (int rep = 0; rep < 4; rep++) {
            cudaEvent_t a, b;
            cudaEventCreate(&a), cudaEventCreate(&b);
            cudaEventRecord(a, cudaStreamPerThread);
            if (pass == 0)
                h.ok(k3c_attnres_fwd_cuda(&s, vp.data(), w.as<float>(), g.as<float>(), out.as<float>(), sv.as<float>(),
                                          &h.err),
                     "attnres_fwd (timing)");
            else
                h.ok(k3c_attnres_bwd_cuda(&s, vp.data(), w.as<float>(), g.as<float>(), sv.as<float>(), dh.as<float>(),
                                          gp.data(), dw.as<float>(), dg.as<float>(), ws.p, &h.err),
                     "attnres_bwd (timing)");
            cudaEventRecord(b, cudaStreamPerThread);
            h.ok(k3c_cuda_sync(&h.err), "sync (timing)");
            float e;
            cudaEventElapsedTime(&e, a, b);
            cudaEventDestroy(a), cudaEventDestroy(b);
            if (rep) ms.push_back(e);
        }
        std::sort(ms.begin(), ms.end());
        const double bytes = 4.0 * td * (pass == 0 ? 2 * N + 1 : 2 * N + 2 + 2 * N);
        printf("TIMING attnres_%s_cuda T%d D%d N%d: %.3f ms (%.2f TB/s of the minimum traffic)\n", pass ? "bwd" : "fwd",
               T, D, N, ms[1], bytes / (ms[1] * 1e-3) / 1e12);
        fflush(stdout);
    }
    for (auto *b : vb) delete b;
    for (auto *b : gb) delete b;
}

/* ---------------------------------------------------------------- activation moves (exact: one rounding each) */
static void test_moves(harness &h, k3c_rng *r) {
    {
        const int64_t n = 12345;
        std::vector<float> ref = randn(r, n);
        k3c_zero_f32(ref.data(), n);
        dbuf g(h, n * 4);
        g.poison(h);
        h.ok(k3c_zero_cuda(g.as<float>(), n, &h.err), "zero_cuda");
        std::vector<float> t = download<float>(h, g);
        h.compare("zero", "n12345", "x", t.data(), ref.data(), n, 0.0);
    }
    for (int64_t n : {1, 100003}) {
        std::vector<float> x = randn(r, n), y0 = randn(r, n), ref = y0;
        k3c_add_f32(n, x.data(), ref.data());
        dbuf *gx = upload(h, x), *gy = upload(h, y0);
        h.ok(k3c_add_cuda(n, gx->as<float>(), gy->as<float>(), &h.err), "add_cuda");
        std::vector<float> t = download<float>(h, *gy);
        h.compare("add", fmt("n%lld", (long long)n), "y", t.data(), ref.data(), n, 0.0);
        /* x = y: y doubles */
        ref = y0;
        k3c_add_f32(n, y0.data(), ref.data());
        delete gy;
        gy = upload(h, y0);
        h.ok(k3c_add_cuda(n, gy->as<float>(), gy->as<float>(), &h.err), "add_cuda (x = y)");
        t = download<float>(h, *gy);
        h.compare("add (x = y)", fmt("n%lld", (long long)n), "y", t.data(), ref.data(), n, 0.0);
        delete gx, delete gy;
    }
    struct cc {
        int64_t rows, cols, lds, ldd;
    };
    for (cc c :
         {cc{37, 53, 61, 59}, cc{1000, 3, 5, 7}, cc{1, 77, 0, 0}, cc{5, 64, 64, 64}, cc{0, 9, 9, 9}, cc{7, 0, 3, 3}})
        for (int acc = 0; acc < 2; acc++) {
            const size_t ns = (size_t)std::max<int64_t>(c.rows * std::max(c.lds, c.cols), 1),
                         nd = (size_t)std::max<int64_t>(c.rows * std::max(c.ldd, c.cols), 1);
            std::vector<float> src = randn(r, ns), dst0 = randn(r, nd), ref = dst0;
            k3c_copy2d_f32(c.rows, c.cols, src.data(), c.lds, ref.data(), c.ldd, acc);
            dbuf *gs = upload(h, src), *gd = upload(h, dst0); /* gaps between rows must stay as they were */
            h.ok(k3c_copy2d_cuda(c.rows, c.cols, gs->as<float>(), c.lds, gd->as<float>(), c.ldd, acc, &h.err),
                 "copy2d_cuda");
            std::vector<float> t = download<float>(h, *gd);
            h.compare(
                acc ? "copy2d (+=)" : "copy2d (=)",
                fmt("%lldx%lld ld %lld/%lld", (long long)c.rows, (long long)c.cols, (long long)c.lds, (long long)c.ldd),
                "dst", t.data(), ref.data(), nd, 0.0);
            delete gs, delete gd;
        }
    expect(h, "copy2d_cuda", "edges", "ld<cols",
           k3c_copy2d_cuda(3, 8, nullptr, 4, nullptr, 8, 0, &h.err) == K3C_EINVAL);
    expect(h, "add_cuda", "edges", "n<0", k3c_add_cuda(-1, nullptr, nullptr, &h.err) == K3C_EINVAL);
}

int main(int argc, char **argv) {
    harness h;
    k3c_cuda_ctx ctx;
    k3c_rng r = harness_start(h, ctx, argc, argv);

    for (int T : {1, 50, 333})
        for (int D : {16, 128, 200})
            for (int N : {1, 2, 5, 9}) test_attnres(h, &r, T, D, N);
    test_attnres(h, &r, 50, 128, 5, {false, true, false}); /* dv = NULL, only dw */
    test_attnres(h, &r, 50, 200, 9, {true, false, false}); /* only dv: no dŵ reduction */
    test_attnres(h, &r, 7, 40, 200);                       /* two 128-source groups, an alias across them */
    test_attnres(h, &r, 1500, 72, 3);                      /* several token chunks of the dŵ reduction */
    test_attnres_edges(h);

    int idx = 0;
    for (int T : {1, 200, 1000})
        for (int H : {1, 4})
            for (int dqk : {48, 192}) {
                ml_case c = {T, H, dqk, {}};
                if (idx++ % 2 == 0) { /* documents with an empty one (T = 1: the empty one first) */
                    if (T == 1)
                        c.cu = {0, 0, 1};
                    else
                        c.cu = {0, T / 3, T / 3, T - 1 - T / 7, T - 1, T};
                }
                test_max_logit(h, &r, c);
            }
    test_max_logit_edges(h);
    time_max_logit(h, 1);
    time_max_logit(h, 4);
    time_attnres(h);

    test_moves(h, &r);
    k3c_cuda_destroy(&ctx);
    return h.summary();
}
