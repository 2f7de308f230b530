/* harness_seq.cu — runs the fp32 CUDA twins of cuda/cuda_seq.h (short conv, KDA gate, sigmoid gate / sigmoid, masked
 * cross-entropy) against the libk3c _f32 CPU ops on fresh random inputs (seed printed; argv[1] sets it).
 * docs/CODE.md "Ops". Outputs are poisoned with NaN before each run; gradients start from non-zero contents (the ops add).
 * Tolerance: 1e-5 relative (rel_err = ‖gpu − cpu‖ / ‖cpu − initial‖); copies and counts exactly. Needs a GPU. */
#include <time.h>

#include <algorithm>
#include <memory>

#include "cuda/testing.cuh"

#include "cuda/cuda_ops.h"

typedef std::unique_ptr<dbuf> dptr;
template <typename T> static dptr up(harness &h, const std::vector<T> &v) {
    return v.empty() ? dptr(new dbuf(h, 0)) : dptr(upload(h, v));
}
static dptr fresh(harness &h, size_t bytes) { /* a poisoned output buffer */
    dptr b(new dbuf(h, bytes));
    b->poison(h);
    return b;
}
static std::vector<float> dl(harness &h, const dptr &b) { return download<float>(h, *b); }

/* ---------------------------------------------------------------- short convolution
 * mode 0: no conv state; 1: state_in and state_out (and an in-place run, state_out = state_in); 2: state_out only. */
struct sc_case {
    int T, C, W;
    std::vector<int32_t> cu; /* empty = one document */
    int mode;
};

