/* harness_norms.cu — checks the CUDA twins of embedding, RMSNorm (plain / gated) and the L2 norm (src/cuda/norms.cu)
 * against the CPU float32 ops of libk3c.a on fresh random inputs (seed printed), outputs poisoned with NaN, gradients
 * added onto random initial contents. docs/CODE.md "Ops". Needs a GPU; usage: harness_norms [seed]. */
#include <time.h>

#include <algorithm>

#include "cuda/cuda_ops.h"
#include "cuda/testing.cuh"

/* Tolerances: 0 for pure copies and for gradients that must stay untouched; 1e-5 relative (fp32) elsewhere: the twins
 * repeat the CPU's float operations, only double-precision sums change order, and the embedding backward's atomicAdd
 * order (float, ~2000 adds per row in the V = 50 case) moves results by ~4e-7 (seen on an H200). */
static const double TOL = 1e-5;

/* A yes/no check recorded in the table (1 = as expected). */
static void expect(harness &h, const char *op, const std::string &shape, const char *what, bool ok) {
    const float got = ok ? 1.f : 0.f, one = 1.f;
    h.compare(op, shape, what, &got, &one, 1, 0.0);
}

static std::vector<float> dl(harness &h, const dbuf &b) { return download<float>(h, b); }

/* ---------------------------------------------------------------- RMSNorm, plain and gated */
static void test_rmsnorm(harness &h, k3c_rng *r, int64_t rows, int64_t D, bool gated, const std::string &shape) {
    const k3c_rmsnorm_sizes s = {rows, D, 1e-6};
    const size_t n = (size_t)(rows * D);
    const char *fop = gated ? "gated_rmsnorm_fwd" : "rmsnorm_fwd", *bop = gated ? "gated_rmsnorm_bwd" : "rmsnorm_bwd";
    std::vector<float> x = randn(r, n, 1.5), g = randn(r, n, 2.0), w = randn(r, D, 0.3), dy = randn(r, n);
    for (auto &v : w) v += 1.f;
    std::vector<float> y(n), rstd(rows), dx0 = randn(r, n), dg0 = randn(r, n), dw0 = randn(r, D);
    std::vector<float> dx = dx0, dg = dg0, dw = dw0;
    if (gated) {
        h.ok(k3c_gated_rmsnorm_fwd_f32(&s, x.data(), g.data(), w.data(), y.data(), rstd.data(), &h.err), "cpu fwd");
        h.ok(k3c_gated_rmsnorm_bwd_f32(&s, x.data(), g.data(), w.data(), rstd.data(), dy.data(), dx.data(), dg.data(),
                                       dw.data(), &h.err),
             "cpu bwd");
    } else {
        h.ok(k3c_rmsnorm_fwd_f32(&s, x.data(), w.data(), y.data(), rstd.data(), &h.err), "cpu fwd");
        h.ok(k3c_rmsnorm_bwd_f32(&s, x.data(), w.data(), rstd.data(), dy.data(), dx.data(), dw.data(), &h.err),
             "cpu bwd");
    }
    dbuf gx(h, x.data(), n * 4), gg(h, g.data(), n * 4), gw(h, w.data(), D * 4), gdy(h, dy.data(), n * 4);
    dbuf grs_cpu(h, rstd.data(), rows * 4), gy(h, n * 4), grs(h, rows * 4);
    auto fwd = [&](float *rs) {
        gy.poison(h);
        if (gated)
            h.ok(k3c_gated_rmsnorm_fwd_cuda(&s, gx.as<float>(), gg.as<float>(), gw.as<float>(), gy.as<float>(), rs,
                                            &h.err),
                 fop);
        else
            h.ok(k3c_rmsnorm_fwd_cuda(&s, gx.as<float>(), gw.as<float>(), gy.as<float>(), rs, &h.err), fop);
    };
    grs.poison(h);
    fwd(grs.as<float>());
    std::vector<float> t = dl(h, gy);
    h.compare(fop, shape, "y", t.data(), y.data(), n, TOL);
    t = dl(h, grs), h.compare(fop, shape, "rstd", t.data(), rstd.data(), rows, TOL);
    fwd(nullptr);
    t = dl(h, gy), h.compare(fop, shape, "y,rs=0", t.data(), y.data(), n, TOL);

    /* backward from the CPU's rstd (so a forward difference cannot hide in it); every subset of the gradients the
     * model asks for, each from fresh initial contents */
    dbuf gdx(h, n * 4), gdg(h, n * 4), gdw(h, D * 4);
    for (int pass = 0; pass < 3; pass++) {
        const bool want_dx = pass != 2, want_dg = gated && pass != 1, want_dw = pass != 1;
        h.ok(k3c_cuda_h2d(gdx.p, dx0.data(), n * 4, &h.err), "h2d");
        h.ok(k3c_cuda_h2d(gdg.p, dg0.data(), n * 4, &h.err), "h2d");
        h.ok(k3c_cuda_h2d(gdw.p, dw0.data(), D * 4, &h.err), "h2d");
        float *pdx = want_dx ? gdx.as<float>() : nullptr, *pdg = want_dg ? gdg.as<float>() : nullptr,
              *pdw = want_dw ? gdw.as<float>() : nullptr;
        if (gated)
            h.ok(k3c_gated_rmsnorm_bwd_cuda(&s, gx.as<float>(), gg.as<float>(), gw.as<float>(), grs_cpu.as<float>(),
                                            gdy.as<float>(), pdx, pdg, pdw, &h.err),
                 bop);
        else
            h.ok(k3c_rmsnorm_bwd_cuda(&s, gx.as<float>(), gw.as<float>(), grs_cpu.as<float>(), gdy.as<float>(), pdx,
                                      pdw, &h.err),
                 bop);
        const std::string sh = shape + fmt(" pass%d", pass);
        if (want_dx) t = dl(h, gdx), h.compare(bop, sh, "dx", t.data(), dx.data(), n, TOL, dx0.data());
        if (want_dg) t = dl(h, gdg), h.compare(bop, sh, "dgate", t.data(), dg.data(), n, TOL, dg0.data());
        if (want_dw) t = dl(h, gdw), h.compare(bop, sh, "dw", t.data(), dw.data(), D, TOL, dw0.data());
        /* a gradient that was not asked for stays untouched */
        if (!want_dx) t = dl(h, gdx), h.compare(bop, sh, "dx kept", t.data(), dx0.data(), n, 0.0);
        if (!want_dw) t = dl(h, gdw), h.compare(bop, sh, "dw kept", t.data(), dw0.data(), D, 0.0);
        if (gated && !want_dg) t = dl(h, gdg), h.compare(bop, sh, "dg kept", t.data(), dg0.data(), n, 0.0);
    }
}

