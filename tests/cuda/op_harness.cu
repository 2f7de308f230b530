/* op_harness.cu — runs every CUDA op against its CPU float32 twin from libk3c.a on fresh random inputs (seed printed),
 * outputs poisoned with NaN before each run; bf16 paths within 1e-2 relative, their fp16 variants within 2e-3, fp32
 * paths within 1e-4. docs/CODE.md "Ops" (one harness over every backend). Built and run by tools/device_cuda.sh only (needs a GPU). */
#include <time.h>

#include <algorithm>

#include "cuda/testing.cuh"

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
                                &h.err),
             "gemm bf16");
        std::vector<float> got = download<float>(h, *dC);
        const std::string shape = fmt("%lldx%lldx%lld t%d%d", (long long)M, (long long)N, (long long)K, ta, tb);
        h.compare("gemm_bf16 (f32 out)", shape, "C", got.data(), ref.data(), got.size(), 1e-4);
        /* bf16 output, beta = 0, poisoned */
        dbuf dCb(h, M * N * 2);
        dCb.poison(h);
        h.ok(k3c_gemm_bf16_cuda(ctx, ta, tb, M, N, K, 1.f, dA->as<uint16_t>(), dB->as<uint16_t>(), 0.f, dCb.p, 0,
                                &h.err),
             "gemm bf16 out");
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
                             &h.err),
             "matmul f32");
        std::vector<float> gotf = download<float>(h, *dCf);
        h.compare("matmul_f32", shape, "C", gotf.data(), reff.data(), gotf.size(), 1e-4);
        delete dA, delete dB, delete dC, delete dAf, delete dBf, delete dCf;
    }
}

/* ---------------------------------------------------------------- KDA
 * Tolerances: bf16 kernels 1e-2; their fp16 variants 2e-3 (the same algorithm with rounding 8× finer than
 * bf16's: an error that did not shrink with the element would be the algorithm's, not the storage's). */
