/* op_harness.cu — runs every CUDA op against its CPU float32 twin from libk3c.a on fresh random inputs (seed printed),
 * outputs poisoned with NaN before each run; bf16 paths within 1e-2 relative, fp32 paths within 1e-4. Issue 5; DESIGN.md
 * "Ops" (one harness over every backend). Built and run by tools/device_cuda.sh only (needs a GPU). */
#include <time.h>

#include "harness_util.h"

extern "C" {
#include "ops/basic.h"
}

/* ---------------------------------------------------------------- GEMM */
static uint16_t to_bf16(float x) { return k3c_f32_to_bf16(x); }

static void test_gemm(harness &h, k3c_cuda_ctx *ctx, k3c_rng *r) {
    const int64_t M = 192, N = 320, K = 448;
    for (int tr = 0; tr < 4; tr++) {
        const int ta = tr & 1, tb = tr >> 1;
        std::vector<float> A = randn(r, M * K), B = randn(r, K * N), C0 = randn(r, M * N);
        std::vector<uint16_t> Ab(A.size()), Bb(B.size());
        for (size_t i = 0; i < A.size(); i++) Ab[i] = to_bf16(A[i]), A[i] = k3c_bf16_to_f32(Ab[i]);
        for (size_t i = 0; i < B.size(); i++) Bb[i] = to_bf16(B[i]), B[i] = k3c_bf16_to_f32(Bb[i]);
        /* reference: float32 CPU matmul on the bf16-rounded operands (so only accumulation order differs) */
        std::vector<float> ref = C0;
        h.ok(k3c_matmul_f32(ta, tb, M, N, K, 0.5, A.data(), B.data(), 0.25, ref.data(), &h.err), "cpu matmul");
        dbuf *dA = upload(h, Ab), *dB = upload(h, Bb), *dC = upload(h, C0);
        h.ok(k3c_gemm_bf16_cuda(ctx, ta, tb, M, N, K, 0.5f, dA->as<uint16_t>(), dB->as<uint16_t>(), 0.25f, dC->p, 1,
                                &h.err), "gemm bf16");
        std::vector<float> got = download<float>(h, *dC);
        const std::string shape = fmt("%lldx%lldx%lld t%d%d", (long long)M, (long long)N, (long long)K, ta, tb);
        h.compare("gemm_bf16 (f32 out)", shape, "C", got.data(), ref.data(), got.size(), 1e-4);
        /* bf16 output, beta = 0, poisoned */
        dbuf dCb(h, M * N * 2);
        dCb.poison(h);
        h.ok(k3c_gemm_bf16_cuda(ctx, ta, tb, M, N, K, 1.f, dA->as<uint16_t>(), dB->as<uint16_t>(), 0.f, dCb.p, 0,
                                &h.err), "gemm bf16 out");
        std::vector<uint16_t> gb = download<uint16_t>(h, dCb);
        std::vector<float> gf(gb.size()), ref1(gb.size(), 0.f);
        for (size_t i = 0; i < gb.size(); i++) gf[i] = k3c_bf16_to_f32(gb[i]);
        h.ok(k3c_matmul_f32(ta, tb, M, N, K, 1.0, A.data(), B.data(), 0.0, ref1.data(), &h.err), "cpu matmul");
        h.compare("gemm_bf16 (bf16 out)", shape, "C", gf.data(), ref1.data(), gf.size(), 1e-2);
        /* float twin of k3c_matmul (full fp32) */
        std::vector<float> Af = randn(r, M * K), Bf = randn(r, K * N), Cf = randn(r, M * N), reff = Cf;
        h.ok(k3c_matmul_f32(ta, tb, M, N, K, 0.7, Af.data(), Bf.data(), 0.3, reff.data(), &h.err), "cpu matmul");
        dbuf *dAf = upload(h, Af), *dBf = upload(h, Bf), *dCf = upload(h, Cf);
        h.ok(k3c_matmul_cuda(ctx, ta, tb, M, N, K, 0.7, dAf->as<float>(), dBf->as<float>(), 0.3, dCf->as<float>(), 0,
                             &h.err), "matmul f32");
        std::vector<float> gotf = download<float>(h, *dCf);
        h.compare("matmul_f32", shape, "C", gotf.data(), reff.data(), gotf.size(), 1e-4);
        delete dA, delete dB, delete dC, delete dAf, delete dBf, delete dCf;
    }
}