/* Argument edge cases: empty batches are no-ops, bad sizes and a missing rstd are K3C_EINVAL, as on the CPU. */
static void test_rmsnorm_edges(harness &h) {
    dbuf one(h, 64 * 4);
    float *p = one.as<float>();
    k3c_rmsnorm_sizes s0 = {0, 64, 1e-6}, bad = {4, 0, 1e-6}, nan_eps = {1, 16, NAN}, s1 = {1, 16, 1e-6};
    const std::string sh = "edges";
    float *z = nullptr;
    expect(h, "rmsnorm_fwd", sh, "rows=0", k3c_rmsnorm_fwd_cuda(&s0, z, z, z, z, &h.err) == 0);
    expect(h, "rmsnorm_bwd", sh, "rows=0", k3c_rmsnorm_bwd_cuda(&s0, z, z, p, z, z, z, &h.err) == 0);
    expect(h, "gated_rmsnorm_bwd", sh, "rows=0", k3c_gated_rmsnorm_bwd_cuda(&s0, z, z, z, p, z, z, z, z, &h.err) == 0);
    expect(h, "rmsnorm_fwd", sh, "D=0", k3c_rmsnorm_fwd_cuda(&bad, p, p, p, p, &h.err) == K3C_EINVAL);
    expect(h, "gated_rmsnorm_fwd", sh, "eps=nan",
           k3c_gated_rmsnorm_fwd_cuda(&nan_eps, p, p, p, p, p, &h.err) == K3C_EINVAL);
    expect(h, "rmsnorm_bwd", sh, "rstd=0", k3c_rmsnorm_bwd_cuda(&s1, p, p, nullptr, p, p, p, &h.err) == K3C_EINVAL);
    expect(h, "gated_rmsnorm_bwd", sh, "rstd=0",
           k3c_gated_rmsnorm_bwd_cuda(&s1, p, p, p, nullptr, p, p, p, p, &h.err) == K3C_EINVAL);
    h.ok(k3c_cuda_sync(&h.err), "sync after edges");
}