static const double TOL_F16 = 2e-3;
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
        if (c.lb < 0)
            g = (float)(c.lb * sigm(c.saturated ? 6.0 + 0.5 * z : 1.5 * z));
        else
            g = (float)(-exp(3.0 * k3c_rng_uniform(r)) * log1p(exp(z))); /* −a·softplus(u), a ∈ [1, 20] */
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
    h.ok(k3c_kda_chunk_fwd_cuda(&d, cud, q->as<float>(), k->as<float>(), v->as<float>(), g->as<float>(), b->as<float>(),
                                h0d, o.as<float>(), ht.as<float>(), dws.p, &h.err),
         "kda_chunk_fwd_cuda");
    h.ok(k3c_cuda_sync(&h.err), "sync kda_chunk_fwd_cuda");
    std::vector<float> og = download<float>(h, o), hg = download<float>(h, ht);
    h.compare("kda_chunk_fwd", shape, "o", og.data(), o_ref.data(), tv, 1e-2);
    h.compare("kda_chunk_fwd", shape, "ht", hg.data(), ht_ref.data(), ns, 1e-2);
    h.compare("kda_chunk_fwd~recur", shape, "o", og.data(), o_rec.data(), tv, 1e-2); /* vs the CPU recurrence too */

    /* the fp16 variant of the same kernels */
    o.poison(h), ht.poison(h);
    h.ok(k3c_kda_chunk_fwd_f16_cuda(&d, cud, q->as<float>(), k->as<float>(), v->as<float>(), g->as<float>(),
                                    b->as<float>(), h0d, o.as<float>(), ht.as<float>(), dws.p, &h.err),
         "kda_chunk_fwd_f16_cuda");
    og = download<float>(h, o), hg = download<float>(h, ht);
    h.compare("kda_chunk_fwd_f16", shape, "o", og.data(), o_ref.data(), tv, TOL_F16);
    h.compare("kda_chunk_fwd_f16", shape, "ht", hg.data(), ht_ref.data(), ns, TOL_F16);

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
                                         &h.err),
             "kda_chunk_fwd_bf16_cuda");
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
    dbuf *gq = nullptr, *gk = nullptr, *gv = nullptr, *gg = nullptr, *gb = nullptr, *gh = nullptr;
    dbuf dws(h, k3c_kda_chunk_bwd_workspace_cuda(&d));
    const std::string shape = kda_shape(c);
    std::vector<float> t;
    for (int f16 = 1; f16 >= 0; f16--) { /* the fp16 variant, then the bf16 kernels (kept for the check below) */
        delete gq, delete gk, delete gv, delete gg, delete gb, delete gh;
        gq = upload(h, dq0), gk = upload(h, dk0), gv = upload(h, dv0), gg = upload(h, dg0), gb = upload(h, db0);
        gh = upload(h, dh00);
        h.ok((f16 ? k3c_kda_chunk_bwd_f16_cuda : k3c_kda_chunk_bwd_cuda)(
                 &d, cu ? cu->as<int32_t>() : nullptr, q->as<float>(), k->as<float>(), v->as<float>(), g->as<float>(),
                 b->as<float>(), h0 ? h0->as<float>() : nullptr, ddo->as<float>(), ddht->as<float>(), gq->as<float>(),
                 gk->as<float>(), gv->as<float>(), gg->as<float>(), gb->as<float>(),
                 c.with_h0 ? gh->as<float>() : nullptr, dws.p, &h.err),
             "kda_chunk_bwd_cuda");
        h.ok(k3c_cuda_sync(&h.err), "sync kda_chunk_bwd_cuda");
        const char *op = f16 ? "kda_chunk_bwd_f16" : "kda_chunk_bwd";
        const double tol = f16 ? TOL_F16 : 1e-2;
        t = download<float>(h, *gq), h.compare(op, shape, "dq", t.data(), dq.data(), tk, tol, dq0.data());
        t = download<float>(h, *gk), h.compare(op, shape, "dk", t.data(), dk.data(), tk, tol, dk0.data());
        t = download<float>(h, *gv), h.compare(op, shape, "dv", t.data(), dv.data(), tv, tol, dv0.data());
        t = download<float>(h, *gg), h.compare(op, shape, "dg", t.data(), dg.data(), tk, tol, dg0.data());
        t = download<float>(h, *gb), h.compare(op, shape, "dbeta", t.data(), db.data(), tb, tol, db0.data());
        if (c.with_h0)
            t = download<float>(h, *gh), h.compare(op, shape, "dh0", t.data(), dh0.data(), ns, tol, dh00.data());
    }
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
        t = download<float>(h, *gb),
        h.compare("kda_chunk_bwd~bf16in", shape, "dbeta", t.data(), rb.data(), tb, 1e-2, db0.data());
        t = download<float>(h, *gg),
        h.compare("kda_chunk_bwd~bf16in", shape, "dg", t.data(), rg.data(), tk, 1e-2, dg0.data());
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
                               dk.data(), dv.data(), ws.data(), &h.err),
         "cpu attention_bwd");

    dbuf *dq_ = upload(h, q), *dk_ = upload(h, k), *dv_ = upload(h, v), *ddo = upload(h, dout);
    dbuf *cu = c.cu.empty() ? nullptr : upload(h, c.cu);
    const int32_t *cud = cu ? cu->as<int32_t>() : nullptr;
    dbuf go(h, tv * 4), gl(h, tl * 4), wf(h, k3c_attention_fwd_workspace_cuda(&s)),
        wb(h, k3c_attention_workspace_cuda(&s));
    const std::string shape =
        fmt("T%d H%d dqk%d dv%d docs%d", c.T, c.H, c.dqk, c.dv, c.cu.empty() ? 1 : (int)c.cu.size() - 1);
    go.poison(h), gl.poison(h);
    h.ok(k3c_attention_fwd_cuda(&s, cud, dq_->as<float>(), dk_->as<float>(), dv_->as<float>(), go.as<float>(),
                                gl.as<float>(), wf.p, &h.err),
         "attention_fwd_cuda");
    std::vector<float> og = download<float>(h, go), lg = download<float>(h, gl);
    h.compare("attention_fwd", shape, "o", og.data(), o.data(), tv, 1e-2);
    h.compare("attention_fwd", shape, "lse", lg.data(), lse.data(), tl, 1e-2);
    go.poison(h), gl.poison(h);
    h.ok(k3c_attention_fwd_f16_cuda(&s, cud, dq_->as<float>(), dk_->as<float>(), dv_->as<float>(), go.as<float>(),
                                    gl.as<float>(), wf.p, &h.err),
         "attention_fwd_f16_cuda");
    og = download<float>(h, go), lg = download<float>(h, gl);
    h.compare("attention_fwd_f16", shape, "o", og.data(), o.data(), tv, TOL_F16);
    h.compare("attention_fwd_f16", shape, "lse", lg.data(), lse.data(), tl, TOL_F16);

    /* backward from the CPU forward's o and lse, gradients pre-filled (the op adds) */
    dbuf *o_ = upload(h, o), *l_ = upload(h, lse);
    dbuf *gq = nullptr, *gk = nullptr, *gv = nullptr;
    for (int f16 = 0; f16 < 2; f16++) {
        delete gq, delete gk, delete gv;
        gq = upload(h, dq0), gk = upload(h, dk0), gv = upload(h, dv0);
        h.ok((f16 ? k3c_attention_bwd_f16_cuda : k3c_attention_bwd_cuda)(
                 &s, cud, dq_->as<float>(), dk_->as<float>(), dv_->as<float>(), o_->as<float>(), l_->as<float>(),
                 ddo->as<float>(), gq->as<float>(), gk->as<float>(), gv->as<float>(), wb.p, &h.err),
             "attention_bwd_cuda");
        const char *op = f16 ? "attention_bwd_f16" : "attention_bwd";
        const double tol = f16 ? TOL_F16 : 1e-2;
        std::vector<float> t;
        t = download<float>(h, *gq), h.compare(op, shape, "dq", t.data(), dq.data(), tq, tol, dq0.data());
        t = download<float>(h, *gk), h.compare(op, shape, "dk", t.data(), dk.data(), tq, tol, dk0.data());
        t = download<float>(h, *gv), h.compare(op, shape, "dv", t.data(), dv.data(), tv, tol, dv0.data());
    }
    delete dq_, delete dk_, delete dv_, delete ddo, delete cu, delete o_, delete l_, delete gq, delete gk, delete gv;
}

