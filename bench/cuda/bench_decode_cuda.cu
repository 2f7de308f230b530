/* bench_decode_cuda.cu — decode speed of the inference engine on the GPU (`--device cuda`): batch-1 ms/token against the
 * bandwidth roofline (bytes one token must read / the device copy bandwidth measured in the same run) and aggregate
 * tokens/s of batches of decoding sequences, over a config with random float32 weights.
 * Usage: bench_decode_cuda [config.json] [prompt tokens] [decode steps] [batches, comma-separated]. */
#include <algorithm>
#include <chrono>

#include "cuda/testing.cuh"

extern "C" {
#include "model/model.h"
#include "serve/engine.h"
}

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/* Device-to-device copy bandwidth (read + write bytes per second) over 2 GiB buffers, best of 10. */
static double copy_bandwidth(harness &h) {
    const size_t bytes = (size_t)2 << 30;
    dbuf a(h, bytes), b(h, bytes);
    double best = 1e30;
    for (int i = 0; i < 10; i++) {
        h.ok(k3c_cuda_sync(&h.err), "sync");
        const double t0 = now_s();
        h.ok(k3c_cuda_copy(b.p, a.p, bytes, &h.err), "copy");
        h.ok(k3c_cuda_sync(&h.err), "sync");
        best = std::min(best, now_s() - t0);
    }
    return 2.0 * (double)bytes / best;
}

static double qbytes(const k3c_qmat &q) {
    if (!q.w) return 0;
    const double el = q.type == K3C_QMAT_F32 ? 4 : q.type == K3C_QMAT_BF16 ? 2 : 0.5 + 1.0 / 32;
    return el * (double)q.rows * (double)q.cols;
}

/* Bytes one decode token must read at least: every matrix but the embedding (one row of it), top_k experts per MoE
 * layer, the KDA states and conv tails (read and written) and the latent cache at context ctx (once per MLA layer). */
static double token_bytes(const k3c_weights &w, int64_t ctx) {
    const k3c_config &c = w.cfg;
    double b = qbytes(w.lm_head) + 4.0 * (double)c.hidden_size;
    for (int l = 0; l < c.num_layers; l++) {
        const k3c_weights_layer &L = w.layer[l];
        const k3c_qmat *m[] = {&L.q_proj,      &L.k_proj,    &L.v_proj,      &L.f_a,         &L.f_b,      &L.b_proj,
                               &L.g_proj,      &L.g_a,       &L.g_b,         &L.q_a,         &L.q_b,      &L.kv_a,
                               &L.kv_b,        &L.o_proj,    &L.mlp_gate,    &L.mlp_up,      &L.mlp_down, &L.router,
                               &L.shared_gate, &L.shared_up, &L.shared_down, &L.latent_down, &L.latent_up};
        for (const k3c_qmat *q : m) b += qbytes(*q);
        if (L.w1) b += (double)c.top_k * (qbytes(L.w1[0]) + qbytes(L.w3[0]) + qbytes(L.w2[0]));
    }
    k3c_eng_dims d;
    k3c_eng_dims_of(&c, &d);
    b += 2.0 * 4 * (double)(d.n_kda * d.kda_floats) + 4.0 * (double)(d.n_mla * ctx * d.lat_w);
    return b;
}

struct run {
    double ms_step, tok_s;
};

/* B sequences, each prefilled with P random ids, then S decode steps of B rows (logits of every row downloaded, as the
 * engine samples on the host). Timed: the decode steps. */