/* ---------------------------------------------------------------- KDA */
struct kda_case {
    int T, H, dk, dv;
    std::vector<int32_t> cu; /* empty = one document */
    double lb;               /* < 0: lower-bound gate (and the bounded path); 0: unbounded softplus-form gate */
    int saturated;           /* g ≈ lb on every channel (§3.3: test the saturated regime) */
    int with_h0;
};

struct kda_inputs {
    std::vector<float> q, k, v, g, beta, h0;
};

static kda_inputs make_kda(const kda_case &c, k3c_rng *r) {
    kda_inputs x;
    const size_t tk = (size_t)c.T * c.H * c.dk, tv = (size_t)c.T * c.H * c.dv;
    const int N = c.cu.empty() ? 1 : (int)c.cu.size() - 1;
    x.q = randn(r, tk), x.k = randn(r, tk), x.v = randn(r, tv);
    l2rows(x.q, c.dk), l2rows(x.k, c.dk);
    x.g.resize(tk);
    for (auto &g : x.g) {
        const double z = k3c_rng_normal(r);
        if (c.lb < 0) g = (float)(c.lb * sigm(c.saturated ? 6.0 + 0.5 * z : 1.5 * z));
        else g = (float)(-exp(3.0 * k3c_rng_uniform(r)) * log1p(exp(z))); /* −a·softplus(u), a ∈ [1, 20] */
    }
    x.beta.resize((size_t)c.T * c.H);
    for (auto &b : x.beta) b = (float)sigm(k3c_rng_normal(r));
    if (c.with_h0) x.h0 = randn(r, (size_t)N * c.H * c.dk * c.dv, 0.5);
    return x;
}

static k3c_kda_dims kda_dims(const kda_case &c) {
    k3c_kda_dims d = {};
    d.T = c.T, d.H = c.H, d.dk = c.dk, d.dv = c.dv;
    d.n_docs = c.cu.empty() ? 0 : (int)c.cu.size() - 1;
    d.chunk = 64, d.scale = 0, d.gate_lower_bound = c.lb;
    return d;
}

static std::string kda_shape(const kda_case &c) {
    return fmt("T%d H%d dk%d dv%d docs%d lb%g%s", c.T, c.H, c.dk, c.dv, c.cu.empty() ? 1 : (int)c.cu.size() - 1, c.lb,
               c.saturated ? " sat" : "");
}