/* ---------------------------------------------------------------- MoE: router, plan, gather / combine, GLU, experts
 * fp32 paths: ids and the plan must match exactly (tol 0), values within 1e-4 relative. */
extern "C" {
#include "ops/moe.h"
}

static std::vector<float> as_float(const std::vector<int32_t> &v) { return std::vector<float>(v.begin(), v.end()); }

struct router_case {
    int T, n, k, renorm, with_bias;
    double scale;
};

static void test_router(harness &h, k3c_rng *r, const router_case &c) {
    k3c_router_sizes s = {c.T, c.n, c.k, c.renorm, c.scale};
    const size_t tn = (size_t)c.T * c.n, tk = (size_t)c.T * c.k;
    std::vector<float> logits = randn(r, tn, 2.0), bias = randn(r, c.n, 0.1);
    std::vector<int32_t> ids(tk);
    std::vector<float> w(tk), cut(c.T);
    h.ok(k3c_router_fwd_f32(&s, logits.data(), c.with_bias ? bias.data() : nullptr, ids.data(), w.data(), cut.data(),
                            &h.err),
         "cpu router_fwd");
    std::vector<float> dw = randn(r, tk), dl0 = randn(r, tn), dl = dl0;
    h.ok(k3c_router_bwd_f32(&s, logits.data(), ids.data(), dw.data(), dl.data(), &h.err), "cpu router_bwd");
    dbuf *dlg = upload(h, logits), *db = upload(h, bias), *ddw = upload(h, dw), *gdl = upload(h, dl0);
    dbuf gid(h, tk * 4), gw(h, tk * 4), gc(h, (size_t)c.T * 4), flag(h, 4);
    gid.poison(h), gw.poison(h), gc.poison(h);
    h.ok(k3c_cuda_fill_u8(flag.p, 0, 4, &h.err), "zero flag");
    h.ok(k3c_router_fwd_cuda(&s, dlg->as<float>(), c.with_bias ? db->as<float>() : nullptr, gid.as<int32_t>(),
                             gw.as<float>(), gc.as<float>(), flag.as<int>(), &h.err),
         "router_fwd_cuda");
    const std::string shape = fmt("T%d n%d k%d renorm%d bias%d", c.T, c.n, c.k, c.renorm, c.with_bias);
    std::vector<int32_t> gi = download<int32_t>(h, gid), fl = download<int32_t>(h, flag);
    std::vector<float> gwv = download<float>(h, gw), gcv = download<float>(h, gc);
    std::vector<float> gif = as_float(gi), rif = as_float(ids);
    h.compare("router_fwd", shape, "ids", gif.data(), rif.data(), tk, 0.0);
    h.compare("router_fwd", shape, "w", gwv.data(), w.data(), tk, 1e-4);
    if (c.k < c.n) h.compare("router_fwd", shape, "cutoff", gcv.data(), cut.data(), c.T, 1e-4);
    float fz = (float)fl[0], zero = 0.f;
    h.compare("router_fwd", shape, "nonfin", &fz, &zero, 1, 0.0);
    /* backward on the CPU's ids (so a selection difference cannot hide in it) */
    dbuf *did = upload(h, ids);
    h.ok(k3c_router_bwd_cuda(&s, dlg->as<float>(), did->as<int32_t>(), ddw->as<float>(), gdl->as<float>(), &h.err),
         "router_bwd_cuda");
    std::vector<float> t = download<float>(h, *gdl);
    h.compare("router_bwd", shape, "dlogit", t.data(), dl.data(), tn, 1e-4, dl0.data());
    delete dlg, delete db, delete ddw, delete gdl, delete did;
}

