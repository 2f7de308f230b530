/* harness_vision.cu — checks the CUDA twins of the vision tower's ops (src/cuda/vision.cu: GELU tanh / erf, 2D rotary,
 * the interpolated position table both ways, block-diagonal attention, the sd2_tpool merge) through the CUDA op table
 * against the CPU float32 table on fresh random inputs (seed printed), outputs poisoned with NaN, gradients added onto
 * random initial contents, then the whole golden tower on CUDA against the CPU (embeddings, every gradient).
 * docs/VISION.md. Needs a GPU and ../shared (or K3C_SHARED); usage: harness_vision [seed]. */
#include "cuda/cuda_ops.h"
#include "cuda/testing.cuh"

/* fp32 against the CPU's fp32 (which sums in double): 1e-5 for pointwise ops and the merge, 1e-4 for the attention
 * (float dot products and softmax sums against the CPU's double ones) and the position table (double sums, float
 * taps on both sides). */
static const double TOL = 1e-5, TOL_SUM = 1e-4;

static std::vector<float> dl(harness &h, const dbuf &b) { return download<float>(h, b); }

/* n random inputs (std 2.5), or with tail = 1 the negative tail −9..−4 in steps of 1/8 (n = 41), where 1 + erf and
 * 1 + tanh cancel in float: the CPU computes in double, so a cancelling kernel is off by up to 1e-3 there. */
static void test_gelu(harness &h, k3c_rng *r, const k3c_backend_f32 *cpu, const k3c_backend_f32 *gpu, int64_t n,
                      int erf_form, int tail) {
    const char *op = erf_form ? "gelu_erf" : "gelu_tanh";
    std::vector<float> x = randn(r, n, 2.5), dy = randn(r, n), y(n), dx0(n), dx;
    for (int64_t i = 0; tail && i < n; i++) x[i] = -9.f + 0.125f * (float)i;
    for (int64_t i = 0; i < n; i++) dx0[i] = tail ? 0.f : (float)k3c_rng_normal(r); /* tail: dx is d·dy alone */
    dx = dx0;
    h.ok((erf_form ? cpu->gelu_erf : cpu->gelu_tanh)(n, x.data(), y.data(), &h.err), "cpu fwd");
    h.ok((erf_form ? cpu->gelu_erf_bwd : cpu->gelu_tanh_bwd)(n, x.data(), dy.data(), dx.data(), &h.err), "cpu bwd");
    dbuf gx(h, x.data(), n * 4), gy(h, n * 4), gdy(h, dy.data(), n * 4), gdx(h, dx0.data(), n * 4);
    gy.poison(h);
    h.ok((erf_form ? gpu->gelu_erf : gpu->gelu_tanh)(n, gx.as<float>(), gy.as<float>(), &h.err), op);
    h.ok((erf_form ? gpu->gelu_erf_bwd : gpu->gelu_tanh_bwd)(n, gx.as<float>(), gdy.as<float>(), gdx.as<float>(),
                                                             &h.err),
         op);
    std::vector<float> t = dl(h, gy);
    const std::string name = tail ? "tail" : fmt("n%lld", (long long)n);
    h.compare(op, name, "y", t.data(), y.data(), n, TOL);
    t = dl(h, gdx), h.compare(op, name, "dx", t.data(), dx.data(), n, TOL, dx0.data());
}

