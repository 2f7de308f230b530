/* test_engine_cuda.cu — the inference engine on the GPU (the CUDA backend's engine ops, ops/decode.h) against the same
 * engine on the CPU: per-position logits under three prefill/decode schedules, greedy ids (the CPU's and the goldens'),
 * batched sequences joining and leaving equal to solo runs, graph-replayed decode steps equal to direct ones; over the
 * float32 model and over the weights as stored (bf16 trunk with MXFP4 or bf16 experts, uploaded as stored).
 * docs/ENGINE.md. Built by `make cuda-tests`, run on the GPU machine (tools/device_cuda.sh). */
#include "cuda/testing.cuh"

#include <stdlib.h>

extern "C" {
#include "base/base.h"
#include "model/model.h"
#include "ops/mxfp4.h"
#include "serve/engine.h"
#include "serve/weights.h"
}

/* fp32 on both sides, sums in other orders (warp-strided products, the recurrence for prefill on the GPU, BLAS tiles
 * and the chunked KDA on the CPU): row-relative logits error bound. Measured figures are printed. */
static const double TOL = 1e-4;
/* Weights as stored (bf16 trunk, MXFP4 or bf16 experts): both engines decode every weight exactly into float32 (bf16
 * and E2M1 · 2^k are floats) and keep float32 activations and accumulators; neither rounds an activation to bf16. The
 * two sides therefore differ only in the fp32 summation order, as above, and the bound is the same 1e-4 — not the
 * ~4e-3 (2^-8, one bf16 rounding per activation) a kernel that fed bf16 activations to tensor cores would need. */
static const double TOL_STORED = 1e-4;

static std::vector<int32_t> read_i32(const k3c_safetensors *st, const char *name, int64_t *rows = nullptr) {
    const k3c_st_tensor *t = k3c_st_find(st, name);
    if (!t || t->dtype != K3C_I32) return {};
    std::vector<int32_t> v(t->nbytes / 4);
    memcpy(v.data(), t->data, t->nbytes);
    if (rows) *rows = t->ndim == 2 ? t->shape[1] : (int64_t)v.size();
    return v;
}