/* k distinct experts per token from the first E − 1 (expert E − 1 stays empty), ~6% of slots dropped (−1). */
static std::vector<int32_t> random_ids(k3c_rng *r, int T, int k, int E) {
    std::vector<int32_t> ids((size_t)T * k);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int32_t e;
            bool dup;
            do {
                e = (int32_t)(k3c_rng_uniform(r) * (E - 1));
                dup = false;
                for (int i = 0; i < j; i++) dup |= ids[(size_t)t * k + i] == e;
            } while (dup);
            ids[(size_t)t * k + j] = e;
        }
    for (auto &e : ids)
        if (k3c_rng_uniform(r) < 0.06) e = -1;
    return ids;
}

struct moe_case {
    int T, D, I, E, k, situ;
};

static void test_moe(harness &h, k3c_cuda_ctx *ctx, k3c_rng *r, const moe_case &c) {
    k3c_moe_sizes s = {c.T, c.D, c.I, c.E, c.k, {c.situ ? K3C_ACT_SITU : K3C_ACT_SILU, 4.0, 25.0}};
    const size_t S = (size_t)c.T * c.k, TD = (size_t)c.T * c.D, W = (size_t)c.E * c.I * c.D;
    const std::string shape = fmt("T%d D%d I%d E%d k%d %s", c.T, c.D, c.I, c.E, c.k, c.situ ? "situ" : "silu");
    std::vector<int32_t> ids = random_ids(r, c.T, c.k, c.E);
    std::vector<float> x = randn(r, TD), w = randn(r, S, 0.5), w1 = randn(r, W, 3.0 / sqrt((double)c.D)),
                       w3 = randn(r, W, 20.0 / sqrt((double)c.D)), w2 = randn(r, W, 1.0 / sqrt((double)c.I));

    /* plan, gather, combine */
    std::vector<int64_t> off(c.E + 1);
    std::vector<int32_t> perm(S), pos(S);
    h.ok(k3c_moe_plan(c.T, c.k, c.E, ids.data(), off.data(), perm.data(), pos.data(), &h.err), "cpu moe_plan");
    dbuf *dids = upload(h, ids), *dx = upload(h, x), *dw = upload(h, w);
    dbuf goff(h, (c.E + 1) * 8), gperm(h, S * 4), gpos(h, S * 4);
    goff.poison(h), gperm.poison(h), gpos.poison(h);
    std::vector<int64_t> offh(c.E + 1);
    h.ok(k3c_moe_plan_cuda(c.T, c.k, c.E, dids->as<int32_t>(), goff.as<int64_t>(), gperm.as<int32_t>(),
                           gpos.as<int32_t>(), offh.data(), &h.err),
         "moe_plan_cuda");
    const int64_t rows = off[c.E];
    std::vector<int64_t> go = download<int64_t>(h, goff);
    std::vector<float> gof(go.begin(), go.end()), rof(off.begin(), off.end()), ohf(offh.begin(), offh.end());
    std::vector<int32_t> gp = download<int32_t>(h, gperm), gq = download<int32_t>(h, gpos);
    gp.resize(rows), perm.resize(rows);
    h.compare("moe_plan", shape, "offs", gof.data(), rof.data(), gof.size(), 0.0);
    h.compare("moe_plan", shape, "offs_h", ohf.data(), rof.data(), ohf.size(), 0.0);
    std::vector<float> a = as_float(gp), b = as_float(perm);
    h.compare("moe_plan", shape, "perm", a.data(), b.data(), rows, 0.0);
    a = as_float(gq), b = as_float(pos);
    h.compare("moe_plan", shape, "pos", a.data(), b.data(), S, 0.0);
    {
        std::vector<float> xp((size_t)rows * c.D), y(TD);
        k3c_moe_gather_f32(rows, c.k, c.D, perm.data(), x.data(), xp.data());
        k3c_moe_combine_f32(c.T, c.k, c.D, pos.data(), w.data(), xp.data(), y.data());
        dbuf gxp(h, std::max<size_t>(xp.size(), 1) * 4), gy(h, TD * 4);
        gxp.poison(h), gy.poison(h);
        h.ok(k3c_moe_gather_cuda(rows, c.k, c.D, gperm.as<int32_t>(), dx->as<float>(), gxp.as<float>(), &h.err),
             "moe_gather_cuda");
        h.ok(k3c_moe_combine_cuda(c.T, c.k, c.D, gpos.as<int32_t>(), dw->as<float>(), gxp.as<float>(), gy.as<float>(),
                                  &h.err),
             "moe_combine_cuda");
        std::vector<float> t = download<float>(h, gxp);
        h.compare("moe_gather", shape, "xperm", t.data(), xp.data(), xp.size(), 0.0);
        t = download<float>(h, gy);
        h.compare("moe_combine", shape, "y", t.data(), y.data(), TD, 1e-6);
    }

    /* experts: fwd (saving), bwd from the saved buffer and recomputing; gradients pre-filled (the op adds) */
    std::vector<float> y(TD);
    std::vector<unsigned char> ws(k3c_moe_workspace_f32(&s) + 64);
    h.ok(k3c_moe_fwd_f32(&s, x.data(), ids.data(), w.data(), w1.data(), w3.data(), w2.data(), y.data(), nullptr,
                         ws.data(), &h.err),
         "cpu moe_fwd");
    std::vector<float> dy = randn(r, TD), dx0 = randn(r, TD), dw10 = randn(r, W), dw30 = randn(r, W),
                       dw20 = randn(r, W), dp0 = randn(r, S);
    std::vector<float> rdx = dx0, rdw1 = dw10, rdw3 = dw30, rdw2 = dw20, rdp = dp0;
    h.ok(k3c_moe_bwd_f32(&s, x.data(), ids.data(), w.data(), w1.data(), w3.data(), w2.data(), nullptr, dy.data(),
                         rdx.data(), rdw1.data(), rdw3.data(), rdw2.data(), rdp.data(), ws.data(), &h.err),
         "cpu moe_bwd");
    dbuf *d1 = upload(h, w1), *d3 = upload(h, w3), *d2 = upload(h, w2), *ddy = upload(h, dy);
    dbuf gy(h, TD * 4), sv(h, k3c_moe_saved_bytes_cuda(&s)), gws(h, k3c_moe_workspace_cuda(&s));
    gy.poison(h), sv.poison(h), gws.poison(h);
    h.ok(k3c_moe_fwd_cuda(ctx, &s, dx->as<float>(), dids->as<int32_t>(), dw->as<float>(), d1->as<float>(),
                          d3->as<float>(), d2->as<float>(), gy.as<float>(), sv.p, gws.p, 0, &h.err),
         "moe_fwd_cuda");
    std::vector<float> t = download<float>(h, gy);
    h.compare("moe_fwd", shape, "y", t.data(), y.data(), TD, 1e-4);
    for (int use_saved = 1; use_saved >= 0; use_saved--) {
        dbuf *gdx = upload(h, dx0), *g1 = upload(h, dw10), *g3 = upload(h, dw30), *g2 = upload(h, dw20),
             *gp2 = upload(h, dp0);
        gws.poison(h);
        h.ok(k3c_moe_bwd_cuda(ctx, &s, dx->as<float>(), dids->as<int32_t>(), dw->as<float>(), d1->as<float>(),
                              d3->as<float>(), d2->as<float>(), use_saved ? sv.p : nullptr, ddy->as<float>(),
                              gdx->as<float>(), g1->as<float>(), g3->as<float>(), g2->as<float>(), gp2->as<float>(),
                              gws.p, 0, &h.err),
             "moe_bwd_cuda");
        const char *op = use_saved ? "moe_bwd (saved)" : "moe_bwd (recompute)";
        t = download<float>(h, *gdx), h.compare(op, shape, "dx", t.data(), rdx.data(), TD, 1e-4, dx0.data());
        t = download<float>(h, *g1), h.compare(op, shape, "dw1", t.data(), rdw1.data(), W, 1e-4, dw10.data());
        t = download<float>(h, *g3), h.compare(op, shape, "dw3", t.data(), rdw3.data(), W, 1e-4, dw30.data());
        t = download<float>(h, *g2), h.compare(op, shape, "dw2", t.data(), rdw2.data(), W, 1e-4, dw20.data());
        t = download<float>(h, *gp2), h.compare(op, shape, "dtopk_w", t.data(), rdp.data(), S, 1e-4, dp0.data());
        delete gdx, delete g1, delete g3, delete g2, delete gp2;
    }
    /* a bad id is K3C_EINVAL */
    {
        std::vector<int32_t> bad = ids;
        bad[S / 2] = c.E;
        dbuf *dbad = upload(h, bad);
        int rc = k3c_moe_plan_cuda(c.T, c.k, c.E, dbad->as<int32_t>(), goff.as<int64_t>(), gperm.as<int32_t>(),
                                   gpos.as<int32_t>(), nullptr, &h.err);
        float got = (float)rc, want = (float)K3C_EINVAL;
        h.compare("moe_plan (bad id)", shape, "rc", &got, &want, 1, 0.0);
        delete dbad;
    }
    delete dids, delete dx, delete dw, delete d1, delete d3, delete d2, delete ddy;
}