static void test_short_conv(harness &h, k3c_rng *r, const sc_case &c) {
    const int nd = c.cu.empty() ? 1 : (int)c.cu.size() - 1;
    const k3c_short_conv_dims d = {c.T, c.C, c.W, c.cu.empty() ? 0 : nd};
    const size_t TC = (size_t)c.T * c.C, CW = (size_t)c.C * c.W, S = (size_t)nd * c.C * (c.W - 1);
    const int32_t *cu = c.cu.empty() ? nullptr : c.cu.data();
    std::string docs = c.cu.empty() ? "1doc" : "cu";
    for (size_t i = 1; i < c.cu.size(); i++) docs += fmt("%s%d", i == 1 ? ":" : ",", c.cu[i] - c.cu[i - 1]);
    const std::string shape = fmt("T%d C%d W%d %s st%d", c.T, c.C, c.W, docs.c_str(), c.mode);
    const bool sin = c.mode == 1, sout = c.mode >= 1;

    std::vector<float> x = randn(r, TC), w = randn(r, CW, 0.6), st = randn(r, S), y(TC), so(S);
    h.ok(k3c_short_conv_fwd_f32(&d, cu, x.data(), w.data(), sin ? st.data() : nullptr, y.data(),
                                sout ? so.data() : nullptr, &h.err),
         "cpu short_conv_fwd");
    dptr gx = up(h, x), gw = up(h, w), gst = up(h, st), gcu = c.cu.empty() ? nullptr : up(h, c.cu);
    const int32_t *dcu = gcu ? gcu->as<int32_t>() : nullptr;
    const float *dsin = sin ? gst->as<float>() : nullptr;
    {
        dptr gy = fresh(h, TC * 4), gso = fresh(h, S * 4);
        h.ok(k3c_short_conv_fwd_cuda(&d, dcu, gx->as<float>(), gw->as<float>(), dsin, gy->as<float>(),
                                     sout ? gso->as<float>() : nullptr, &h.err),
             "short_conv_fwd_cuda");
        std::vector<float> t = dl(h, gy);
        h.compare("short_conv_fwd", shape, "y", t.data(), y.data(), TC, 1e-5);
        if (sout) { /* a copy of inputs: exact */
            t = dl(h, gso);
            h.compare("short_conv_fwd", shape, "state", t.data(), so.data(), S, 0.0);
        }
    }
    if (sin) { /* in place: state_out is state_in */
        dptr gy = fresh(h, TC * 4), gio = up(h, st);
        h.ok(k3c_short_conv_fwd_cuda(&d, dcu, gx->as<float>(), gw->as<float>(), gio->as<float>(), gy->as<float>(),
                                     gio->as<float>(), &h.err),
             "short_conv_fwd_cuda (in place)");
        std::vector<float> t = dl(h, gy);
        h.compare("short_conv_fwd inplace", shape, "y", t.data(), y.data(), TC, 1e-5);
        t = dl(h, gio);
        h.compare("short_conv_fwd inplace", shape, "state", t.data(), so.data(), S, 0.0);
    }

    /* backward: every gradient, then dw alone, then dstate_in alone (NULL gradients are not touched) */
    std::vector<float> dy = randn(r, TC), dx0 = randn(r, TC), dw0 = randn(r, CW), ds0 = randn(r, S);
    std::vector<float> rdx = dx0, rdw = dw0, rds = ds0;
    std::vector<unsigned char> ws(k3c_short_conv_bwd_workspace_f32(&d) + 64);
    h.ok(k3c_short_conv_bwd_f32(&d, cu, x.data(), w.data(), sin ? st.data() : nullptr, dy.data(), rdx.data(),
                                rdw.data(), rds.data(), ws.data(), &h.err),
         "cpu short_conv_bwd");
    dptr gdy = up(h, dy), gws = fresh(h, k3c_short_conv_bwd_workspace_cuda(&d));
    for (int run = 0; run < 3; run++) {
        dptr gdx = up(h, dx0), gdw = up(h, dw0), gds = up(h, ds0);
        float *pdx = run == 0 ? gdx->as<float>() : nullptr, *pdw = run != 2 ? gdw->as<float>() : nullptr,
              *pds = run != 1 ? gds->as<float>() : nullptr;
        gws->poison(h);
        h.ok(k3c_short_conv_bwd_cuda(&d, dcu, gx->as<float>(), gw->as<float>(), dsin, gdy->as<float>(), pdx, pdw, pds,
                                     gws->p, &h.err),
             "short_conv_bwd_cuda");
        const char *op = run == 0   ? "short_conv_bwd"
                         : run == 1 ? "short_conv_bwd (dw only)"
                                    : "short_conv_bwd (ds only)";
        std::vector<float> t;
        if (pdx) t = dl(h, gdx), h.compare(op, shape, "dx", t.data(), rdx.data(), TC, 1e-5, dx0.data());
        if (pdw) t = dl(h, gdw), h.compare(op, shape, "dw", t.data(), rdw.data(), CW, 1e-5, dw0.data());
        if (pds) t = dl(h, gds), h.compare(op, shape, "dstate", t.data(), rds.data(), S, 1e-5, ds0.data());
        /* the gradients not asked for must be untouched */
        float un = 0.f, zero = 0.f;
        if (!pdx) t = dl(h, gdx), un += memcmp(t.data(), dx0.data(), TC * 4) != 0;
        if (!pdw) t = dl(h, gdw), un += memcmp(t.data(), dw0.data(), CW * 4) != 0;
        if (!pds) t = dl(h, gds), un += memcmp(t.data(), ds0.data(), S * 4) != 0;
        if (run) h.compare(op, shape, "NULLs", &un, &zero, 1, 0.0);
    }
}

/* ---------------------------------------------------------------- KDA forget gate */
struct gate_case {
    int T, H, dk, form;
    double g_min;
    int with_bias, with_alog;
};