/* Packed items of the given grids: rope, position table, attention and merge on the same shapes. */
static void test_items(harness &h, k3c_rng *r, const k3c_backend_f32 *cpu, const k3c_backend_f32 *gpu,
                       const std::vector<k3c_grid_thw> &g, int64_t H, int64_t dh, int64_t D, int mode) {
    const int n = (int)g.size();
    const int64_t L = k3c_grid_tokens(g.data(), n, &h.err);
    int64_t N = 0;
    std::vector<int32_t> cu(n + 1, 0);
    for (int i = 0; i < n; i++) cu[i + 1] = cu[i] + (int32_t)(g[i].t * g[i].h * g[i].w), N += g[i].h / 2 * (g[i].w / 2);
    std::string shape = fmt("n%d L%lld H%lld dh%lld D%lld %s", n, (long long)L, (long long)H, (long long)dh,
                            (long long)D, mode ? "bicubic" : "bilinear");
    dbuf gg(h, g.data(), n * sizeof(k3c_grid_thw)), gcu(h, cu.data(), (n + 1) * 4);
    /* rope */
    const int64_t nq = L * H * dh;
    std::vector<float> cs(L * dh), q = randn(r, nq), dq = randn(r, nq), yq(nq), dq0 = randn(r, nq), dqc = dq0;
    h.ok(k3c_rope2d_table_f32(g.data(), n, dh, 10000.0, cs.data(), &h.err), "rope table");
    h.ok(cpu->rope2d_fwd(L, H, dh, cs.data(), q.data(), yq.data(), &h.err), "cpu rope");
    h.ok(cpu->rope2d_bwd(L, H, dh, cs.data(), dq.data(), dqc.data(), &h.err), "cpu rope bwd");
    {
        dbuf gcs(h, cs.data(), cs.size() * 4), gq(h, q.data(), nq * 4), gy(h, nq * 4), gdy(h, dq.data(), nq * 4),
            gdx(h, dq0.data(), nq * 4);
        gy.poison(h);
        h.ok(gpu->rope2d_fwd(L, H, dh, gcs.as<float>(), gq.as<float>(), gy.as<float>(), &h.err), "rope2d_fwd");
        h.ok(gpu->rope2d_bwd(L, H, dh, gcs.as<float>(), gdy.as<float>(), gdx.as<float>(), &h.err), "rope2d_bwd");
        std::vector<float> t = dl(h, gy);
        h.compare("rope2d", shape, "y", t.data(), yq.data(), nq, TOL);
        t = dl(h, gdx), h.compare("rope2d", shape, "dx", t.data(), dqc.data(), nq, TOL, dq0.data());
    }
    /* position table 6 × 5 × D, T0 4 */
    const k3c_posemb_sizes ps = {6, 5, 4, D, mode};
    const int64_t nt = 6 * 5 * D;
    std::vector<float> tab = randn(r, nt), x0 = randn(r, L * D), x = x0, dx = randn(r, L * D), dt0 = randn(r, nt),
                       dt = dt0;
    h.ok(cpu->posemb_fwd(&ps, g.data(), n, L, tab.data(), x.data(), &h.err), "cpu posemb");
    h.ok(cpu->posemb_bwd(&ps, g.data(), n, dx.data(), dt.data(), &h.err), "cpu posemb bwd");
    {
        dbuf gt(h, tab.data(), nt * 4), gx(h, x0.data(), L * D * 4), gdx(h, dx.data(), L * D * 4),
            gdt(h, dt0.data(), nt * 4);
        h.ok(gpu->posemb_fwd(&ps, gg.as<k3c_grid_thw>(), n, L, gt.as<float>(), gx.as<float>(), &h.err), "posemb_fwd");
        h.ok(gpu->posemb_bwd(&ps, gg.as<k3c_grid_thw>(), n, gdx.as<float>(), gdt.as<float>(), &h.err), "posemb_bwd");
        std::vector<float> t = dl(h, gx);
        h.compare("posemb", shape, "x+=pe", t.data(), x.data(), L * D, TOL_SUM, x0.data());
        t = dl(h, gdt), h.compare("posemb", shape, "dtable", t.data(), dt.data(), nt, TOL_SUM, dt0.data());
    }
    /* attention */
    const k3c_vit_attn_sizes as = {L, H, dh, 1.0 / sqrt((double)dh)};
    std::vector<float> k = randn(r, nq), v = randn(r, nq), o(nq), lse(L * H), dout = randn(r, nq);
    std::vector<float> gq0 = randn(r, nq), gk0 = randn(r, nq), gv0 = randn(r, nq), cq = gq0, ck = gk0, cv = gv0;
    h.ok(cpu->vit_attention_fwd(&as, cu.data(), n, q.data(), k.data(), v.data(), o.data(), lse.data(), &h.err),
         "cpu att");
    h.ok(cpu->vit_attention_bwd(&as, cu.data(), n, q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(),
                                cq.data(), ck.data(), cv.data(), &h.err),
         "cpu att bwd");
    {
        dbuf dq_(h, q.data(), nq * 4), dk_(h, k.data(), nq * 4), dv_(h, v.data(), nq * 4), go(h, nq * 4),
            gl(h, L * H * 4), gdo(h, dout.data(), nq * 4), gdq(h, gq0.data(), nq * 4), gdk(h, gk0.data(), nq * 4),
            gdv(h, gv0.data(), nq * 4);
        go.poison(h), gl.poison(h);
        h.ok(gpu->vit_attention_fwd(&as, gcu.as<int32_t>(), n, dq_.as<float>(), dk_.as<float>(), dv_.as<float>(),
                                    go.as<float>(), gl.as<float>(), &h.err),
             "vit_attention_fwd");
        h.ok(gpu->vit_attention_bwd(&as, gcu.as<int32_t>(), n, dq_.as<float>(), dk_.as<float>(), dv_.as<float>(),
                                    go.as<float>(), gl.as<float>(), gdo.as<float>(), gdq.as<float>(), gdk.as<float>(),
                                    gdv.as<float>(), &h.err),
             "vit_attention_bwd");
        std::vector<float> t = dl(h, go);
        h.compare("vit_attention", shape, "o", t.data(), o.data(), nq, TOL_SUM);
        t = dl(h, gl), h.compare("vit_attention", shape, "lse", t.data(), lse.data(), L * H, TOL_SUM);
        t = dl(h, gdq), h.compare("vit_attention", shape, "dq", t.data(), cq.data(), nq, TOL_SUM, gq0.data());
        t = dl(h, gdk), h.compare("vit_attention", shape, "dk", t.data(), ck.data(), nq, TOL_SUM, gk0.data());
        t = dl(h, gdv), h.compare("vit_attention", shape, "dv", t.data(), cv.data(), nq, TOL_SUM, gv0.data());
    }
    /* merge */
    const int64_t K = 4 * D;
    std::vector<float> xm = randn(r, L * D), ym(N * K), dym = randn(r, N * K), dxm0 = randn(r, L * D), dxm = dxm0;
    h.ok(cpu->tpool_merge_fwd(g.data(), n, N, D, 2, 2, xm.data(), ym.data(), &h.err), "cpu merge");
    h.ok(cpu->tpool_merge_bwd(g.data(), n, L, D, 2, 2, dym.data(), dxm.data(), &h.err), "cpu merge bwd");
    {
        dbuf gx(h, xm.data(), L * D * 4), gy(h, N * K * 4), gdy(h, dym.data(), N * K * 4),
            gdx(h, dxm0.data(), L * D * 4);
        gy.poison(h);
        h.ok(gpu->tpool_merge_fwd(gg.as<k3c_grid_thw>(), n, N, D, 2, 2, gx.as<float>(), gy.as<float>(), &h.err),
             "tpool_merge_fwd");
        h.ok(gpu->tpool_merge_bwd(gg.as<k3c_grid_thw>(), n, L, D, 2, 2, gdy.as<float>(), gdx.as<float>(), &h.err),
             "tpool_merge_bwd");
        std::vector<float> t = dl(h, gy);
        h.compare("tpool_merge", shape, "y", t.data(), ym.data(), N * K, TOL);
        t = dl(h, gdx), h.compare("tpool_merge", shape, "dx", t.data(), dxm.data(), L * D, TOL, dxm0.data());
    }
}