static void test_glu(harness &h, k3c_rng *r, int situ) {
    const int N = 333, I = 257;
    k3c_glu_sizes s = {N, I, {situ ? K3C_ACT_SITU : K3C_ACT_SILU, 4.0, 25.0}};
    const size_t n = (size_t)N * I;
    std::vector<float> g = randn(r, n, 4.0), u = randn(r, n, 30.0), dh = randn(r, n), hh(n);
    std::vector<float> dg0 = randn(r, n), du0 = randn(r, n), dg = dg0, du = du0;
    h.ok(k3c_glu_fwd_f32(&s, g.data(), u.data(), hh.data(), &h.err), "cpu glu_fwd");
    h.ok(k3c_glu_bwd_f32(&s, g.data(), u.data(), dh.data(), dg.data(), du.data(), &h.err), "cpu glu_bwd");
    dbuf *dgv = upload(h, g), *duv = upload(h, u), *ddh = upload(h, dh), *gdg = upload(h, dg0), *gdu = upload(h, du0);
    dbuf gh(h, n * 4);
    gh.poison(h);
    h.ok(k3c_glu_fwd_cuda(&s, dgv->as<float>(), duv->as<float>(), gh.as<float>(), &h.err), "glu_fwd_cuda");
    h.ok(k3c_glu_bwd_cuda(&s, dgv->as<float>(), duv->as<float>(), ddh->as<float>(), gdg->as<float>(), gdu->as<float>(),
                          &h.err),
         "glu_bwd_cuda");
    const std::string shape = fmt("N%d I%d %s", N, I, situ ? "situ 4/25" : "silu");
    std::vector<float> t = download<float>(h, gh);
    h.compare("glu_fwd", shape, "h", t.data(), hh.data(), n, 1e-4);
    t = download<float>(h, *gdg), h.compare("glu_bwd", shape, "dgate", t.data(), dg.data(), n, 1e-4, dg0.data());
    t = download<float>(h, *gdu), h.compare("glu_bwd", shape, "dup", t.data(), du.data(), n, 1e-4, du0.data());
    delete dgv, delete duv, delete ddh, delete gdg, delete gdu;
}

