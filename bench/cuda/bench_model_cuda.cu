/* bench_model_cuda.cu — one whole-model training step (gradients zeroed, forward, backward and, on the GPU, the
 * optimizer update) of a config on the CUDA backend and on the CPU reference: ms per step and tokens/s, median of
 * several steps after warm-up (the anchor's step, side_device.py, ends with a fused AdamW update).
 * Usage: bench_model_cuda [config.json] [tokens] [docs] [gemm 0|1|2: fp32, tf32, bf16] [cpu 0|1: also time the CPU reference]
 *        [recompute 0|1: keep only layer outputs, re-run layers in the backward] — long sequences: docs 1, recompute 1.
 *        [optimizer adamw (default) | muon | none: the GPU step's update, state in device memory]
 *        [muon precision auto (default: bf16, fp32 with gemm 0) | fp32 | bf16: the Newton–Schulz products of the step]
 * With muon, the update alone is also timed at fp32 and at bf16 Newton–Schulz, with its share of the step. */
#include <algorithm>
#include <chrono>
#include <cstring>

#include "cuda/testing.cuh"

extern "C" {
#include "model/model.h"
#include "ops/backend.h"
#include "ops/optim.h"
}

static double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/* The update that ends the GPU step: the trainer's optimizer (src/train/trainer.c) through the backend table, its
 * state zeroed in backend memory, at a constant learning rate. */
struct step_update {
    const k3c_backend_f32 *be = nullptr;
    k3c_optim opt{};
    void *inst = nullptr;
    float *state = nullptr;
    int64_t step = 0;
    void open(harness &h, const k3c_backend_f32 *table, const k3c_model &m, const char *matrix, const char *precision) {
        be = table;
        k3c_optim_defaults(&opt);
        h.ok(k3c_optim_parse_matrix(matrix, &opt.matrix_optimizer, &h.err), "optimizer name");
        h.ok(k3c_optim_parse_muon_precision(precision, &opt.muon_precision, &h.err), "muon precision");
        h.ok(k3c_optim_init(&opt, &m.table, &h.err), "optimizer init");
        state = (float *)be->alloc(sizeof(float) * (opt.state_numel ? opt.state_numel : 1));
        if (!state) h.ok(k3c_errf(&h.err, K3C_ENOMEM, "optimizer state"), "optimizer state");
        h.ok(be->zero(state, (int64_t)opt.state_numel, &h.err), "optimizer state");
        h.ok(be->optim_open(be->ctx, &opt, &m.table, &inst, &h.err), "optimizer open");
    }
    void run(harness &h, k3c_model &m) {
        if (!be) return;
        h.ok(be->optim_step(inst, &opt, &m.table, 0, m.table.n, (float *)m.w, (const float *)m.g, state, 1e-4, ++step,
                            &h.err),
             "optimizer step");
    }
    /* Median ms of `reps` updates alone at a Newton–Schulz precision (synchronised; the gradients as the last step
     * left them), then the precision restored. */
    double time_alone(harness &h, k3c_model &m, int precision, int reps) {
        const int keep = opt.muon_precision;
        opt.muon_precision = precision;
        std::vector<double> t;
        for (int i = 0; i <= reps; i++) {
            const double t0 = now_ms();
            run(h, m);
            h.ok(be->sync(&h.err), "sync");
            if (i) t.push_back(now_ms() - t0);
        }
        opt.muon_precision = keep;
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    }
    void close() { /* before the backend goes */
        if (!be) return;
        be->optim_close(inst);
        be->free(state);
        k3c_optim_free(&opt);
        be = nullptr;
    }
};