/* The whole tower on CUDA against the CPU: the golden tower (../shared/golden/k3_vision_tiny) on random packed
 * items, embeddings and every parameter gradient. */
static void test_tower(harness &h, k3c_rng *r, const k3c_backend_f32 *gpu, const std::vector<k3c_grid_thw> &g) {
    const char *dir = getenv("K3C_SHARED") ? getenv("K3C_SHARED") : "../shared";
    char path[4096];
    snprintf(path, sizeof path, "%s/golden/k3_vision_tiny", dir);
    k3c_vision *vc = nullptr, *vg = nullptr;
    h.ok(k3c_vision_open_f32(path, 1, &vc, &h.err), "open tower (cpu)");
    h.ok(k3c_vision_open_f32(path, 1, &vg, &h.err), "open tower (gpu)");
    h.ok(k3c_vision_use_backend_f32(vg, gpu, &h.err), "k3c_vision_use_backend");
    const int n = (int)g.size();
    const int64_t L = k3c_grid_tokens(g.data(), n, &h.err);
    std::vector<float> px = randn(r, L * 3 * 14 * 14);
    k3c_vision_acts_f32 *ac = nullptr, *ag = nullptr;
    const float *ec = nullptr, *eg = nullptr;
    int64_t N = 0;
    h.ok(k3c_vision_forward_f32(vc, px.data(), g.data(), n, &ac, nullptr, &ec, &N, &h.err), "tower fwd (cpu)");
    h.ok(k3c_vision_forward_f32(vg, px.data(), g.data(), n, &ag, nullptr, &eg, nullptr, &h.err), "tower fwd (gpu)");
    const int64_t E = 128;
    std::vector<float> e(N * E), dy = randn(r, N * E);
    h.ok(k3c_cuda_d2h(e.data(), eg, e.size() * 4, &h.err), "d2h");
    const std::string shape = fmt("golden tower, %d items, L%lld", n, (long long)L);
    h.compare("vision_tower", shape, "embeds", e.data(), ec, N * E, TOL_SUM);
    h.ok(k3c_vision_backward_f32(vc, ac, dy.data(), nullptr, &h.err), "tower bwd (cpu)");
    h.ok(k3c_vision_backward_f32(vg, ag, dy.data(), nullptr, &h.err), "tower bwd (gpu)");
    const size_t np = k3c_vision_param_count(vc);
    std::vector<float> gg(np);
    h.ok(k3c_cuda_d2h(gg.data(), k3c_vision_grads(vg), np * 4, &h.err), "d2h grads");
    h.compare("vision_tower", shape, "grads", gg.data(), (const float *)k3c_vision_grads(vc), np, TOL_SUM);
    k3c_vision_acts_free_f32(ac);
    k3c_vision_acts_free_f32(ag);
    k3c_vision_free(vc);
    k3c_vision_free(vg);
}