/* One timing (K3C_MOE_TIME=1): the latent MoE layer forward, T = 16384, D = 3584, I = 3072, E = 64, k = 8, SiTU, on
 * device-generated data routed by the CUDA router; median of 3 after 1 warm-up, fp32 and TF32 GEMMs. */
__global__ void moe_fill_kernel(float *p, size_t n, float sd, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (seed + i) * 0x9E3779B97F4A7C15ull;
        z ^= z >> 31, z *= 0x94D049BB133111EBull, z ^= z >> 29;
        p[i] = ((float)(z >> 40) * (1.0f / 16777216.0f) - 0.5f) * 3.4641016f * sd; /* uniform, sd `sd` */
    }
}

static void time_moe(harness &h, k3c_cuda_ctx *ctx) {
    const int64_t T = 16384, D = 3584, I = 3072, E = 64, k = 8;
    k3c_moe_sizes s = {T, D, I, E, k, {K3C_ACT_SITU, 4.0, 25.0}};
    k3c_router_sizes rs = {T, E, k, 1, 1.0};
    const size_t W = (size_t)E * I * D;
    dbuf x(h, T * D * 4), y(h, T * D * 4), w1(h, W * 4), w3(h, W * 4), w2(h, W * 4), lg(h, T * E * 4);
    dbuf ids(h, T * k * 4), tw(h, T * k * 4), sv(h, k3c_moe_saved_bytes_cuda(&s)), ws(h, k3c_moe_workspace_cuda(&s));
    moe_fill_kernel<<<4096, 256>>>(x.as<float>(), T * D, 1.f, 1);
    moe_fill_kernel<<<4096, 256>>>(w1.as<float>(), W, 1.f / sqrtf((float)D), 2);
    moe_fill_kernel<<<4096, 256>>>(w3.as<float>(), W, 1.f / sqrtf((float)D), 3);
    moe_fill_kernel<<<4096, 256>>>(w2.as<float>(), W, 1.f / sqrtf((float)I), 4);
    moe_fill_kernel<<<4096, 256>>>(lg.as<float>(), T * E, 1.f, 5);
    h.ok(k3c_router_fwd_cuda(&rs, lg.as<float>(), nullptr, ids.as<int32_t>(), tw.as<float>(), nullptr, nullptr, &h.err),
         "router (timing)");
    const double flops = 2.0 * T * k * 3.0 * D * I;
    for (int gemm = K3C_GEMM_FP32; gemm <= K3C_GEMM_BF16; gemm++) {
        std::vector<float> ms;
        for (int rep = 0; rep < 4; rep++) {
            cudaEvent_t a, b;
            cudaEventCreate(&a), cudaEventCreate(&b);
            cudaEventRecord(a, cudaStreamPerThread);
            h.ok(k3c_moe_fwd_cuda(ctx, &s, x.as<float>(), ids.as<int32_t>(), tw.as<float>(), w1.as<float>(),
                                  w3.as<float>(), w2.as<float>(), y.as<float>(), sv.p, ws.p, gemm, &h.err),
                 "moe_fwd_cuda (timing)");
            cudaEventRecord(b, cudaStreamPerThread);
            h.ok(k3c_cuda_sync(&h.err), "sync (timing)");
            float t;
            cudaEventElapsedTime(&t, a, b);
            cudaEventDestroy(a), cudaEventDestroy(b);
            if (rep) ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        const double m = ms[1];
        printf("TIMING moe_fwd_cuda %s T16384 D3584 I3072 E64 k8 situ: %.2f ms, %.1f TFLOP/s (%.1f%% of the 716 "
               "TFLOP/s bf16 dense anchor)\n",
               k3c_gemm_mode_name(gemm), m, flops / (m * 1e-3) / 1e12, 100.0 * flops / (m * 1e-3) / 716e12);
        fflush(stdout);
    }
}

int main(int argc, char **argv) {
    harness h;
    k3c_cuda_ctx ctx;
    k3c_rng r = harness_start(h, ctx, argc, argv);
    const char *only = getenv("K3C_HARNESS_ONLY"); /* gemm | kda | kdabwd | attn | moe */
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
    if (want("moe")) {
        for (int situ = 0; situ < 2; situ++) test_glu(h, &r, situ);
        std::vector<router_case> rc = {{300, 64, 8, 1, 1, 2.446}, {100, 16, 1, 1, 0, 1.0}, {77, 40, 6, 0, 1, 1.5}};
        for (auto &c : rc) test_router(h, &r, c);
        std::vector<moe_case> mc = {{150, 128, 192, 8, 3, 1}, {97, 96, 80, 5, 2, 0}, {64, 64, 64, 33, 4, 1},
                                   /* plans over many chunks of slots (moe.cu PLAN_CHUNK), K3's 896 experts */
                                   {4099, 16, 16, 64, 8, 0}, {700, 16, 16, 896, 8, 1}};
        for (auto &c : mc) test_moe(h, &ctx, &r, c);
    }
    if (getenv("K3C_MOE_TIME")) time_moe(h, &ctx);
    k3c_cuda_destroy(&ctx);
    return h.summary();
}