/* ---------------------------------------------------------------- L2 norm (rows = T·H of width dk) */
static void test_l2norm(harness &h, k3c_rng *r, int64_t T, int64_t H, int64_t dk, double eps) {
    const k3c_l2norm_dims d = {T * H, dk, eps};
    const int64_t rows = T * H;
    const size_t n = (size_t)(rows * dk);
    const std::string shape = fmt("T%lld H%lld dk%lld eps%g", (long long)T, (long long)H, (long long)dk, eps);
    std::vector<float> x = randn(r, n, 0.7), y(n), rstd(rows), dy = randn(r, n), dx0 = randn(r, n);
    if (rows > 1) std::fill(x.begin() + dk, x.begin() + 2 * dk, 0.f); /* an all-zero row: rstd = 1/sqrt(eps) */
    std::vector<float> dx = dx0;
    h.ok(k3c_l2norm_fwd_f32(&d, x.data(), y.data(), rstd.data(), &h.err), "cpu l2norm_fwd");
    h.ok(k3c_l2norm_bwd_f32(&d, y.data(), rstd.data(), dy.data(), dx.data(), &h.err), "cpu l2norm_bwd");
    dbuf gx(h, x.data(), n * 4), gy(h, n * 4), grs(h, rows * 4);
    gy.poison(h), grs.poison(h);
    h.ok(k3c_l2norm_fwd_cuda(&d, gx.as<float>(), gy.as<float>(), grs.as<float>(), &h.err), "l2norm_fwd_cuda");
    std::vector<float> t = dl(h, gy);
    h.compare("l2norm_fwd", shape, "y", t.data(), y.data(), n, TOL);
    t = dl(h, grs), h.compare("l2norm_fwd", shape, "rstd", t.data(), rstd.data(), rows, TOL);
    /* in place, as the model normalises q and k */
    h.ok(k3c_l2norm_fwd_cuda(&d, gx.as<float>(), gx.as<float>(), nullptr, &h.err), "l2norm_fwd_cuda in place");
    t = dl(h, gx), h.compare("l2norm_fwd", shape, "y=x", t.data(), y.data(), n, TOL);

    dbuf gyc(h, y.data(), n * 4), grc(h, rstd.data(), rows * 4), gdy(h, dy.data(), n * 4), gdx(h, dx0.data(), n * 4);
    h.ok(k3c_l2norm_bwd_cuda(&d, gyc.as<float>(), grc.as<float>(), gdy.as<float>(), gdx.as<float>(), &h.err),
         "l2norm_bwd_cuda");
    t = dl(h, gdx), h.compare("l2norm_bwd", shape, "dx", t.data(), dx.data(), n, TOL, dx0.data());
    expect(h, "l2norm_bwd", shape, "dx=0",
           k3c_l2norm_bwd_cuda(&d, gyc.as<float>(), grc.as<float>(), gdy.as<float>(), nullptr, &h.err) == 0);
    expect(h, "l2norm_bwd", shape, "rstd=0",
           k3c_l2norm_bwd_cuda(&d, gyc.as<float>(), nullptr, gdy.as<float>(), gdx.as<float>(), &h.err) == K3C_EINVAL);
}

static void test_l2norm_edges(harness &h) {
    const k3c_l2norm_dims d0 = {0, 32, 0}, bad = {4, 0, 0}, neg = {4, 32, -1};
    float *p = nullptr;
    expect(h, "l2norm_fwd", "edges", "rows=0", k3c_l2norm_fwd_cuda(&d0, p, p, p, &h.err) == 0);
    expect(h, "l2norm_bwd", "edges", "rows=0", k3c_l2norm_bwd_cuda(&d0, p, p, p, p, &h.err) == 0);
    expect(h, "l2norm_fwd", "edges", "dim=0", k3c_l2norm_fwd_cuda(&bad, p, p, p, &h.err) == K3C_EINVAL);
    expect(h, "l2norm_fwd", "edges", "eps<0", k3c_l2norm_fwd_cuda(&neg, p, p, p, &h.err) == K3C_EINVAL);
}