static run decode(harness &h, const k3c_weights &w, int64_t B, int64_t P, int64_t S, int graphs) {
    k3c_eng_dims d;
    k3c_eng_dims_of(&w.cfg, &d);
    d.be = w.be;
    std::vector<k3c_eng_state> st((size_t)B);
    k3c_eng_ws *ws;
    h.ok(k3c_eng_ws_init(&w, std::max(B, P), B, &ws, &h.err), "workspace");
    k3c_eng_ws_use_graphs(ws, graphs);
    std::vector<float> lg((size_t)(B * d.V));
    k3c_rng r = {11, 0};
    std::vector<int32_t> ids((size_t)std::max(B, P));
    for (int64_t s = 0; s < B; s++) {
        h.ok(k3c_eng_state_init(&st[(size_t)s], &d, P + S + 2, &h.err), "state"); /* + the warm-up steps */
        for (auto &x : ids) x = (int32_t)(k3c_rng_u64(&r) % (uint64_t)d.V);
        k3c_eng_seg seg = {&st[(size_t)s], 0, P, nullptr};
        int64_t last = P - 1;
        h.ok(k3c_eng_forward(&w, ws, ids.data(), &seg, 1, &last, 1, lg.data(), &h.err), "prefill");
    }
    std::vector<k3c_eng_seg> segs((size_t)B);
    double t0 = 0;
    for (int64_t t = -2; t < S; t++) { /* two warm-up steps (the first captures the graph) */
        if (t == 0) t0 = now_s();
        for (int64_t s = 0; s < B; s++) {
            segs[(size_t)s] = {&st[(size_t)s], s, 1, nullptr};
            ids[(size_t)s] = (int32_t)(k3c_rng_u64(&r) % (uint64_t)d.V);
        }
        h.ok(k3c_eng_forward(&w, ws, ids.data(), segs.data(), (int)B, nullptr, B, lg.data(), &h.err), "decode");
    }
    const double dt = now_s() - t0;
    for (auto &x : st) k3c_eng_state_free(&x);
    k3c_eng_ws_free(ws);
    return {dt / (double)S * 1e3, (double)(B * S) / dt};
}

int main(int argc, char **argv) {
    const char *cfg_path = argc > 1 ? argv[1] : "../shared/bench/kimi_linear_medium.json";
    const int64_t P = argc > 2 ? atoll(argv[2]) : 64, S = argc > 3 ? atoll(argv[3]) : 64;
    std::vector<int64_t> batches = {1, 64, 256};
    if (argc > 4) {
        batches.clear();
        for (char *p = argv[4]; *p;) {
            batches.push_back(strtoll(p, &p, 10));
            if (*p == ',') p++;
        }
    }
    harness h;
    k3c_config cfg;
    h.ok(k3c_config_load(cfg_path, &cfg, &h.err), "config");
    k3c_cuda_backend cb;
    h.ok(k3c_cuda_backend_init(&cb, 0, 0, &h.err), "cuda backend");
    k3c_model m;
    h.ok(k3c_model_create_f32(&cfg, 1, &m, &h.err), "create");
    k3c_model_init_f32(&m, 1, 0.02);
    h.ok(k3c_model_use_backend_f32(&m, &cb.table, &h.err), "to cuda");
    k3c_weights w;
    h.ok(k3c_weights_from_model(&m, &w, &h.err), "weights");
    const double bw = copy_bandwidth(h), bytes = token_bytes(w, P + S / 2);
    printf("device %s; %s, float32 weights (random), prompt %lld, %lld decode steps\n", cb.cu.name, cfg_path,
           (long long)P, (long long)S);
    printf("device copy bandwidth %.2f TB/s; bytes one token reads %.1f MB: roofline %.3f ms/token\n", bw / 1e12,
           bytes / 1e6, bytes / bw * 1e3);
    printf("%-8s %-8s %12s %14s %12s\n", "batch", "graphs", "ms/step", "tokens/s", "roofline %");
    for (int64_t B : batches)
        for (int g = 1; g >= 0; g--) {
            if (B > 1 && !g) continue;
            run r = decode(h, w, B, P, S, g);
            printf("%-8lld %-8s %12.3f %14.0f", (long long)B, g ? "yes" : "no", r.ms_step, r.tok_s);
            if (B == 1) printf(" %11.1f%%", bytes / bw * 1e3 / r.ms_step * 100);
            printf("\n");
            fflush(stdout);
        }
    k3c_weights_free(&w);
    k3c_model_free_f32(&m);
    k3c_cuda_backend_destroy(&cb);
    return 0;
}