static void test_gate(harness &h, k3c_rng *r, const gate_case &c) {
    const k3c_kda_gate_dims d = {c.T, c.H, c.dk, c.form, c.g_min};
    const size_t P = (size_t)c.H * c.dk, n = (size_t)c.T * P;
    const std::string shape = fmt("T%d H%d dk%d %s%s%s", c.T, c.H, c.dk,
                                  c.form == K3C_GATE_LOWER_BOUND ? (c.g_min ? "lb-5" : "lb(0)") : "softplus",
                                  c.with_bias ? " bias" : "", c.with_alog ? " Alog" : "");
    std::vector<float> z = randn(r, n, 2.0), bias = randn(r, P, 0.5), alog = randn(r, c.H, 0.7), g(n);
    const float *pb = c.with_bias ? bias.data() : nullptr, *pa = c.with_alog ? alog.data() : nullptr;
    h.ok(k3c_kda_gate_fwd_f32(&d, z.data(), pb, pa, g.data(), &h.err), "cpu kda_gate_fwd");
    dptr gz = up(h, z), gb = up(h, bias), ga = up(h, alog), gg = fresh(h, n * 4);
    const float *dpb = c.with_bias ? gb->as<float>() : nullptr, *dpa = c.with_alog ? ga->as<float>() : nullptr;
    h.ok(k3c_kda_gate_fwd_cuda(&d, gz->as<float>(), dpb, dpa, gg->as<float>(), &h.err), "kda_gate_fwd_cuda");
    std::vector<float> t = dl(h, gg);
    h.compare("kda_gate_fwd", shape, "g", t.data(), g.data(), n, 1e-5);

    std::vector<float> dg = randn(r, n), dz0 = randn(r, n), db0 = randn(r, P), dA0 = randn(r, c.H);
    std::vector<float> rdz = dz0, rdb = db0, rdA = dA0;
    h.ok(k3c_kda_gate_bwd_f32(&d, z.data(), pb, pa, dg.data(), rdz.data(), rdb.data(), rdA.data(), &h.err),
         "cpu kda_gate_bwd");
    /* dA_log[h] is ONE sum of T·dk terms of either sign, each computed within a few ulp (the two expf differ), so its
     * error scales with Σ|terms| while the sum itself may cancel to almost nothing (seen: 9e-5 relative to the sum on
     * 1 of 50 seeds with H = 1). It is compared relative to Σ|terms| (base = ref − Σ|terms|); a wrong term or a
     * missing channel would still be off by ~1/sqrt(T·dk) of that. */
    std::vector<float> dAbase(c.H);
    for (int hh = 0; hh < c.H; hh++) {
        const double a = c.with_alog ? exp((double)alog[hh]) : 1.0, gm = c.g_min != 0 ? c.g_min : -5.0;
        double sum = 0;
        for (int t = 0; t < c.T; t++)
            for (int j = 0; j < c.dk; j++) {
                const size_t ch = (size_t)hh * c.dk + j, i = (size_t)t * P + ch;
                const double u = z[i] + (c.with_bias ? bias[ch] : 0.0), s = sigm(a * u);
                const double dl = c.form == K3C_GATE_LOWER_BOUND ? gm * s * (1 - s) * a * u
                                                                 : -a * (fmax(u, 0.0) + log1p(exp(-fabs(u))));
                sum += fabs(dg[i] * dl);
            }
        dAbase[hh] = (float)(rdA[hh] - sum);
    }
    dptr gdg = up(h, dg);
    for (int run = 0; run < 2; run++) { /* run 1: dz NULL (the reductions alone) */
        dptr gdz = up(h, dz0), gdb = up(h, db0), gdA = up(h, dA0);
        h.ok(k3c_kda_gate_bwd_cuda(&d, gz->as<float>(), dpb, dpa, gdg->as<float>(), run ? nullptr : gdz->as<float>(),
                                   gdb->as<float>(), gdA->as<float>(), &h.err),
             "kda_gate_bwd_cuda");
        const char *op = run ? "kda_gate_bwd (no dz)" : "kda_gate_bwd";
        if (!run) t = dl(h, gdz), h.compare(op, shape, "dz", t.data(), rdz.data(), n, 1e-5, dz0.data());
        t = dl(h, gdb), h.compare(op, shape, "ddt_bias", t.data(), rdb.data(), P, 1e-5, db0.data());
        t = dl(h, gdA);
        if (c.with_alog)
            h.compare(op, shape, "dA_log/Σ|.|", t.data(), rdA.data(), c.H, 1e-5, dAbase.data());
        else
            h.compare(op, shape, "dA_log untouched", t.data(), dA0.data(), c.H, 0.0);
    }
}