/* ---------------------------------------------------------------- embedding */
/* ids: a fraction `hot` of the tokens from the first 20 rows (many repeats), the rest anywhere in [0, V); ids 0 and
 * V − 1 appear. */
static std::vector<int32_t> make_ids(k3c_rng *r, int64_t T, int64_t V, double hot) {
    std::vector<int32_t> ids((size_t)T);
    for (auto &id : ids) id = (int32_t)(k3c_rng_uniform(r) * (k3c_rng_uniform(r) < hot ? std::min<int64_t>(20, V) : V));
    if (T > 1) ids[0] = (int32_t)(V - 1), ids[(size_t)T - 1] = 0;
    return ids;
}

/* Forward: rc and message for the given ids; 0 and an exact gather when all are valid. */
static void embed_bad(harness &h, const k3c_embedding_sizes &s, const std::vector<int32_t> &ids, const dbuf &gE,
                      dbuf &gy, const char *want, const std::string &shape) {
    dbuf gid(h, ids.data(), ids.size() * 4);
    h.err.msg[0] = 0;
    const int rc = k3c_embedding_fwd_cuda(&s, gid.as<int32_t>(), gE.as<float>(), gy.as<float>(), &h.err);
    printf("  embedding_fwd_cuda on bad ids: %s: %s\n", k3c_status_name(rc), h.err.msg);
    expect(h, "embedding_fwd", shape, "EINVAL", rc == K3C_EINVAL && strstr(h.err.msg, want));
}

static void test_embedding(harness &h, k3c_rng *r, int64_t V, int64_t T, int64_t D, double hot) {
    const k3c_embedding_sizes s = {T, V, D};
    const std::string shape = fmt("V%lld T%lld D%lld", (long long)V, (long long)T, (long long)D);
    std::vector<int32_t> ids = make_ids(r, T, V, hot);
    std::vector<float> E = randn(r, (size_t)(V * D)), y((size_t)(T * D)), dy = randn(r, (size_t)(T * D));
    std::vector<float> dE0 = randn(r, (size_t)(V * D)), dE = dE0;
    h.ok(k3c_embedding_fwd_f32(&s, ids.data(), E.data(), y.data(), &h.err), "cpu embedding_fwd");
    h.ok(k3c_embedding_bwd_f32(&s, ids.data(), dy.data(), dE.data(), &h.err), "cpu embedding_bwd");
    dbuf gid(h, ids.data(), ids.size() * 4), gE(h, E.data(), E.size() * 4), gy(h, y.size() * 4);
    dbuf gdy(h, dy.data(), dy.size() * 4), gdE(h, dE0.data(), dE0.size() * 4);
    gy.poison(h);
    h.ok(k3c_embedding_fwd_cuda(&s, gid.as<int32_t>(), gE.as<float>(), gy.as<float>(), &h.err), "embedding_fwd_cuda");
    std::vector<float> t = dl(h, gy);
    h.compare("embedding_fwd", shape, "y", t.data(), y.data(), y.size(), 0.0);
    h.ok(k3c_embedding_bwd_cuda(&s, gid.as<int32_t>(), gdy.as<float>(), gdE.as<float>(), &h.err), "embedding_bwd_cuda");
    t = dl(h, gdE), h.compare("embedding_bwd", shape, "dE", t.data(), dE.data(), dE.size(), TOL, dE0.data());

    /* bad ids: the first bad token is named, then the program carries on */
    const int64_t a = T * 7 / 12, b = T * 2 / 3;
    std::vector<int32_t> bad1 = ids, bad2 = ids;
    bad1[(size_t)b] = (int32_t)V;
    bad2[(size_t)a] = -7, bad2[(size_t)b] = (int32_t)(V + 5);
    embed_bad(h, s, bad1, gE, gy, fmt("token %lld has id %lld ", (long long)b, (long long)V).c_str(), shape + " bad@b");
    embed_bad(h, s, bad2, gE, gy, fmt("token %lld has id -7 ", (long long)a).c_str(), shape + " bad@a,b");
    gy.poison(h);
    h.ok(k3c_embedding_fwd_cuda(&s, gid.as<int32_t>(), gE.as<float>(), gy.as<float>(), &h.err), "embedding_fwd_cuda");
    t = dl(h, gy), h.compare("embedding_fwd", shape + " after", "y", t.data(), y.data(), y.size(), 0.0);

    /* the backward skips bad tokens: the CPU reference drops them (id 0, zero gradient row) */
    std::vector<float> dyz = dy, dEz = dE0;
    std::vector<int32_t> okids = bad2;
    for (int64_t k : {a, b}) okids[(size_t)k] = 0, std::fill(dyz.begin() + k * D, dyz.begin() + (k + 1) * D, 0.f);
    h.ok(k3c_embedding_bwd_f32(&s, okids.data(), dyz.data(), dEz.data(), &h.err), "cpu embedding_bwd");
    dbuf gb(h, bad2.data(), bad2.size() * 4), gdE2(h, dE0.data(), dE0.size() * 4);
    h.ok(k3c_embedding_bwd_cuda(&s, gb.as<int32_t>(), gdy.as<float>(), gdE2.as<float>(), &h.err), "embedding_bwd_cuda");
    t = dl(h, gdE2);
    h.compare("embedding_bwd", shape + " bad skipped", "dE", t.data(), dEz.data(), dEz.size(), TOL, dE0.data());
}