static void test_kda_fwd(harness &h, k3c_rng *r, const kda_case &c) {
    const k3c_kda_dims d = kda_dims(c);
    const int N = c.cu.empty() ? 1 : (int)c.cu.size() - 1;
    const int32_t *cu_h = c.cu.empty() ? nullptr : c.cu.data();
    kda_inputs x = make_kda(c, r);
    const size_t tv = (size_t)c.T * c.H * c.dv, ns = (size_t)N * c.H * c.dk * c.dv;
    /* CPU references: the chunked float32 op, and the recurrence (for the fp32 recurrent kernel) */
    std::vector<float> o_ref(tv), ht_ref(ns), o_rec(tv), ht_rec(ns);
    std::vector<unsigned char> ws(k3c_kda_chunk_fwd_workspace_f32(&d) + 64);
    h.ok(k3c_kda_chunk_fwd_f32(&d, cu_h, x.q.data(), x.k.data(), x.v.data(), x.g.data(), x.beta.data(),
                               c.with_h0 ? x.h0.data() : nullptr, o_ref.data(), ht_ref.data(), ws.data(), &h.err),
         "cpu kda_chunk_fwd");
    std::vector<unsigned char> wsr(k3c_kda_recurrent_fwd_workspace_f32(&d) + 64);
    h.ok(k3c_kda_recurrent_fwd_f32(&d, cu_h, x.q.data(), x.k.data(), x.v.data(), x.g.data(), x.beta.data(),
                                   c.with_h0 ? x.h0.data() : nullptr, o_rec.data(), ht_rec.data(), wsr.data(), &h.err),
         "cpu kda_recurrent_fwd");

    dbuf *q = upload(h, x.q), *k = upload(h, x.k), *v = upload(h, x.v), *g = upload(h, x.g), *b = upload(h, x.beta);
    dbuf *h0 = c.with_h0 ? upload(h, x.h0) : nullptr;
    dbuf *cu = c.cu.empty() ? nullptr : upload(h, c.cu);
    const int32_t *cud = cu ? cu->as<int32_t>() : nullptr;
    const float *h0d = h0 ? h0->as<float>() : nullptr;
    dbuf o(h, tv * 4), ht(h, ns * 4), dws(h, k3c_kda_chunk_fwd_workspace_cuda(&d));
    const std::string shape = kda_shape(c);

    o.poison(h), ht.poison(h);
    h.ok(k3c_kda_chunk_fwd_cuda(&d, cud, q->as<float>(), k->as<float>(), v->as<float>(), g->as<float>(),
                                b->as<float>(), h0d, o.as<float>(), ht.as<float>(), dws.p, &h.err), "kda_chunk_fwd_cuda");
    h.ok(k3c_cuda_sync(&h.err), "sync kda_chunk_fwd_cuda");
    std::vector<float> og = download<float>(h, o), hg = download<float>(h, ht);
    h.compare("kda_chunk_fwd", shape, "o", og.data(), o_ref.data(), tv, 1e-2);
    h.compare("kda_chunk_fwd", shape, "ht", hg.data(), ht_ref.data(), ns, 1e-2);
    h.compare("kda_chunk_fwd~recur", shape, "o", og.data(), o_rec.data(), tv, 1e-2); /* vs the CPU recurrence too */

    /* the bf16 entry on bf16 copies of the same inputs */
    {
        std::vector<uint16_t> qb(x.q.size()), kb(x.k.size()), vb(x.v.size());
        for (size_t i = 0; i < qb.size(); i++) qb[i] = to_bf16(x.q[i]), kb[i] = to_bf16(x.k[i]);
        for (size_t i = 0; i < vb.size(); i++) vb[i] = to_bf16(x.v[i]);
        dbuf *qd = upload(h, qb), *kd = upload(h, kb), *vd = upload(h, vb);
        dbuf ob(h, tv * 2);
        ob.poison(h), ht.poison(h);
        h.ok(k3c_kda_chunk_fwd_bf16_cuda(&d, cud, qd->as<uint16_t>(), kd->as<uint16_t>(), vd->as<uint16_t>(),
                                         g->as<float>(), b->as<float>(), h0d, ob.as<uint16_t>(), ht.as<float>(), dws.p,
                                         &h.err), "kda_chunk_fwd_bf16_cuda");
        std::vector<uint16_t> obh = download<uint16_t>(h, ob);
        std::vector<float> of(obh.size());
        for (size_t i = 0; i < of.size(); i++) of[i] = k3c_bf16_to_f32(obh[i]);
        h.compare("kda_chunk_fwd_bf16", shape, "o", of.data(), o_ref.data(), tv, 1e-2);
        delete qd, delete kd, delete vd;
    }

    /* fp32 token recurrence */
    if (c.dk == 16 || c.dk == 32 || c.dk == 64 || c.dk == 128) {
        o.poison(h), ht.poison(h);
        h.ok(k3c_kda_recurrent_fwd_cuda(&d, cud, q->as<float>(), k->as<float>(), v->as<float>(), g->as<float>(),
                                        b->as<float>(), h0d, o.as<float>(), ht.as<float>(), nullptr, &h.err),
             "kda_recurrent_fwd_cuda");
        std::vector<float> og2 = download<float>(h, o), hg2 = download<float>(h, ht);
        h.compare("kda_recurrent_fwd", shape, "o", og2.data(), o_rec.data(), tv, 1e-4);
        h.compare("kda_recurrent_fwd", shape, "ht", hg2.data(), ht_rec.data(), ns, 1e-4);
    }
    delete q, delete k, delete v, delete g, delete b, delete h0, delete cu;
}