/* Median ms of `reps` steps (after one warm-up step): zero the gradients, forward, backward, the update (if any). */
static double time_steps(harness &h, k3c_model &m, const k3c_model_batch &b, int reps, double *arena_gib = nullptr,
                         double *used_gib = nullptr, step_update *upd = nullptr) {
    k3c_arena arena{};
    const size_t bytes = k3c_model_plan_bytes_f32(&m, b.T, b.n_docs);
    if (arena_gib) *arena_gib = (double)bytes / (1u << 30);
    h.ok(k3c_model_arena_init_f32(&m, bytes, &arena, &h.err), "arena");
    std::vector<double> t;
    for (int i = 0; i <= reps; i++) {
        const double t0 = now_ms();
        k3c_arena_reset(&arena, 0);
        if (upd && upd->be) h.ok(upd->be->zero((float *)m.g, (int64_t)m.table.total, &h.err), "zero gradients");
        k3c_acts *acts;
        double loss;
        h.ok(k3c_model_forward_f32(&m, &b, &arena, &acts, &loss, nullptr, &h.err), "forward");
        h.ok(k3c_model_backward_f32(&m, acts, 1.0, &h.err), "backward"); /* ends with a synchronisation */
        if (upd) upd->run(h, m);
        if (upd && upd->be) h.ok(upd->be->sync(&h.err), "sync");
        if (i) t.push_back(now_ms() - t0);
    }
    size_t free_b = 0, total_b = 0;
    if (used_gib && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
        *used_gib = (double)(total_b - free_b) / (1u << 30);
    k3c_model_arena_free_f32(&m, &arena);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main(int argc, char **argv) {
    const char *cfg_path = argc > 1 ? argv[1] : "configs/k3_tiny.json";
    const int64_t T = argc > 2 ? atoll(argv[2]) : 16384;
    const int docs = argc > 3 ? atoi(argv[3]) : 16;
    const int gemm = argc > 4 ? atoi(argv[4]) : K3C_GEMM_TF32;
    const int with_cpu = argc > 5 ? atoi(argv[5]) : 1;
    const int recompute = argc > 6 ? atoi(argv[6]) : 0;
    const char *optimizer = argc > 7 ? argv[7] : "adamw";
    const char *precision = argc > 8 ? argv[8] : "auto";
    const int reps = T >= 262144 ? 3 : 10; /* a 1M-token step takes tens of seconds */
    harness h;
    k3c_config cfg;
    h.ok(k3c_config_load(cfg_path, &cfg, &h.err), "config");
    k3c_cuda_backend cb;
    h.ok(k3c_cuda_backend_init(&cb, 0, gemm, &h.err), "cuda backend");
    std::vector<int32_t> ids((size_t)T), cu((size_t)docs + 1);
    k3c_rng r = {7, 0};
    for (auto &x : ids) x = (int32_t)(k3c_rng_u64(&r) % (uint64_t)cfg.vocab_size);
    for (int d = 0; d <= docs; d++) cu[d] = (int32_t)(T * d / docs);
    k3c_model_batch b = {T, docs, ids.data(), cu.data(), nullptr, 0, 0, nullptr, nullptr, nullptr, nullptr};
    k3c_model m;
    h.ok(k3c_model_create_f32(&cfg, 1, &m, &h.err), "create");
    k3c_model_init_f32(&m, 1, 0.02);
    m.kda_chunk = 64;
    for (int l = 0; l < cfg.num_layers; l++) m.recompute[l] = (uint8_t)recompute;
    const double cpu_ms = with_cpu ? time_steps(h, m, b, 2) : NAN;
    h.ok(k3c_model_use_backend_f32(&m, &cb.table, &h.err), "to cuda");
    double arena_gib = 0, used_gib = NAN;
    step_update upd;
    if (strcmp(optimizer, "none") != 0) upd.open(h, &cb.table, m, optimizer, precision);
    const double gpu_ms = time_steps(h, m, b, reps, &arena_gib, &used_gib, &upd);
    /* the update alone at each Newton–Schulz precision, and the step it makes with the rest of this step */
    const bool muon = strcmp(optimizer, "muon") == 0;
    const int asked = upd.opt.muon_precision; /* auto: fp32 only in the fp32 GEMM (checking) mode */
    const int step_prec =
        asked == K3C_MUON_FP32 || (asked == K3C_MUON_AUTO && gemm == K3C_GEMM_FP32) ? K3C_MUON_FP32 : K3C_MUON_BF16;
    double upd_ms[3] = {NAN, NAN, NAN}; /* by k3c_muon_precision: FP32, BF16 */
    if (muon)
        for (int p = K3C_MUON_FP32; p <= K3C_MUON_BF16; p++) upd_ms[p] = upd.time_alone(h, m, p, reps);
    double f16_ms = NAN; /* the fp16-kernel variant only at training lengths: a long step takes tens of seconds */
    if (T < 262144) {
        k3c_cuda_backend_kernels(&cb, K3C_KERNELS_FP16);
        h.ok(k3c_model_use_backend_f32(&m, &cb.table, &h.err), "to cuda (fp16 kernels)");
        f16_ms = time_steps(h, m, b, reps, nullptr, nullptr, &upd);
    }
    printf(
        "\n==== whole-model training step (forward + backward + %s update), %s, %lld tokens in %d documents, recompute "
        "%d ====\n",
        optimizer, cfg_path, (long long)T, docs, recompute);
    printf("memory: activation arena %.2f GiB; device memory in use at the end of the steps %.2f GiB\n", arena_gib,
           used_gib);
    printf("%-28s %12s %14s\n", "backend", "ms/step", "tokens/s");
    printf("%-28s %12.2f %14.0f\n", "cpu (OpenMP, no update)", cpu_ms, T / cpu_ms * 1e3);
    printf("cuda (%s GEMMs)%*s %12.2f %14.0f\n", k3c_gemm_mode_name(gemm), 11, "", gpu_ms, T / gpu_ms * 1e3);
    printf("%-28s %12.2f %14.0f\n", "  same, fp16 KDA/attention", f16_ms, T / f16_ms * 1e3);
    if (with_cpu) printf("speed-up %.1fx on %s\n", cpu_ms / gpu_ms, cb.cu.name);
    if (muon) {
        const double rest = gpu_ms - upd_ms[step_prec]; /* forward + backward of the measured step */
        for (int p = K3C_MUON_FP32; p <= K3C_MUON_BF16; p++)
            printf("muon update (%s Newton-Schulz): %.2f ms/step, %.1f%% of a %.2f ms step%s\n",
                   p == K3C_MUON_FP32 ? "fp32" : "bf16", upd_ms[p], 100.0 * upd_ms[p] / (rest + upd_ms[p]),
                   rest + upd_ms[p], p == step_prec ? " (the step above)" : "");
    }
    upd.close();
    k3c_model_free_f32(&m);
    k3c_cuda_backend_destroy(&cb);
    return 0;
}