/* ---------------------------------------------------------------- sigmoid gate, sigmoid */
static void test_sigmoid(harness &h, k3c_rng *r, int64_t n) {
    const std::string shape = fmt("n%lld", (long long)n);
    std::vector<float> x = randn(r, n, 4.0), z = randn(r, n, 4.0), y(n), dy = randn(r, n), dx0 = randn(r, n),
                       dz0 = randn(r, n), rdx = dx0, rdz = dz0;
    h.ok(k3c_sigmoid_gate_fwd_f32(n, x.data(), z.data(), y.data(), &h.err), "cpu sigmoid_gate_fwd");
    h.ok(k3c_sigmoid_gate_bwd_f32(n, x.data(), z.data(), dy.data(), rdx.data(), rdz.data(), &h.err),
         "cpu sigmoid_gate_bwd");
    dptr gx = up(h, x), gz = up(h, z), gdy = up(h, dy), gy = fresh(h, n * 4);
    h.ok(k3c_sigmoid_gate_fwd_cuda(n, gx->as<float>(), gz->as<float>(), gy->as<float>(), &h.err),
         "sigmoid_gate_fwd_cuda");
    std::vector<float> t = dl(h, gy);
    h.compare("sigmoid_gate_fwd", shape, "y", t.data(), y.data(), n, 1e-5);
    for (int run = 0; run < 2; run++) { /* run 1: dz NULL */
        dptr gdx = up(h, dx0), gdz = up(h, dz0);
        h.ok(k3c_sigmoid_gate_bwd_cuda(n, gx->as<float>(), gz->as<float>(), gdy->as<float>(), gdx->as<float>(),
                                       run ? nullptr : gdz->as<float>(), &h.err),
             "sigmoid_gate_bwd_cuda");
        const char *op = run ? "sigmoid_gate_bwd (no dz)" : "sigmoid_gate_bwd";
        t = dl(h, gdx), h.compare(op, shape, "dx", t.data(), rdx.data(), n, 1e-5, dx0.data());
        t = dl(h, gdz);
        if (!run)
            h.compare(op, shape, "dz", t.data(), rdz.data(), n, 1e-5, dz0.data());
        else
            h.compare(op, shape, "dz untouched", t.data(), dz0.data(), n, 0.0);
    }

    /* sigmoid, out of place and in place; its backward from the forward's output (dx += dy·y·(1 − y)) */
    std::vector<float> s(n), rdx2 = dx0;
    k3c_sigmoid_f32(n, x.data(), s.data());
    k3c_sigmoid_bwd_f32(n, s.data(), dy.data(), rdx2.data());
    dptr gs = fresh(h, n * 4), gin = up(h, x);
    h.ok(k3c_sigmoid_cuda(n, gx->as<float>(), gs->as<float>(), &h.err), "sigmoid_cuda");
    h.ok(k3c_sigmoid_cuda(n, gin->as<float>(), gin->as<float>(), &h.err), "sigmoid_cuda (in place)");
    t = dl(h, gs), h.compare("sigmoid", shape, "y", t.data(), s.data(), n, 1e-5);
    t = dl(h, gin), h.compare("sigmoid (in place)", shape, "y", t.data(), s.data(), n, 1e-5);
    dptr gys = up(h, s), gdx = up(h, dx0);
    h.ok(k3c_sigmoid_bwd_cuda(n, gys->as<float>(), gdy->as<float>(), gdx->as<float>(), &h.err), "sigmoid_bwd_cuda");
    t = dl(h, gdx), h.compare("sigmoid_bwd", shape, "dx", t.data(), rdx2.data(), n, 1e-5, dx0.data());
}

/* ---------------------------------------------------------------- masked cross-entropy */
struct xent_case {
    int T, V, with_mask;
    double norm;
    int none_counted; /* every target −1 */
};