static void test_kda_bwd(harness &h, k3c_rng *r, const kda_case &c) {
    const k3c_kda_dims d = kda_dims(c);
    const int N = c.cu.empty() ? 1 : (int)c.cu.size() - 1;
    const int32_t *cu_h = c.cu.empty() ? nullptr : c.cu.data();
    kda_inputs x = make_kda(c, r);
    const size_t tk = (size_t)c.T * c.H * c.dk, tv = (size_t)c.T * c.H * c.dv, tb = (size_t)c.T * c.H,
                 ns = (size_t)N * c.H * c.dk * c.dv;
    std::vector<float> dout = randn(r, tv), dht = randn(r, ns, 0.3);
    /* gradients start from random values on both sides: the backward must ADD */
    std::vector<float> dq0 = randn(r, tk), dk0 = randn(r, tk), dv0 = randn(r, tv), dg0 = randn(r, tk),
                       db0 = randn(r, tb), dh00 = randn(r, ns);
    std::vector<float> dq = dq0, dk = dk0, dv = dv0, dg = dg0, db = db0, dh0 = dh00;
    std::vector<unsigned char> ws(k3c_kda_chunk_bwd_workspace_f32(&d) + 64);
    h.ok(k3c_kda_chunk_bwd_f32(&d, cu_h, x.q.data(), x.k.data(), x.v.data(), x.g.data(), x.beta.data(),
                               c.with_h0 ? x.h0.data() : nullptr, dout.data(), dht.data(), dq.data(), dk.data(),
                               dv.data(), dg.data(), db.data(), c.with_h0 ? dh0.data() : nullptr, ws.data(), &h.err),
         "cpu kda_chunk_bwd");

    dbuf *q = upload(h, x.q), *k = upload(h, x.k), *v = upload(h, x.v), *g = upload(h, x.g), *b = upload(h, x.beta);
    dbuf *h0 = c.with_h0 ? upload(h, x.h0) : nullptr, *cu = c.cu.empty() ? nullptr : upload(h, c.cu);
    dbuf *ddo = upload(h, dout), *ddht = upload(h, dht);
    dbuf *gq = upload(h, dq0), *gk = upload(h, dk0), *gv = upload(h, dv0), *gg = upload(h, dg0), *gb = upload(h, db0);
    dbuf *gh = upload(h, dh00);
    dbuf dws(h, k3c_kda_chunk_bwd_workspace_cuda(&d));
    h.ok(k3c_kda_chunk_bwd_cuda(&d, cu ? cu->as<int32_t>() : nullptr, q->as<float>(), k->as<float>(), v->as<float>(),
                                g->as<float>(), b->as<float>(), h0 ? h0->as<float>() : nullptr, ddo->as<float>(),
                                ddht->as<float>(), gq->as<float>(), gk->as<float>(), gv->as<float>(), gg->as<float>(),
                                gb->as<float>(), c.with_h0 ? gh->as<float>() : nullptr, dws.p, &h.err),
         "kda_chunk_bwd_cuda");
    h.ok(k3c_cuda_sync(&h.err), "sync kda_chunk_bwd_cuda");
    const std::string shape = kda_shape(c);
    std::vector<float> t;
    t = download<float>(h, *gq), h.compare("kda_chunk_bwd", shape, "dq", t.data(), dq.data(), tk, 1e-2, dq0.data());
    t = download<float>(h, *gk), h.compare("kda_chunk_bwd", shape, "dk", t.data(), dk.data(), tk, 1e-2, dk0.data());
    t = download<float>(h, *gv), h.compare("kda_chunk_bwd", shape, "dv", t.data(), dv.data(), tv, 1e-2, dv0.data());
    t = download<float>(h, *gg), h.compare("kda_chunk_bwd", shape, "dg", t.data(), dg.data(), tk, 1e-2, dg0.data());
    t = download<float>(h, *gb), h.compare("kda_chunk_bwd", shape, "dbeta", t.data(), db.data(), tb, 1e-2, db0.data());
    if (c.with_h0)
        t = download<float>(h, *gh), h.compare("kda_chunk_bwd", shape, "dh0", t.data(), dh0.data(), ns, 1e-2, dh00.data());
    /* the CPU reference again on bf16-rounded q, k, v, dout (what the tensor-core path stores): separates the storage
     * rounding from kernel error */
    {
        kda_inputs xr = x;
        std::vector<float> dor = dout;
        for (auto *vec : {&xr.q, &xr.k, &xr.v, &dor})
            for (auto &e : *vec) e = k3c_bf16_to_f32(to_bf16(e));
        std::vector<float> rb = db0, rg = dg0;
        std::vector<float> rq = dq0, rk = dk0, rv = dv0;
        h.ok(k3c_kda_chunk_bwd_f32(&d, cu_h, xr.q.data(), xr.k.data(), xr.v.data(), xr.g.data(), xr.beta.data(),
                                   c.with_h0 ? xr.h0.data() : nullptr, dor.data(), dht.data(), rq.data(), rk.data(),
                                   rv.data(), rg.data(), rb.data(), nullptr, ws.data(), &h.err),
             "cpu kda_chunk_bwd (bf16 inputs)");
        t = download<float>(h, *gb), h.compare("kda_chunk_bwd~bf16in", shape, "dbeta", t.data(), rb.data(), tb, 1e-2, db0.data());
        t = download<float>(h, *gg), h.compare("kda_chunk_bwd~bf16in", shape, "dg", t.data(), rg.data(), tk, 1e-2, dg0.data());
    }
    delete q, delete k, delete v, delete g, delete b, delete h0, delete cu, delete ddo, delete ddht;
    delete gq, delete gk, delete gv, delete gg, delete gb, delete gh;
}