static void test_embedding_edges(harness &h) {
    const k3c_embedding_sizes s0 = {0, 10, 8}, bad = {4, 0, 8};
    expect(h, "embedding_fwd", "edges", "T=0", k3c_embedding_fwd_cuda(&s0, nullptr, nullptr, nullptr, &h.err) == 0);
    expect(h, "embedding_bwd", "edges", "T=0", k3c_embedding_bwd_cuda(&s0, nullptr, nullptr, nullptr, &h.err) == 0);
    expect(h, "embedding_fwd", "edges", "V=0",
           k3c_embedding_fwd_cuda(&bad, nullptr, nullptr, nullptr, &h.err) == K3C_EINVAL);
    expect(h, "embedding_bwd", "edges", "dE=0", k3c_embedding_bwd_cuda(&s0, nullptr, nullptr, nullptr, &h.err) == 0);
}

int main(int argc, char **argv) {
    harness h;
    k3c_cuda_ctx ctx;
    k3c_rng r = harness_start(h, ctx, argc, argv);

    for (int64_t rows : {1, 37, 1000})
        for (int64_t D : {16, 32, 48, 128, 7168 / 8})
            test_rmsnorm(h, &r, rows, D, false, fmt("rows%lld D%lld", (long long)rows, (long long)D));
    struct {
        int64_t T, H, dv;
    } gc[] = {{1, 3, 32}, {37, 2, 48}, {250, 4, 128}, {1000, 1, 16}, {37, 1, 7168 / 8}};
    for (auto &c : gc)
        test_rmsnorm(h, &r, c.T * c.H, c.dv, true,
                     fmt("T%lld H%lld dv%lld", (long long)c.T, (long long)c.H, (long long)c.dv));
    test_rmsnorm_edges(h);

    for (int64_t dk : {32, 128}) {
        test_l2norm(h, &r, 1, 2, dk, 0.0);
        test_l2norm(h, &r, 37, 3, dk, 0.0);
        test_l2norm(h, &r, 1000, 4, dk, dk == 32 ? 1e-3 : 0.0);
    }
    test_l2norm_edges(h);

    test_embedding(h, &r, 1000, 513, 96, 0.5);
    test_embedding(h, &r, 50, 100003, 8, 0.0); /* ~2000 tokens per row; several blocks search for the first bad id */
    test_embedding_edges(h);

    h.ok(k3c_cuda_sync(&h.err), "final sync");
    k3c_cuda_destroy(&ctx);
    return h.summary();
}