/* Worst row-relative L2 error of got [T, V] against ref. */
static double worst_row(const float *got, const float *ref, int64_t T, int64_t V) {
    double worst = 0;
    for (int64_t t = 0; t < T; t++) {
        double num = 0, den = 0;
        for (int64_t v = 0; v < V; v++) {
            const double d = (double)got[t * V + v] - ref[t * V + v];
            num += d * d, den += (double)ref[t * V + v] * ref[t * V + v];
        }
        const double e = sqrt(num / (den > 0 ? den : 1));
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

static int64_t argmax(const float *x, int64_t V) {
    int64_t b = 0;
    for (int64_t v = 1; v < V; v++)
        if (x[v] > x[b]) b = v;
    return b;
}

/* Every row's logits of ids through k3c_eng_forward in pieces of the given lengths (cycled; 1 = a decode step). */
static std::vector<float> engine_logits(harness &h, const k3c_weights *w, const int32_t *ids, int64_t T,
                                        const std::vector<int64_t> &pieces) {
    k3c_eng_dims d;
    k3c_eng_dims_of(&w->cfg, &d);
    d.be = w->be;
    k3c_eng_state st;
    k3c_eng_ws *ws;
    h.ok(k3c_eng_state_init(&st, &d, T, &h.err), "state");
    h.ok(k3c_eng_ws_init(w, T, T, &ws, &h.err), "workspace");
    std::vector<float> out((size_t)(T * d.V));
    for (int64_t t = 0, i = 0; t < T; i++) {
        int64_t len = std::min(pieces[(size_t)i % pieces.size()], T - t);
        k3c_eng_seg seg = {&st, 0, len, nullptr};
        h.ok(k3c_eng_forward(w, ws, ids + t, &seg, 1, nullptr, len, out.data() + t * d.V, &h.err), "forward");
        t += len;
    }
    k3c_eng_ws_free(ws);
    k3c_eng_state_free(&st);
    return out;
}

/* Greedy continuation through the engine API (one sequence); closes e. */
static std::vector<int32_t> greedy_on(harness &h, k3c_engine *e, const std::vector<int32_t> &prompt, int64_t n_new) {
    k3c_request r{};
    r.sampler.top_p = 1, r.max_new = n_new;
    int64_t id;
    h.ok(k3c_engine_submit(e, prompt.data(), (int64_t)prompt.size(), &r, &id, &h.err), "submit");
    std::vector<int32_t> out;
    k3c_engine_event ev[8];
    for (int n_ev, guard = 0; k3c_engine_pending(e) > 0 && guard < 1000; guard++) {
        h.ok(k3c_engine_step(e, ev, 8, &n_ev, &h.err), "step");
        for (int j = 0; j < n_ev; j++) out.push_back(ev[j].token.id);
    }
    k3c_engine_close(e);
    return out;
}

static std::vector<int32_t> greedy(harness &h, const k3c_model *m, const std::vector<int32_t> &prompt, int64_t n_new) {
    k3c_engine *e;
    h.ok(k3c_engine_open(m, nullptr, &e, &h.err), "engine open");
    return greedy_on(h, e, prompt, n_new);
}

static std::vector<int32_t> greedy_w(harness &h, const k3c_weights *w, const std::vector<int32_t> &prompt,
                                     int64_t n_new) {
    k3c_engine *e;
    h.ok(k3c_engine_open_weights(w, nullptr, &e, &h.err), "engine open");
    return greedy_on(h, e, prompt, n_new);
}

/* Sequences of different lengths through two slots (the third joins when one leaves, prompt chunks of 8 beside
 * decode rows), on the GPU: ids equal solo runs', logits within TOL of them. */
struct run_out {
    int64_t id;
    std::vector<int32_t> tok;
    std::vector<float> logits;
};
static void run_engine(harness &h, const k3c_model *m, int slots, const std::vector<std::vector<int32_t>> &prompts,
                       const std::vector<int64_t> &max_new, std::vector<run_out> &out) {
    k3c_engine_opts o{};
    o.max_seqs = slots, o.prefill_chunk = 8, o.max_ctx = 128;
    k3c_engine *e;
    h.ok(k3c_engine_open(m, &o, &e, &h.err), "engine open");
    const int64_t V = m->cfg.vocab_size;
    out.assign(prompts.size(), run_out{});
    for (size_t i = 0; i < prompts.size(); i++) {
        k3c_request r{};
        r.sampler.top_p = 1, r.max_new = max_new[i];
        h.ok(k3c_engine_submit(e, prompts[i].data(), (int64_t)prompts[i].size(), &r, &out[i].id, &h.err), "submit");
    }
    std::vector<k3c_engine_event> ev((size_t)slots);
    for (int n_ev, guard = 0; k3c_engine_pending(e) > 0 && guard < 1000; guard++) {
        h.ok(k3c_engine_step(e, ev.data(), slots, &n_ev, &h.err), "step");
        for (int j = 0; j < n_ev; j++)
            for (auto &x : out)
                if (x.id == ev[(size_t)j].seq) {
                    x.tok.push_back(ev[(size_t)j].token.id);
                    const float *l = k3c_engine_event_logits(e, j);
                    x.logits.insert(x.logits.end(), l, l + V);
                }
    }
    k3c_engine_close(e);
}

static void batched_vs_solo(harness &h, const char *name, const k3c_model *mg, const std::vector<int32_t> &ids) {
    std::vector<std::vector<int32_t>> prompts = {std::vector<int32_t>(ids.begin(), ids.begin() + 5),
                                                 std::vector<int32_t>(ids.begin() + 3, ids.begin() + 24),
                                                 std::vector<int32_t>(ids.begin() + 10, ids.begin() + 19)};
    std::vector<int64_t> max_new = {9, 4, 12};
    std::vector<run_out> batched, solo(3);
    run_engine(h, mg, 2, prompts, max_new, batched);
    double worst = 0;
    int same = 1;
    for (size_t i = 0; i < prompts.size(); i++) {
        std::vector<run_out> one;
        run_engine(h, mg, 1, {prompts[i]}, {max_new[i]}, one);
        same &= one[0].tok == batched[i].tok;
        if (one[0].tok.size() == batched[i].tok.size())
            worst = std::max(worst, worst_row(batched[i].logits.data(), one[0].logits.data(),
                                              (int64_t)one[0].tok.size(), mg->cfg.vocab_size));
    }
    h.check_le("batched vs solo", name, "ids!=", same ? 0 : 1, 0);
    h.check_le("batched vs solo", name, "logits", worst, TOL);
}

/* Four sequences prefilled to different lengths, then decode steps of four rows: graph-replayed (captured at the first
 * step, replayed after) and direct steps give the same logits bit for bit. */
static void graph_vs_direct(harness &h, const char *name, const k3c_weights *w, const std::vector<int32_t> &ids) {
    k3c_eng_dims d;
    k3c_eng_dims_of(&w->cfg, &d);
    d.be = w->be;
    const int NS = 4, STEPS = 6;
    const int64_t V = d.V, cap = 64;
    std::vector<float> res[2];
    for (int graphs = 0; graphs < 2; graphs++) {
        k3c_eng_state st[NS];
        k3c_eng_ws *ws;
        h.ok(k3c_eng_ws_init(w, 32, NS, &ws, &h.err), "workspace");
        k3c_eng_ws_use_graphs(ws, graphs);
        std::vector<float> lg((size_t)(32 * V));
        for (int s = 0; s < NS; s++) {
            h.ok(k3c_eng_state_init(&st[s], &d, cap, &h.err), "state");
            k3c_eng_seg seg = {&st[s], 0, 3 + 5 * s, nullptr};
            int64_t last = seg.len - 1;
            h.ok(k3c_eng_forward(w, ws, ids.data() + s, &seg, 1, &last, 1, lg.data(), &h.err), "prefill");
        }
        for (int t = 0; t < STEPS; t++) {
            k3c_eng_seg segs[NS];
            int32_t tok[NS];
            for (int s = 0; s < NS; s++) segs[s] = {&st[s], s, 1, nullptr}, tok[s] = ids[(size_t)(20 + t + s)];
            h.ok(k3c_eng_forward(w, ws, tok, segs, NS, nullptr, NS, lg.data(), &h.err), "decode");
            res[graphs].insert(res[graphs].end(), lg.begin(), lg.begin() + NS * V);
        }
        for (int s = 0; s < NS; s++) k3c_eng_state_free(&st[s]);
        k3c_eng_ws_free(ws);
    }
    h.check_le("graph vs direct", name, "maxdif",
               res[0] == res[1] ? 0.0 : worst_row(res[1].data(), res[0].data(), NS * STEPS, V) + 1e-30, 0);
}

/* The logits of ids under three prefill/decode schedules, GPU weights wg against CPU weights wc (row-relative, tol),
 * and their argmax against the CPU's and the golden logits' (gl, may be NULL). */
static void schedules(harness &h, const char *label, const k3c_weights *wc, const k3c_weights *wg,
                      const std::vector<int32_t> &ids, int64_t T, const k3c_st_tensor *gl, double tol) {
    const int64_t V = wc->cfg.vocab_size;
    const char *names[3] = {"token by token", "one prefill", "7,1,1,1,11 cycled"};
    const std::vector<int64_t> sched[3] = {{1}, {T}, {7, 1, 1, 1, 11}};
    for (int s = 0; s < 3; s++) {
        std::vector<float> c = engine_logits(h, wc, ids.data(), T, sched[s]);
        std::vector<float> g = engine_logits(h, wg, ids.data(), T, sched[s]);
        std::string shape = fmt("%s T=%lld %s", label, (long long)T, names[s]);
        h.check_le("logits gpu vs cpu", shape, "rowrel", worst_row(g.data(), c.data(), T, V), tol);
        int64_t diff = 0, gdiff = 0;
        for (int64_t t = 0; t < T; t++) {
            diff += argmax(g.data() + t * V, V) != argmax(c.data() + t * V, V);
            if (gl) gdiff += argmax(g.data() + t * V, V) != argmax((const float *)gl->data + t * V, V);
        }
        h.check_le("argmax gpu vs cpu", shape, "differ", (double)diff, 0);
        if (gl) h.check_le("argmax gpu vs golden", shape, "differ", (double)gdiff, 0);
    }
}

static void model_case(harness &h, k3c_cuda_backend *cb, const char *rel) {
    char dir[512], gpath[600];
    const char *sh = getenv("K3C_SHARED");
    snprintf(dir, sizeof dir, "%s/%s", sh ? sh : "../shared", rel);
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
    k3c_model mc, mg;
    k3c_safetensors *gs;
    h.ok(k3c_model_open_f32(dir, 0, &mc, &h.err), dir);
    h.ok(k3c_model_open_f32(dir, 0, &mg, &h.err), dir);
    h.ok(k3c_model_use_backend_f32(&mg, &cb->table, &h.err), "use_backend");
    h.ok(k3c_st_open(gpath, &gs, &h.err), gpath);
    int64_t T = 0;
    std::vector<int32_t> ids = read_i32(gs, "input_ids", &T);
    k3c_weights wc, wg;
    h.ok(k3c_weights_from_model(&mc, &wc, &h.err), "cpu weights");
    h.ok(k3c_weights_from_model(&mg, &wg, &h.err), "gpu weights");
    schedules(h, rel + 7, &wc, &wg, ids, T, k3c_st_find(gs, "logits"), TOL);
    int64_t np = 0, ng = 0;
    std::vector<int32_t> prompt = read_i32(gs, "prompt_ids", &np), want = read_i32(gs, "greedy_ids", &ng);
    if (prompt.empty()) prompt.assign(ids.begin(), ids.begin() + 16), ng = 16;
    std::vector<int32_t> gg = greedy(h, &mg, prompt, ng), gc = greedy(h, &mc, prompt, ng);
    h.check_le("greedy gpu vs cpu", rel + 7, "ids!=", gg == gc ? 0 : 1, 0);
    if (!want.empty()) h.check_le("greedy gpu vs golden", rel + 7, "ids!=", gg == want ? 0 : 1, 0);
    batched_vs_solo(h, rel + 7, &mg, ids);
    graph_vs_direct(h, rel + 7, &wg, ids);
    k3c_weights_free(&wc);
    k3c_weights_free(&wg);
    k3c_st_close(gs);
    k3c_model_free_f32(&mc);
    k3c_model_free_f32(&mg);
}

static bool ends_with(const std::string &s, const char *tail) {
    const size_t n = strlen(tail);
    return s.size() >= n && !s.compare(s.size() - n, n, tail);
}

/* A copy of checkpoint dir src in a fresh temporary directory: config.json, and model.safetensors with every MXFP4
 * expert (weight_packed + weight_scale) decoded into a bf16 `weight` — exact, E2M1 · 2^k is a bf16 value, so the copy
 * is the same model with bf16 experts — and every other tensor byte for byte. */
static std::string bf16_experts_copy(harness &h, const char *src) {
    char tmpl[] = "/tmp/k3c_engine_cuda_XXXXXX";
    if (!mkdtemp(tmpl)) h.ok(k3c_errf(&h.err, K3C_EIO, "mkdtemp %s", tmpl), "temporary directory");
    const std::string out = tmpl;
    char *cfg = nullptr;
    size_t n = 0;
    h.ok(k3c_read_file((std::string(src) + "/config.json").c_str(), &cfg, &n, &h.err), "config.json");
    FILE *f = fopen((out + "/config.json").c_str(), "w");
    if (!f || fwrite(cfg, 1, n, f) != n || fclose(f)) h.ok(k3c_errf(&h.err, K3C_EIO, "%s", out.c_str()), "write config");
    free(cfg);
    k3c_checkpoint *ck;
    h.ok(k3c_ckpt_open(src, &ck, &h.err), src);
    const int nt = k3c_ckpt_count(ck);
    std::vector<k3c_st_entry> e;
    std::vector<std::string> names((size_t)nt);
    std::vector<std::vector<uint16_t>> bf((size_t)nt);
    for (int i = 0; i < nt; i++) {
        const k3c_st_tensor *t = k3c_ckpt_at(ck, i);
        const std::string name = t->name;
        if (ends_with(name, ".weight_scale")) continue;
        k3c_st_entry x{};
        x.name = t->name, x.dtype = t->dtype, x.ndim = t->ndim, x.data = t->data;
        memcpy(x.shape, t->shape, sizeof x.shape);
        if (ends_with(name, ".weight_packed")) {
            names[(size_t)i] = name.substr(0, name.size() - strlen("_packed"));
            const k3c_st_tensor *sc = k3c_ckpt_find(ck, (names[(size_t)i] + "_scale").c_str());
            const int64_t R = t->shape[0], C = 2 * t->shape[1];
            std::vector<float> v((size_t)(R * C));
            if (!sc) h.ok(k3c_errf(&h.err, K3C_EFORMAT, "%s has no scale", t->name), "bf16 copy");
            h.ok(k3c_mxfp4_decode_f32((const uint8_t *)t->data, (const uint8_t *)sc->data, R, C, v.data(), &h.err),
                 t->name);
            bf[(size_t)i].resize(v.size());
            for (size_t j = 0; j < v.size(); j++) bf[(size_t)i][j] = k3c_f32_to_bf16(v[j]);
            x.name = names[(size_t)i].c_str(), x.dtype = K3C_BF16, x.shape[1] = C, x.data = bf[(size_t)i].data();
        }
        e.push_back(x);
    }
    h.ok(k3c_st_write((out + "/model.safetensors").c_str(), e.data(), (int)e.size(), nullptr, &h.err), "bf16 copy");
    k3c_ckpt_close(ck);
    return out;
}

/* The checkpoint in dir as stored (k3c_weights_open on the CPU, the same views uploaded as stored to the GPU): the
 * routed experts keep their stored type on the device, the three schedules' logits within TOL_STORED of the CPU
 * engine's on the same weights with equal argmax (and equal to golden's logits), greedy ids equal the CPU's and
 * golden's, graph-replayed steps equal direct ones. */
static void stored_case(harness &h, k3c_cuda_backend *cb, const char *dir, const char *golden, const char *label,
                        int expert_type) {
    k3c_weights wc, wg;
    k3c_safetensors *gs;
    h.ok(k3c_weights_open(dir, &wc, &h.err), dir);
    h.ok(k3c_weights_to_backend(&wc, &cb->table, &wg, &h.err), "upload as stored");
    h.ok(k3c_st_open((std::string(golden) + "/golden.safetensors").c_str(), &gs, &h.err), golden);
    int64_t n_exp = 0, wrong = 0;
    for (int l = 0; l < wg.cfg.num_layers; l++)
        for (int64_t x = 0; wg.layer[l].w1 && x < wg.cfg.num_experts; x++, n_exp++)
            wrong += wg.layer[l].w1[x].type != expert_type || wg.layer[l].w2[x].type != expert_type ||
                     wg.layer[l].w3[x].type != expert_type;
    h.check_le("experts as stored", fmt("%s %lld experts", label, (long long)n_exp), "other", (double)wrong, 0);
    h.check_le("experts as stored", label, "none", n_exp > 0 ? 0 : 1, 0);
    h.check_le("trunk as stored", label, "!bf16", wg.embed.type == K3C_QMAT_BF16 && wg.lm_head.type == K3C_QMAT_BF16 ? 0 : 1,
               0);
    int64_t T = 0, np = 0, ng = 0;
    std::vector<int32_t> ids = read_i32(gs, "input_ids", &T);
    schedules(h, label, &wc, &wg, ids, T, k3c_st_find(gs, "logits"), TOL_STORED);
    std::vector<int32_t> prompt = read_i32(gs, "prompt_ids", &np), want = read_i32(gs, "greedy_ids", &ng);
    if (prompt.empty()) prompt.assign(ids.begin(), ids.begin() + 16), ng = 16;
    std::vector<int32_t> gg = greedy_w(h, &wg, prompt, ng), gc = greedy_w(h, &wc, prompt, ng);
    h.check_le("greedy gpu vs cpu", label, "ids!=", gg == gc ? 0 : 1, 0);
    if (!want.empty()) h.check_le("greedy gpu vs golden", label, "ids!=", gg == want ? 0 : 1, 0);
    graph_vs_direct(h, label, &wg, ids);
    k3c_st_close(gs);
    k3c_weights_free(&wg);
    k3c_weights_free(&wc);
}

/* The routed experts as released (bf16, MXFP4 with E8M0 scales), decoded inside the CUDA products (16-byte groups when
 * rows allow, lane-strided elements otherwise), against the CPU table's experts on the same packed bytes: n tokens,
 * top-k of E experts, SiLU and SiTU. Every row's relative error against the CPU's (float sums in other orders). */
static void stored_experts(harness &h, int type, int64_t n, int act, int64_t lat) {
    const int64_t E = 8, k = 3, I = 64;
    k3c_rng r = {(uint64_t)(17 + type * 31 + n + lat), 0};
    const int64_t el = type == K3C_QMAT_BF16 ? 2 : 0; /* bytes per element (MXFP4: half a byte + scales) */
    const int64_t rows[3] = {I, I, lat}, cols[3] = {lat, lat, I};
    std::vector<uint8_t> wb[3], sb[3];
    std::vector<k3c_qmat> hv[3], dv[3];
    dbuf *dw[3], *ds[3];
    for (int m = 0; m < 3; m++) {
        const int64_t per = rows[m] * cols[m], wbytes = el ? per * el : per / 2, sbytes = el ? 0 : per / 32;
        wb[m].resize((size_t)(E * wbytes));
        for (size_t i = 0; i < wb[m].size(); i++) {
            uint8_t b = (uint8_t)(k3c_rng_u64(&r) & 0xFF);
            if (el && (i & 1)) b = (uint8_t)(0x3C + (b & 3) - ((b >> 2) & 1) * 0x80); /* bf16 high byte: ±[2^-7, 2^-4) */
            wb[m][i] = b;
        }
        sb[m].resize((size_t)(E * sbytes + 1));
        for (auto &x : sb[m]) x = (uint8_t)(122 + k3c_rng_u64(&r) % 4); /* scales 2^-5 .. 2^-2 */
        dw[m] = new dbuf(h, wb[m].data(), wb[m].size());
        ds[m] = new dbuf(h, sb[m].data(), sb[m].size());
        for (int64_t e = 0; e < E; e++) {
            hv[m].push_back({type, rows[m], cols[m], wb[m].data() + e * wbytes, el ? nullptr : sb[m].data() + e * sbytes});
            dv[m].push_back({type, rows[m], cols[m], dw[m]->as<uint8_t>() + e * wbytes,
                             el ? nullptr : ds[m]->as<uint8_t>() + e * sbytes});
        }
    }
    std::vector<float> x((size_t)(n * lat)), topw((size_t)(n * k));
    std::vector<int32_t> ids((size_t)(n * k));
    for (auto &v : x) v = (float)(k3c_rng_uniform(&r) * 2 - 1);
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = 0; j < k; j++)
            ids[(size_t)(t * k + j)] = (int32_t)((t * 5 + j * 3) % E), topw[(size_t)(t * k + j)] = 0.2f + 0.1f * j;
    const k3c_glu_act a = {act, act == K3C_ACT_SITU ? 4.0 : 0, act == K3C_ACT_SITU ? 25.0 : 0};
    const k3c_dec_moe mc = {hv[0].data(), hv[1].data(), hv[2].data(), E, k, lat, I, a};
    const k3c_dec_moe mg = {dv[0].data(), dv[1].data(), dv[2].data(), E, k, lat, I, a};
    std::vector<float> want((size_t)(n * lat)), got((size_t)(n * lat));
    std::vector<char> cws(k3c_dec_cpu.moe_workspace(&mc, n));
    h.ok(k3c_dec_cpu.moe(&mc, x.data(), n, ids.data(), topw.data(), want.data(), cws.data(), &h.err), "cpu experts");
    dbuf dx(h, x.data(), x.size() * 4), dt(h, topw.data(), topw.size() * 4), di(h, ids.data(), ids.size() * 4);
    dbuf dy(h, got.size() * 4), dws(h, k3c_dec_cuda.moe_workspace(&mg, n));
    h.ok(k3c_dec_cuda.moe(&mg, dx.as<float>(), n, di.as<int32_t>(), dt.as<float>(), dy.as<float>(), dws.p, &h.err),
         "cuda experts");
    h.ok(k3c_cuda_sync(&h.err), "sync");
    dy.get(h, got.data());
    std::string shape = fmt("%s n=%lld lat=%lld %s", type == K3C_QMAT_BF16 ? "bf16" : "mxfp4", (long long)n,
                            (long long)lat, act == K3C_ACT_SITU ? "situ" : "silu");
    h.check_le("stored experts gpu vs cpu", shape, "rowrel", worst_row(got.data(), want.data(), n, lat), TOL);
    for (int m = 0; m < 3; m++) delete dw[m], delete ds[m];
}

int main(int argc, char **argv) {
    harness h;
    k3c_cuda_backend cb;
    h.ok(k3c_cuda_backend_init(&cb, 0, 0, &h.err), "cuda backend");
    printf("device %s\n", cb.cu.name);
    model_case(h, &cb, "golden/k3_tiny_a");
    model_case(h, &cb, "golden/kimi_linear_tiny_a");
    {
        const char *sh = getenv("K3C_SHARED");
        const std::string k3 = std::string(sh ? sh : "../shared") + "/golden/k3_tiny_a";
        stored_case(h, &cb, k3.c_str(), k3.c_str(), "k3_tiny_a bf16 + mxfp4", K3C_QMAT_MXFP4);
        const std::string copy = bf16_experts_copy(h, k3.c_str());
        stored_case(h, &cb, copy.c_str(), k3.c_str(), "k3_tiny_a bf16 + bf16", K3C_QMAT_BF16);
        std::string rm = "rm -rf '" + copy + "'";
        if (system(rm.c_str()) != 0) printf("note: could not remove %s\n", copy.c_str());
    }
    for (int type : {(int)K3C_QMAT_BF16, (int)K3C_QMAT_MXFP4})
        for (int64_t n : {1, 5})
            for (int64_t lat : {64, type == K3C_QMAT_BF16 ? 98 : 96}) /* bf16 98: the lane-strided path */
                stored_experts(h, type, n, n == 1 ? K3C_ACT_SILU : K3C_ACT_SITU, lat);
    k3c_cuda_backend_destroy(&cb);
    return h.summary();
}