/* bf16 on the GPU against the release code's bf16 run: the golden tower with every GEMM on bf16 tensor cores
 * (K3C_GEMM_BF16), the golden's packed images and 2-frame clip, both interpolation modes; the projector output within
 * 2e-2 (norm-wise) of the golden's bf16 output. The fp32 GPU tower's distance to the same bf16 golden is
 * printed beside it: bf16 runs of different implementations differ by rounding order, not by an error of either. */
static void test_tower_bf16(harness &h, const k3c_backend_f32 *gpu_bf16) {
    const char *dir = getenv("K3C_SHARED") ? getenv("K3C_SHARED") : "../shared";
    char path[4096], name[128];
    snprintf(path, sizeof path, "%s/golden/k3_vision_tiny", dir);
    k3c_config cfg;
    h.ok(k3c_config_load(path, &cfg, &h.err), "golden vision config");
    k3c_checkpoint *ck = nullptr;
    h.ok(k3c_ckpt_open(path, &ck, &h.err), "golden vision checkpoint");
    snprintf(path, sizeof path, "%s/golden/k3_vision_tiny/golden.safetensors", dir);
    k3c_safetensors *st = nullptr;
    h.ok(k3c_st_open(path, &st, &h.err), "golden.safetensors");
    auto read = [&](const char *nm) {
        const k3c_st_tensor *t = k3c_st_find(st, nm);
        if (!t) h.ok(k3c_errf(&h.err, K3C_EFORMAT, "%s: no tensor %s", path, nm), "golden tensor");
        size_t n = 1;
        for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
        std::vector<float> x(n);
        h.ok(k3c_st_read_f32(t, x.data(), n, &h.err), nm);
        return x;
    };
    for (int interp : {K3C_VISION_BILINEAR, K3C_VISION_BICUBIC})
        for (const char *cs : {"img", "vid"}) {
            cfg.vision.interp = interp;
            k3c_vision *v = nullptr;
            h.ok(k3c_vision_create_f32(&cfg.vision, 0, &v, &h.err), "tower");
            h.ok(k3c_vision_load_f32(v, ck, &h.err), "tower load");
            h.ok(k3c_vision_use_backend_f32(v, gpu_bf16, &h.err), "tower on the bf16 backend");
            snprintf(name, sizeof name, "input.%s.grid_thws", cs);
            const k3c_st_tensor *gt = k3c_st_find(st, name);
            if (!gt || gt->dtype != K3C_I64 || gt->ndim != 2 || gt->shape[1] != 3)
                h.ok(k3c_errf(&h.err, K3C_EFORMAT, "%s: %s is not I64 [n, 3]", path, name), "golden grid");
            std::vector<k3c_grid_thw> g((size_t)gt->shape[0]);
            memcpy(g.data(), gt->data, g.size() * sizeof g[0]);
            snprintf(name, sizeof name, "input.%s.pixel_values", cs);
            std::vector<float> px = read(name);
            const char *mode = interp == K3C_VISION_BICUBIC ? "bicubic" : "bilinear";
            snprintf(name, sizeof name, "%s.bf16.%s.proj.out", mode, cs);
            std::vector<float> ref = read(name);
            const float *eg = nullptr;
            int64_t N = 0;
            k3c_vision_acts_f32 *acts = nullptr;
            h.ok(k3c_vision_forward_f32(v, px.data(), g.data(), (int)g.size(), &acts, nullptr, &eg, &N, &h.err),
                 "tower fwd (bf16 GEMMs)");
            std::vector<float> e((size_t)N * cfg.vision.text_hidden);
            if (e.size() != ref.size())
                h.ok(k3c_errf(&h.err, K3C_EFORMAT, "%s: %zu values, golden %zu", name, e.size(), ref.size()), "size");
            h.ok(k3c_cuda_d2h(e.data(), eg, e.size() * 4, &h.err), "d2h");
            h.compare("vision_tower_bf16", fmt("golden %s %s, %zu items", mode, cs, g.size()), "proj", e.data(),
                      ref.data(), e.size(), 2e-2);
            k3c_vision_acts_free_f32(acts);
            k3c_vision_free(v);
        }
    k3c_st_close(st);
    k3c_ckpt_close(ck);
}