/* ---------------------------------------------------------------- attention */
struct attn_case {
    int T, H, dqk, dv;
    std::vector<int32_t> cu;
};

static void test_attention(harness &h, k3c_rng *r, const attn_case &c) {
    k3c_attention_sizes s = {};
    s.T = c.T, s.H = c.H, s.dqk = c.dqk, s.dv = c.dv, s.n_docs = c.cu.empty() ? 0 : (int64_t)c.cu.size() - 1;
    s.scale = 1.0 / sqrt((double)c.dqk);
    const int32_t *cu_h = c.cu.empty() ? nullptr : c.cu.data();
    const size_t tq = (size_t)c.T * c.H * c.dqk, tv = (size_t)c.T * c.H * c.dv, tl = (size_t)c.T * c.H;
    std::vector<float> q = randn(r, tq, 1.5), k = randn(r, tq, 1.5), v = randn(r, tv), dout = randn(r, tv);
    std::vector<float> o(tv), lse(tl);
    std::vector<unsigned char> ws(k3c_attention_workspace_f32(&s) + 64);
    h.ok(k3c_attention_fwd_f32(&s, cu_h, q.data(), k.data(), v.data(), o.data(), lse.data(), ws.data(), &h.err),
         "cpu attention_fwd");
    std::vector<float> dq0 = randn(r, tq), dk0 = randn(r, tq), dv0 = randn(r, tv);
    std::vector<float> dq = dq0, dk = dk0, dv = dv0;
    h.ok(k3c_attention_bwd_f32(&s, cu_h, q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(),
                               dk.data(), dv.data(), ws.data(), &h.err), "cpu attention_bwd");

    dbuf *dq_ = upload(h, q), *dk_ = upload(h, k), *dv_ = upload(h, v), *ddo = upload(h, dout);
    dbuf *cu = c.cu.empty() ? nullptr : upload(h, c.cu);
    const int32_t *cud = cu ? cu->as<int32_t>() : nullptr;
    dbuf go(h, tv * 4), gl(h, tl * 4), wf(h, k3c_attention_fwd_workspace_cuda(&s)), wb(h, k3c_attention_workspace_cuda(&s));
    const std::string shape = fmt("T%d H%d dqk%d dv%d docs%d", c.T, c.H, c.dqk, c.dv,
                                  c.cu.empty() ? 1 : (int)c.cu.size() - 1);
    go.poison(h), gl.poison(h);
    h.ok(k3c_attention_fwd_cuda(&s, cud, dq_->as<float>(), dk_->as<float>(), dv_->as<float>(), go.as<float>(),
                                gl.as<float>(), wf.p, &h.err), "attention_fwd_cuda");
    std::vector<float> og = download<float>(h, go), lg = download<float>(h, gl);
    h.compare("attention_fwd", shape, "o", og.data(), o.data(), tv, 1e-2);
    h.compare("attention_fwd", shape, "lse", lg.data(), lse.data(), tl, 1e-2);

    /* backward from the CPU forward's o and lse, gradients pre-filled (the op adds) */
    dbuf *o_ = upload(h, o), *l_ = upload(h, lse);
    dbuf *gq = upload(h, dq0), *gk = upload(h, dk0), *gv = upload(h, dv0);
    h.ok(k3c_attention_bwd_cuda(&s, cud, dq_->as<float>(), dk_->as<float>(), dv_->as<float>(), o_->as<float>(),
                                l_->as<float>(), ddo->as<float>(), gq->as<float>(), gk->as<float>(), gv->as<float>(),
                                wb.p, &h.err), "attention_bwd_cuda");
    std::vector<float> t;
    t = download<float>(h, *gq), h.compare("attention_bwd", shape, "dq", t.data(), dq.data(), tq, 1e-2, dq0.data());
    t = download<float>(h, *gk), h.compare("attention_bwd", shape, "dk", t.data(), dk.data(), tq, 1e-2, dk0.data());
    t = download<float>(h, *gv), h.compare("attention_bwd", shape, "dv", t.data(), dv.data(), tv, 1e-2, dv0.data());
    delete dq_, delete dk_, delete dv_, delete ddo, delete cu, delete o_, delete l_, delete gq, delete gk, delete gv;
}