static void test_xent(harness &h, k3c_rng *r, const xent_case &c) {
    const k3c_xent_sizes s = {c.T, c.V, c.norm, nullptr};
    const size_t TV = (size_t)c.T * c.V;
    const std::string shape =
        fmt("T%d V%d %s norm%g%s", c.T, c.V, c.with_mask ? "mask" : "nomask", c.norm, c.none_counted ? " none" : "");
    std::vector<float> logits = randn(r, TV, 3.0);
    for (int t = 0; t < c.T; t++) /* row offsets from −40 to +40: the max subtraction matters */
        for (int j = 0; j < c.V; j++) logits[(size_t)t * c.V + j] += (float)(20 * (t % 5) - 40);
    std::vector<int32_t> tg(c.T);
    std::vector<uint8_t> mask(c.T, 1);
    for (int t = 0; t < c.T; t++) {
        tg[t] = c.none_counted || k3c_rng_uniform(r) < 0.15 ? -1 : (int32_t)(k3c_rng_uniform(r) * c.V);
        if (c.with_mask) mask[t] = k3c_rng_uniform(r) < 0.8;
    }
    if (c.with_mask && c.T > 6 && !c.none_counted) tg[6] = c.V + 3, mask[6] = 0; /* masked out: not an error */
    const uint8_t *pm = c.with_mask ? mask.data() : nullptr;
    std::vector<float> lse(c.T);
    double loss = -1;
    int64_t count = -1;
    h.ok(k3c_xent_fwd_f32(&s, logits.data(), tg.data(), pm, lse.data(), &loss, &count, &h.err), "cpu xent_fwd");
    dptr gl = up(h, logits), gt = up(h, tg), gm = up(h, mask), glse = fresh(h, (size_t)c.T * 4);
    const uint8_t *dpm = c.with_mask ? gm->as<uint8_t>() : nullptr;
    double gloss = -1;
    int64_t gcount = -1;
    h.ok(k3c_xent_fwd_cuda(&s, gl->as<float>(), gt->as<int32_t>(), dpm, glse->as<float>(), &gloss, &gcount, &h.err),
         "xent_fwd_cuda");
    std::vector<float> t = dl(h, glse);
    h.compare("xent_fwd", shape, "lse", t.data(), lse.data(), c.T, 1e-5);
    float a = (float)gloss, b = (float)loss, ca = (float)gcount, cb = (float)count;
    h.compare("xent_fwd", shape, "loss", &a, &b, 1, 1e-5);
    h.compare("xent_fwd", shape, "count", &ca, &cb, 1, 0.0);

    /* backward on the CPU's lse (so a forward difference cannot hide in it) */
    const double dloss = 0.7;
    std::vector<float> d0 = randn(r, TV), rd = d0;
    h.ok(k3c_xent_bwd_f32(&s, logits.data(), tg.data(), pm, lse.data(), dloss, rd.data(), &h.err), "cpu xent_bwd");
    dptr gls = up(h, lse), gd = up(h, d0);
    h.ok(k3c_xent_bwd_cuda(&s, gl->as<float>(), gt->as<int32_t>(), dpm, gls->as<float>(), dloss, gd->as<float>(),
                           &h.err),
         "xent_bwd_cuda");
    t = dl(h, gd);
    if (c.none_counted)
        h.compare("xent_bwd", shape, "untouched", t.data(), d0.data(), TV, 0.0);
    else
        h.compare("xent_bwd", shape, "dlogits", t.data(), rd.data(), TV, 1e-5, d0.data());

    /* a counted target >= V is K3C_EINVAL, as on the CPU */
    if (!c.none_counted) {
        std::vector<int32_t> bad = tg;
        bad[c.T / 2] = c.V;
        std::vector<uint8_t> bm = mask;
        bm[c.T / 2] = 1;
        dptr gbt = up(h, bad), gbm = up(h, bm);
        const uint8_t *dbm = c.with_mask ? gbm->as<uint8_t>() : nullptr;
        const int rc =
            k3c_xent_fwd_cuda(&s, gl->as<float>(), gbt->as<int32_t>(), dbm, glse->as<float>(), &gloss, &gcount, &h.err);
        float got = (float)rc, want = (float)K3C_EINVAL;
        h.compare("xent_fwd (bad target)", shape, "rc", &got, &want, 1, 0.0);
        if (rc == K3C_EINVAL) printf("  (message: %s)\n", h.err.msg);
    }
}

/* ---------------------------------------------------------------- timings (K3C_SEQ_TIME=1), training-sized shapes
 * Median of 3 after one warm-up; GB/s counts the bytes each op must move at least (inputs read once, outputs written
 * once, gradients read and written). */
__global__ void seq_fill_kernel(float *p, size_t n, float sd, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (seed + i) * 0x9E3779B97F4A7C15ull;
        z ^= z >> 31, z *= 0x94D049BB133111EBull, z ^= z >> 29;
        p[i] = ((float)(z >> 40) * (1.0f / 16777216.0f) - 0.5f) * 3.4641016f * sd; /* uniform, sd `sd` */
    }
}