int main(int argc, char **argv) {
    harness h;
    k3c_cuda_ctx ctx;
    k3c_rng r = harness_start(h, ctx, argc, argv);
    k3c_cuda_backend be;
    h.ok(k3c_cuda_backend_init(&be, 0, 0, &h.err), "k3c_cuda_backend_init");
    const k3c_backend_f32 *cpu = k3c_backend_cpu_f32(), *gpu = &be.table;
    for (int erf_form = 0; erf_form < 2; erf_form++)
        for (int64_t n : {1, 1000, 1 << 20, 41}) test_gelu(h, &r, cpu, gpu, n, erf_form, n == 41);
    for (int mode = 0; mode < 2; mode++) {
        test_items(h, &r, cpu, gpu, {{1, 4, 6}, {1, 2, 2}}, 4, 24, 64, mode);              /* the golden's images */
        test_items(h, &r, cpu, gpu, {{2, 2, 4}, {3, 8, 6}, {1, 12, 10}}, 2, 16, 32, mode); /* frames, up / down */
        test_items(h, &r, cpu, gpu, {{1, 32, 32}}, 12, 128, 96, mode);                     /* the release's head dim */
    }
    test_tower(h, &r, gpu, {{1, 4, 6}, {1, 2, 2}});
    test_tower(h, &r, gpu, {{2, 2, 4}, {1, 20, 14}});
    k3c_cuda_backend bf;
    h.ok(k3c_cuda_backend_init(&bf, 0, K3C_GEMM_BF16, &h.err), "k3c_cuda_backend_init (bf16 GEMMs)");
    test_tower_bf16(h, &bf.table);
    h.ok(k3c_cuda_sync(&h.err), "final sync");
    k3c_cuda_backend_destroy(&bf);
    k3c_cuda_backend_destroy(&be);
    return h.summary();
}
