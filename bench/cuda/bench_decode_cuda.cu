/* bench_decode_cuda.cu — decode speed of the inference engine on the GPU (`--device cuda`): batch-1 ms/token against the
 * bandwidth roofline (bytes one token must read / the device copy bandwidth measured in the same run) and aggregate
 * tokens/s of batches of decoding sequences, over a config with random weights in float32 or as a release stores them
 * (bf16, uploaded as stored), and the kernels one captured step holds.
 * A released-scale config (Kimi-Linear-48B) has no float32 model to round: `skel-bf16` / `skel-mxfp4` build the views of
 * every matrix over one shared random host buffer (bf16; the routed experts bf16 or packed MXFP4) and upload them as
 * stored, so the device holds the full model while the host holds one matrix. TTFT runs the prompt in chunks.
 * Usage: bench_decode_cuda [config.json] [prompt tokens] [decode steps] [batches, comma-separated]
 *                          [f32|bf16|skel-bf16|skel-mxfp4] [TTFT prompt lengths, comma-separated]. */
#include <algorithm>
#include <chrono>

#include <cstring>

#include "cuda/testing.cuh"

extern "C" {
#include "model/model.h"
#include "model/params.h"
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

/* A host copy of CPU weights with every matrix rounded to bf16 (vectors stay float; uk_t re-derived from the bf16
 * kv_b): what a bf16 release checkpoint opens to. The views point into hb's own blocks. */
static k3c_qmat bf16_of(k3c_weights &hb, const k3c_qmat &q, harness &h) {
    if (!q.w || q.type != K3C_QMAT_F32) return q;
    const size_t n = (size_t)(q.rows * q.cols);
    uint16_t *b = (uint16_t *)k3c_weights_alloc(&hb, 2 * n);
    if (!b) h.ok(K3C_ENOMEM, "bf16 copy");
    const float *f = (const float *)q.w;
    for (size_t i = 0; i < n; i++) b[i] = k3c_f32_to_bf16(f[i]);
    k3c_qmat d = q;
    d.type = K3C_QMAT_BF16, d.w = b;
    return d;
}

static void to_bf16_host(const k3c_weights &w, k3c_weights &hb, harness &h) {
    hb = w;
    hb.be = nullptr, hb.ckpt = nullptr, hb.owned = nullptr, hb.n_owned = hb.cap_owned = 0;
    hb.owned_be = nullptr, hb.n_owned_be = hb.cap_owned_be = 0, hb.bytes = 0;
    const k3c_config &c = w.cfg;
    hb.embed = bf16_of(hb, w.embed, h);
    hb.lm_head = w.lm_head.w == w.embed.w ? hb.embed : bf16_of(hb, w.lm_head, h);
    hb.layer = (k3c_weights_layer *)k3c_weights_alloc(&hb, sizeof(k3c_weights_layer) * (size_t)c.num_layers);
    for (int l = 0; l < c.num_layers; l++) {
        k3c_weights_layer &L = hb.layer[l];
        L = w.layer[l];
        k3c_qmat *m[] = {&L.q_proj,      &L.k_proj,    &L.v_proj,      &L.f_a,         &L.f_b,      &L.b_proj,
                         &L.g_proj,      &L.g_a,       &L.g_b,         &L.q_a,         &L.q_b,      &L.kv_a,
                         &L.kv_b,        &L.o_proj,    &L.mlp_gate,    &L.mlp_up,      &L.mlp_down, &L.router,
                         &L.shared_gate, &L.shared_up, &L.shared_down, &L.latent_down, &L.latent_up};
        for (k3c_qmat *q : m) *q = bf16_of(hb, *q, h);
        k3c_qmat **ex[] = {&L.w1, &L.w2, &L.w3};
        for (k3c_qmat **x : ex)
            if (*x) {
                k3c_qmat *v = (k3c_qmat *)k3c_weights_alloc(&hb, sizeof(k3c_qmat) * (size_t)c.num_experts);
                for (int64_t e = 0; e < c.num_experts; e++) v[e] = bf16_of(hb, (*x)[e], h);
                *x = v;
            }
        L.uk_t = nullptr, L.uv = nullptr;
    }
    h.ok(k3c_weights_absorb(&hb, &h.err), "absorb bf16");
}

/* Views over shared random buffers: every bf16 matrix reads the same bytes, every MXFP4 expert the same packed nibbles
 * and scales, every vector the same floats; each view starts at its own small offset so no two alias (a tied head is
 * recognised by pointer). The values only need to keep the activations finite. */
struct skel_src {
    const k3c_param_table *tab;
    int64_t layers;
    size_t expert_elems; /* of one stacked routed-expert parameter: experts × rows × cols */
    bool mxfp4;
    uint16_t *bf16;
    uint8_t *packed, *scale;
    float *vec;
    size_t turn;
};
static const size_t SKEW = 16 * 256; /* the buffers' slack for the per-view offsets */

static bool is_expert(const skel_src &k, size_t off) {
    for (int64_t l = 0; l < k.layers; l++) {
        const k3c_layer_offsets &o = k.tab->layer[l];
        for (size_t b : {o.w1, o.w2, o.w3})
            if (b != K3C_NOPARAM && off >= b && off < b + k.expert_elems) return true;
    }
    return false;
}

static k3c_qmat skel_mat(void *ctx, size_t off, int64_t rows, int64_t cols) {
    skel_src &k = *(skel_src *)ctx;
    k3c_qmat q = {K3C_QMAT_BF16, rows, cols, nullptr, nullptr};
    if (off == K3C_NOPARAM) return q;
    const size_t skew = (k.turn++ % 16) * 256;
    if (k.mxfp4 && cols % 32 == 0 && is_expert(k, off)) {
        q.type = K3C_QMAT_MXFP4, q.w = k.packed + skew, q.scale = k.scale + skew;
    } else {
        q.w = (const char *)k.bf16 + skew;
    }
    return q;
}
static const void *skel_vec(void *ctx, size_t off) {
    skel_src &k = *(skel_src *)ctx;
    return off == K3C_NOPARAM ? nullptr : k.vec + (k.turn++ % 16) * 64;
}

/* The whole model of cfg as stored, in the backend's memory, from one matrix's worth of host memory. */
static void skel_weights(harness &h, const k3c_config &cfg, bool mxfp4, const k3c_backend_f32 *be, k3c_weights &w) {
    k3c_param_table tab;
    h.ok(k3c_params_build(&cfg, &tab, &h.err), "parameter table");
    const int64_t D = cfg.hidden_size, lat = cfg.latent_dim > 0 ? cfg.latent_dim : D;
    const int64_t P = cfg.kda_heads * cfg.kda_head_dim, dqk = cfg.qk_nope_dim + cfg.qk_rope_dim;
    const int64_t experts = tab.res.experts > 0 ? tab.res.experts : cfg.num_experts;
    const int64_t rows[] = {cfg.vocab_size, cfg.intermediate_size, cfg.mla_heads * dqk, cfg.mla_heads * cfg.v_head_dim, P,
                            cfg.num_shared_experts * cfg.moe_intermediate_size, cfg.num_experts, lat};
    size_t big = (size_t)(cfg.mla_heads * (cfg.qk_nope_dim + cfg.v_head_dim) * cfg.kv_lora_rank);
    for (int64_t n : rows) big = std::max(big, (size_t)(n * std::max(D, cfg.moe_intermediate_size)));
    const size_t ex = (size_t)(cfg.moe_intermediate_size * lat), nv = (size_t)1 << 22;
    std::vector<uint16_t> bf(big + SKEW);
    std::vector<uint8_t> packed(ex / 2 + SKEW), scale(ex / 32 + SKEW);
    std::vector<float> vec(nv + SKEW);
    k3c_rng r = {7, 0};
    for (auto &x : bf) x = k3c_f32_to_bf16(0.04f * ((float)(k3c_rng_u64(&r) >> 40) / (float)(1 << 24) - 0.5f));
    for (auto &x : packed) x = (uint8_t)k3c_rng_u64(&r);
    for (auto &x : scale) x = 127 - 7; /* E8M0: 2^-7, so the e2m1 values (|x| <= 6) stay below 0.05 */
    for (auto &x : vec) x = 0.5f + 0.5f * (float)(k3c_rng_u64(&r) >> 40) / (float)(1 << 24);
    skel_src k = {&tab, cfg.num_layers, (size_t)experts * ex, mxfp4, bf.data(), packed.data(), scale.data(), vec.data(), 0};
    const k3c_weights_src src = {skel_mat, skel_vec, &k};
    k3c_weights hw;
    memset(&hw, 0, sizeof hw);
    h.ok(k3c_weights_fill(&hw, &cfg, &tab, &src, &h.err), "skeleton views");
    h.ok(k3c_weights_absorb(&hw, &h.err), "absorb");
    h.ok(k3c_weights_to_backend(&hw, be, &w, &h.err), "upload");
    k3c_weights_free(&hw);
    k3c_params_free(&tab);
}

/* The decode ops with a run that first captures the step (on the calling thread's stream, as the engine enqueues it)
 * into a graph of its own and counts its nodes (kernels and other), then runs it as the real table would. */
struct counted {
    k3c_dec_ops ops;
    const k3c_dec_ops *real;
    size_t kernels, nodes;
};
static counted g_count; /* the bench's one counting table (a program, not the library) */

static int counting_run(void *g, int64_t key, int (*fn)(void *, k3c_err *), void *arg, k3c_err *err) {
    cudaGraph_t graph = nullptr;
    if (cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
        const int rc = fn(arg, err);
        if (cudaStreamEndCapture(cudaStreamPerThread, &graph) == cudaSuccess && graph && !rc) {
            size_t n = 0;
            cudaGraphGetNodes(graph, nullptr, &n);
            std::vector<cudaGraphNode_t> nodes(n);
            cudaGraphGetNodes(graph, nodes.data(), &n);
            g_count.nodes = n, g_count.kernels = 0;
            for (cudaGraphNode_t x : nodes) {
                cudaGraphNodeType t;
                cudaGraphNodeGetType(x, &t);
                g_count.kernels += t == cudaGraphNodeTypeKernel;
            }
        }
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
    }
    return g_count.real->run(g, key, fn, arg, err);
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

/* Time to first token of one T-token prompt: the prompt in chunks of C rows (as the engine's prefill_chunk runs it),
 * then the last row's logits. */
static double ttft_ms(harness &h, const k3c_weights &w, int64_t T, int64_t C) {
    k3c_eng_dims d;
    k3c_eng_dims_of(&w.cfg, &d);
    d.be = w.be;
    k3c_eng_state st;
    k3c_eng_ws *ws;
    h.ok(k3c_eng_ws_init(&w, C, 1, &ws, &h.err), "workspace");
    h.ok(k3c_eng_state_init(&st, &d, T + 1, &h.err), "state");
    std::vector<int32_t> ids((size_t)C);
    std::vector<float> lg((size_t)d.V);
    k3c_rng r = {13, 0};
    h.ok(k3c_cuda_sync(&h.err), "sync");
    const double t0 = now_s();
    for (int64_t p = 0; p < T; p += C) {
        const int64_t n = std::min(C, T - p), last = n - 1;
        for (int64_t i = 0; i < n; i++) ids[(size_t)i] = (int32_t)(k3c_rng_u64(&r) % (uint64_t)d.V);
        k3c_eng_seg seg = {&st, 0, n, nullptr};
        h.ok(k3c_eng_forward(&w, ws, ids.data(), &seg, 1, &last, 1, lg.data(), &h.err), "prefill chunk");
    }
    const double ms = (now_s() - t0) * 1e3;
    k3c_eng_state_free(&st);
    k3c_eng_ws_free(ws);
    return ms;
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
    const char *mode = argc > 5 ? argv[5] : "f32";
    const bool bf16 = !strcmp(mode, "bf16"), skel = !strncmp(mode, "skel-", 5);
    std::vector<int64_t> ttft;
    for (char *p = argc > 6 ? argv[6] : (char *)""; *p;) {
        ttft.push_back(strtoll(p, &p, 10));
        if (*p == ',') p++;
    }
    harness h;
    k3c_config cfg;
    h.ok(k3c_config_load(cfg_path, &cfg, &h.err), "config");
    k3c_cuda_backend cb;
    h.ok(k3c_cuda_backend_init(&cb, 0, 0, &h.err), "cuda backend");
    k3c_model m;
    memset(&m, 0, sizeof m);
    k3c_weights w;
    const double t_load = now_s();
    if (skel) {
        skel_weights(h, cfg, !strcmp(mode, "skel-mxfp4"), &cb.table, w);
    } else {
        h.ok(k3c_model_create_f32(&cfg, 1, &m, &h.err), "create");
        k3c_model_init_f32(&m, 1, 0.02);
    }
    if (bf16) { /* rounded on the host, uploaded as stored; the float32 model stays on the CPU */
        k3c_weights wc, hb;
        h.ok(k3c_weights_from_model(&m, &wc, &h.err), "cpu weights");
        to_bf16_host(wc, hb, h);
        h.ok(k3c_weights_to_backend(&hb, &cb.table, &w, &h.err), "upload bf16");
        k3c_weights_free(&hb);
        k3c_weights_free(&wc);
    } else if (!skel) {
        h.ok(k3c_model_use_backend_f32(&m, &cb.table, &h.err), "to cuda");
        h.ok(k3c_weights_from_model(&m, &w, &h.err), "weights");
    }
    const double load_s = now_s() - t_load;
    /* a table whose run counts the kernels of the step it captures */
    k3c_backend_f32 counting_be = cb.table;
    g_count.real = cb.table.decode, g_count.ops = *cb.table.decode, g_count.ops.run = counting_run;
    counting_be.decode = &g_count.ops;
    k3c_weights wcount = w;
    wcount.be = &counting_be;
    const double bw = copy_bandwidth(h), bytes = token_bytes(w, P + S / 2);
    const char *what = skel ? (!strcmp(mode, "skel-mxfp4") ? "bf16 trunk + MXFP4 routed experts (uploaded as stored)"
                                                            : "bf16 (uploaded as stored)")
                            : bf16 ? "bf16 (uploaded as stored)" : "float32";
    printf("device %s; %s, %s weights (random), prompt %lld, %lld decode steps\n", cb.cu.name, cfg_path, what,
           (long long)P, (long long)S);
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    k3c_eng_dims dm;
    k3c_eng_dims_of(&cfg, &dm);
    const double kda_b = 4.0 * (double)(dm.n_kda * dm.kda_floats), lat_b = 4.0 * (double)(dm.n_mla * dm.lat_w);
    printf("weights on the device %.2f GiB (%s), built and uploaded in %.1f s; device memory free %.1f of %.1f GiB\n",
           (double)w.bytes / (1 << 30), skel ? "full model" : "copy", load_s, (double)free_b / (1 << 30),
           (double)total_b / (1 << 30));
    printf("per sequence: KDA state %.1f MB; latent cache %.1f KB/token = %.2f GB at 128K, %.2f GB at 1M tokens\n",
           kda_b / 1e6, lat_b / 1e3, lat_b * 131072 / 1e9, lat_b * 1048576 / 1e9);
    printf("device copy bandwidth %.2f TB/s; bytes one token reads %.1f MB: roofline %.3f ms/token\n", bw / 1e12,
           bytes / 1e6, bytes / bw * 1e3);
    for (int64_t B : batches) {
        g_count.kernels = g_count.nodes = 0;
        decode(h, wcount, B, 4, 1, 0);
        printf("batch %lld: one decode step captures %zu kernels (%zu graph nodes)\n", (long long)B, g_count.kernels,
               g_count.nodes);
    }
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
    for (int64_t T : ttft) {
        const int64_t C = 2048;
        ttft_ms(h, w, std::min<int64_t>(T, C), C); /* warm-up */
        const double ms = ttft_ms(h, w, T, C);
        printf("TTFT %lld-token prompt (chunks of %lld): %.1f ms (%.0f prompt tokens/s)\n", (long long)T, (long long)C,
               ms, (double)T / ms * 1e3);
        fflush(stdout);
    }
    k3c_weights_free(&w);
    if (!skel) k3c_model_free_f32(&m);
    k3c_cuda_backend_destroy(&cb);
    return 0;
}