int main(int argc, char **argv) {
    harness h;
    k3c_cuda_ctx ctx;
    h.ok(k3c_cuda_init(&ctx, 0, 0, &h.err), "k3c_cuda_init");
    const uint64_t seed = argc > 1 ? strtoull(argv[1], nullptr, 0) : (uint64_t)time(nullptr);
    printf("device %s, %d SMs, seed %llu\n", ctx.name, ctx.sm_count, (unsigned long long)seed);
    k3c_rng r = {seed, 0};
    const char *only = getenv("K3C_HARNESS_ONLY"); /* gemm | kda | kdabwd | attn */
    auto want = [&](const char *w) { return !only || strstr(only, w); };

    if (want("gemm")) test_gemm(h, &ctx, &r);
    std::vector<kda_case> kc = {
        {300, 3, 128, 128, {0, 37, 37, 200, 300}, -5, 0, 1},
        {256, 2, 128, 128, {}, -5, 1, 0},
        {190, 2, 64, 64, {0, 65, 190}, 0, 0, 1},
        {129, 2, 32, 64, {}, -5, 0, 1},
        {200, 2, 128, 256, {0, 120, 200}, 0, 0, 0},
    };
    if (want("kda"))
        for (auto &c : kc) test_kda_fwd(h, &r, c);
    if (want("kdabwd"))
        for (auto &c : kc) test_kda_bwd(h, &r, c);
    std::vector<attn_case> ac = {
        {333, 2, 192, 128, {0, 100, 100, 257, 333}},
        {300, 2, 192, 128, {}},
        {200, 3, 128, 128, {0, 64, 200}},
        {150, 2, 48, 32, {0, 70, 150}},
        {130, 2, 24, 16, {}},
    };
    if (want("attn"))
        for (auto &c : ac) test_attention(h, &r, c);
    k3c_cuda_destroy(&ctx);
    return h.summary();
}
