/* test_vision_cuda.cu — the whole vision tower on the CUDA op table: the golden tower (../shared/golden/k3_vision_tiny)
 * on random packed items against the CPU float32 tower (embeddings and every parameter gradient), and with bf16 GEMMs
 * against the release code's bf16 run. The tower's ops one by one are rows of tests/test_backend_ops.c; vision
 * training on the GPU is tests/test_vision_data.c built by make cuda-tests. docs/VISION.md. Needs a GPU and ../shared
 * (or K3C_SHARED); usage: test_vision_cuda [seed]. */
#include "cuda/cuda_ops.h"
#include "cuda/testing.cuh"

/* fp32 against the CPU's fp32 (which sums in double): 1e-4, the attention's and the position table's row tolerance of
 * test_backend_ops. */
static const double TOL_SUM = 1e-4;

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
    const k3c_backend_f32 *gpu = &be.table;
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