template <typename F> static void time_op(harness &h, const char *what, double bytes, F run) {
    std::vector<float> ms;
    for (int rep = 0; rep < 4; rep++) {
        cudaEvent_t a, b;
        cudaEventCreate(&a), cudaEventCreate(&b);
        cudaEventRecord(a, cudaStreamPerThread);
        run();
        cudaEventRecord(b, cudaStreamPerThread);
        h.ok(k3c_cuda_sync(&h.err), what);
        float t;
        cudaEventElapsedTime(&t, a, b);
        cudaEventDestroy(a), cudaEventDestroy(b);
        if (rep) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    printf("TIMING %-52s %8.3f ms  %7.1f GB/s\n", what, ms[1], bytes / (ms[1] * 1e-3) / 1e9);
    fflush(stdout);
}

static void time_seq(harness &h) {
    auto filled = [&](size_t n, float sd, uint64_t seed) {
        dptr b(new dbuf(h, n * 4));
        seq_fill_kernel<<<4096, 256>>>(b->as<float>(), n, sd, seed);
        return b;
    };
    { /* short conv: T 16384 in 8 documents, C 4096, W 4 */
        const int64_t T = 16384, C = 4096;
        const k3c_short_conv_dims d = {T, C, 4, 8};
        std::vector<int32_t> cu(9);
        for (int i = 0; i <= 8; i++) cu[i] = (int32_t)(i * T / 8);
        dptr gcu = up(h, cu), x = filled(T * C, 1.f, 1), w = filled(C * 4, 0.5f, 2), st = filled(8 * C * 3, 1.f, 3);
        dptr y = filled(T * C, 1.f, 4), dx = filled(T * C, 1.f, 5), dw = filled(C * 4, 1.f, 6),
             ds = filled(8 * C * 3, 1.f, 7), ws(new dbuf(h, k3c_short_conv_bwd_workspace_cuda(&d)));
        const double tc = (double)T * C * 4;
        time_op(h, "short_conv_fwd T16384 C4096 W4 8 docs +state", 2 * tc, [&] {
            h.ok(k3c_short_conv_fwd_cuda(&d, gcu->as<int32_t>(), x->as<float>(), w->as<float>(), st->as<float>(),
                                         y->as<float>(), nullptr, &h.err),
                 "short_conv_fwd_cuda");
        });
        time_op(h, "short_conv_bwd T16384 C4096 W4 8 docs dx dw dstate", 4 * tc, [&] {
            h.ok(k3c_short_conv_bwd_cuda(&d, gcu->as<int32_t>(), x->as<float>(), w->as<float>(), st->as<float>(),
                                         y->as<float>(), dx->as<float>(), dw->as<float>(), ds->as<float>(), ws->p,
                                         &h.err),
                 "short_conv_bwd_cuda");
        });
    }
    { /* KDA gate: T 16384, H 32, dk 128 */
        const int64_t T = 16384, H = 32, dk = 128, P = H * dk;
        for (int form : {K3C_GATE_LOWER_BOUND, K3C_GATE_SOFTPLUS}) {
            const k3c_kda_gate_dims d = {T, H, dk, form, 0.0};
            dptr z = filled(T * P, 2.f, 8), b = filled(P, 0.5f, 9), al = filled(H, 0.5f, 10);
            dptr g = filled(T * P, 1.f, 11);
            dptr dz = filled(T * P, 1.f, 12), db = filled(P, 1.f, 13), dA = filled(H, 1.f, 14);
            const double tp = (double)T * P * 4;
            const char *f = form == K3C_GATE_LOWER_BOUND ? "lb" : "softplus";
            time_op(h, fmt("kda_gate_fwd T16384 H32 dk128 %s", f).c_str(), 2 * tp, [&] {
                h.ok(k3c_kda_gate_fwd_cuda(&d, z->as<float>(), b->as<float>(), al->as<float>(), g->as<float>(), &h.err),
                     "kda_gate_fwd_cuda");
            });
            time_op(h, fmt("kda_gate_bwd T16384 H32 dk128 %s", f).c_str(), 4 * tp, [&] {
                h.ok(k3c_kda_gate_bwd_cuda(&d, z->as<float>(), b->as<float>(), al->as<float>(), g->as<float>(),
                                           dz->as<float>(), db->as<float>(), dA->as<float>(), &h.err),
                     "kda_gate_bwd_cuda");
            });
        }
    }
    { /* cross-entropy: T 4096, V 163840 */
        const int64_t T = 4096, V = 163840;
        const k3c_xent_sizes s = {T, V, 0.0, nullptr};
        std::vector<int32_t> tg(T);
        for (int64_t t = 0; t < T; t++) tg[t] = (int32_t)((t * 7919) % V);
        dptr gt = up(h, tg), lg = filled(T * V, 3.f, 15), lse = filled(T, 1.f, 16), d = filled(T * V, 1.f, 17);
        const double tv = (double)T * V * 4;
        double loss;
        int64_t count;
        time_op(h, "xent_fwd T4096 V163840 (synchronises)", tv, [&] {
            h.ok(k3c_xent_fwd_cuda(&s, lg->as<float>(), gt->as<int32_t>(), nullptr, lse->as<float>(), &loss, &count,
                                   &h.err),
                 "xent_fwd_cuda");
        });
        time_op(h, "xent_bwd T4096 V163840", 3 * tv, [&] {
            h.ok(k3c_xent_bwd_cuda(&s, lg->as<float>(), gt->as<int32_t>(), nullptr, lse->as<float>(), 1.0,
                                   d->as<float>(), &h.err),
                 "xent_bwd_cuda");
        });
    }
}

int main(int argc, char **argv) {
    harness h;
    k3c_cuda_ctx ctx;
    k3c_rng r = harness_start(h, ctx, argc, argv);
    const char *only = getenv("K3C_HARNESS_ONLY"); /* conv | gate | sigmoid | xent */
    auto want = [&](const char *w) { return !only || strstr(only, w); };

    if (want("conv")) {
        /* documents: an empty one and ones shorter than W − 1 (lengths 0, 1, 2), a document crossing the 256-token
         * segment of the dw pass (T = 300) */
        const std::vector<std::pair<int, std::vector<int32_t>>> docs = {
            {1, {}}, {1, {0, 0, 1}}, {100, {0, 2, 2, 50, 51, 100}}, {300, {}}, {300, {0, 1, 150, 150, 298, 300}}};
        for (auto &dc : docs)
            for (int C : {3, 64, 96})
                for (int W : {2, 4})
                    for (int mode = 0; mode < 2; mode++) test_short_conv(h, &r, {dc.first, C, W, dc.second, mode});
        for (auto &dc : docs) test_short_conv(h, &r, {dc.first, 96, 4, dc.second, 2});
        test_short_conv(h, &r, {700, 33, 3, {0, 5, 5, 5, 400, 401, 700}, 1}); /* three dw segments, odd W */
        test_short_conv(h, &r, {0, 5, 4, {0, 0, 0}, 1}); /* T = 0: the states pass through, nothing else runs */
    }
    if (want("gate")) {
        for (int form : {K3C_GATE_LOWER_BOUND, K3C_GATE_SOFTPLUS})
            for (int H : {1, 4})
                for (int dk : {32, 128})
                    test_gate(h, &r, {300, H, dk, form, form == K3C_GATE_LOWER_BOUND ? -5.0 : 0.0, 1, 1});
        test_gate(h, &r, {77, 4, 32, K3C_GATE_LOWER_BOUND, 0.0, 0, 1}); /* g_min 0 = −5, no dt_bias */
        test_gate(h, &r, {77, 1, 128, K3C_GATE_SOFTPLUS, 0.0, 1, 0});   /* no A_log: a = 1, dA_log untouched */
        test_gate(h, &r, {1, 4, 48, K3C_GATE_LOWER_BOUND, -3.0, 1, 1}); /* one token, dk not a multiple of 32 */
        test_gate(h, &r, {2000, 2, 128, K3C_GATE_SOFTPLUS, 0.0, 1, 1}); /* long token reduction */
    }
    if (want("sigmoid"))
        for (int64_t n : {1, 777, 100003}) test_sigmoid(h, &r, n);
    if (want("xent")) {
        for (int V : {10, 5000, 163840 / 16})
            for (int with_mask = 0; with_mask < 2; with_mask++)
                for (double norm : {0.0, 123.0}) test_xent(h, &r, {77, V, with_mask, norm, 0});
        test_xent(h, &r, {8, 163840, 1, 0.0, 0}); /* the full vocabulary: 1024-thread rows */
        test_xent(h, &r, {77, 10, 0, 0.0, 1});    /* nothing counted: loss 0, count 0, no gradient */
    }
    if (getenv("K3C_SEQ_TIME")) time_seq(h);
    k3c_cuda_destroy(&ctx);
    return h.summary();
}
