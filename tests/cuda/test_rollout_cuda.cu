/* test_rollout_cuda.cu — RL rollouts on the GPU (k3c_rollout_batch over a model on the CUDA backend, the path of
 * `k3c rl --device cuda`): 64 greedy multi-turn episodes on one GPU engine equal the CPU engine's, before and after the
 * policy's parameters change in device memory (what an optimizer step does), and the rollout tokens/s.
 * docs/POST.md "RL", docs/ENGINE.md "Two backends, one engine". Built by `make cuda-tests`, run on the GPU machine. */
#include "cuda/testing.cuh"

#include <sys/stat.h>

extern "C" {
#include "base/base.h"
#include "model/model.h"
#include "post/post.h"
#include "serve/engine.h"
#include "serve/weights.h"
}

/* Row-relative logits bound of the GPU engine against the CPU's in fp32 (test_engine_cuda's): an element of a row
 * is then within TOL·‖row‖ of the CPU's, so a greedy pick may differ only where the CPU's two candidates lie within
 * 2·TOL·‖row‖ of each other; a log-softmax moves by at most twice the largest logit error. */
static const double TOL = 1e-4;

static void write_text(harness &h, const std::string &path, const std::string &text) {
    FILE *f = fopen(path.c_str(), "w");
    if (!f || fwrite(text.data(), 1, text.size(), f) != text.size() || fclose(f))
        h.ok(k3c_errf(&h.err, K3C_EIO, "cannot write %s", path.c_str()), "write");
}

/* dir: the tiny K3 config with 256 byte tokens + 13 specials, random weights, a byte-level tokenizer (test_post_sft's
 * init). */
static void make_init(harness &h, const std::string &dir) {
    k3c_config cfg;
    h.ok(k3c_config_load("configs/k3_test_tiny.json", &cfg, &h.err), "config");
    cfg.vocab_size = 272;
    h.ok(k3c_config_save(&cfg, (dir + "/config.json").c_str(), &h.err), "config save");
    k3c_model m;
    h.ok(k3c_model_create_f32(&cfg, 0, &m, &h.err), "model");
    k3c_model_init_f32(&m, 7, 0.05); /* wider than 0.02: fewer near-flat rows, so fewer near ties */
    h.ok(k3c_model_save_f32(&m, (dir + "/model.safetensors").c_str(), &h.err), "model save");
    k3c_model_free_f32(&m);
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string tk, sp = "{\n";
    for (int b = 0; b < 256; b++) tk += fmt("%c%c== %d\n", b64[b >> 2], b64[(b & 3) << 4], b);
    const char *s[] = {"<|endoftext|>",   "[BOS]",           "[EOS]",         "<|end_of_msg|>", "<|open|>",
                       "<|close|>",       "<|sep|>",         "<|media_begin|>", "<|media_content|>",
                       "<|media_end|>",   "<|media_pad|>",   "[UNK]",         "[PAD]"};
    for (int i = 0; i < 13; i++) sp += fmt("%s\"%s\": %d", i ? ",\n" : "", s[i], 256 + i);
    write_text(h, dir + "/tiktoken.model", tk);
    write_text(h, dir + "/tiktoken.model.specials.json", sp + "\n}\n");
    write_text(h, dir + "/k3c_tokenizer.json", "{\"pattern\": \"cl100k\"}\n");
}

/* The CPU engine's logits of the row after ids[0, n). */
static std::vector<float> cpu_next(harness &h, const k3c_weights *w, const int32_t *ids, int64_t n) {
    k3c_eng_dims d;
    k3c_eng_dims_of(&w->cfg, &d);
    k3c_eng_state st;
    k3c_eng_ws *ws;
    h.ok(k3c_eng_state_init(&st, &d, n, &h.err), "state");
    h.ok(k3c_eng_ws_init(w, n, 1, &ws, &h.err), "workspace");
    std::vector<float> out((size_t)d.V);
    k3c_eng_seg seg = {&st, 0, n, nullptr};
    int64_t last = n - 1;
    h.ok(k3c_eng_forward(w, ws, ids, &seg, 1, &last, 1, out.data(), &h.err), "forward");
    k3c_eng_ws_free(ws);
    k3c_eng_state_free(&st);
    return out;
}

/* GPU episodes against CPU episodes: equal ids, or a first divergence at a near tie of the CPU's logits (checked
 * there); equal masks and turns up to it; logprobs of the common sampled ids within 2·TOL·‖row‖ (taken as 1e-3,
 * rows of this model have ‖logits‖ of a few units; the measured worst is printed). */
static void compare(harness &h, const char *label, k3c_model *mc, const std::vector<k3c_episode> &g,
                    const std::vector<k3c_episode> &c) {
    k3c_weights wc;
    h.ok(k3c_weights_from_model(mc, &wc, &h.err), "cpu weights");
    int equal = 0, ties = 0, bad = 0;
    double worst_lp = 0;
    for (size_t i = 0; i < g.size(); i++) {
        const k3c_episode &a = g[i], &b = c[i];
        int64_t t = 0;
        while (t < a.n && t < b.n && a.ids[t] == b.ids[t]) t++;
        for (int64_t j = a.n_prompt; j < t; j++)
            if (a.mask[j] != b.mask[j]) bad++;
            else if (a.mask[j]) worst_lp = fmax(worst_lp, fabs((double)a.logp[j] - b.logp[j]));
        if (t == a.n && t == b.n) {
            a.turns == b.turns && a.reward.reward == b.reward.reward ? equal++ : bad++;
            continue;
        }
        if (t == a.n || t == b.n || !a.mask[t] || !b.mask[t]) { /* one ended, or an observation differs */
            bad++;
            continue;
        }
        std::vector<float> l = cpu_next(h, &wc, a.ids, t);
        double norm = 0;
        for (float x : l) norm += (double)x * x;
        const double gap = (double)l[(size_t)b.ids[t]] - l[(size_t)a.ids[t]];
        if (gap <= 2 * TOL * sqrt(norm)) ties++;
        else bad++;
    }
    printf("%s: %d of %zu episodes equal, %d diverge at a near tie, %d otherwise\n", label, equal, g.size(), ties, bad);
    h.check_le("rollouts gpu vs cpu", fmt("%s %zu episodes", label, g.size()), "bad", (double)bad, 0);
    h.check_le("rollouts gpu vs cpu", fmt("%s ties", label), "ties", (double)ties, (double)g.size() / 8);
    h.check_le("rollout logp gpu-cpu", label, "maxabs", worst_lp, 1e-3);
    k3c_weights_free(&wc);
}

static std::vector<k3c_episode> rollouts(harness &h, k3c_model *m, const k3c_tok *tok, int n, double *tok_s) {
    std::vector<k3c_env *> e((size_t)n);
    std::vector<k3c_sampler> sm((size_t)n);
    for (int i = 0; i < n; i++) {
        h.ok(k3c_env_new("arith_tool", 5, 0, i, &e[(size_t)i], &h.err), "env");
        sm[(size_t)i] = k3c_sampler{};
        sm[(size_t)i].top_p = 1, sm[(size_t)i].seed = 11 + (uint64_t)i; /* temperature 0: greedy */
    }
    /* max_tokens well above the prompt (byte tokens: an arith_tool prompt is several hundred ids), so every episode
     * samples: an episode truncated before its first sampled id would compare equal whatever the engine did */
    k3c_rollout_opts o = {2, 2048, 32, 0};
    std::vector<k3c_episode> ep((size_t)n);
    const double t0 = k3c_now();
    h.ok(k3c_rollout_batch(m, e.data(), sm.data(), n, tok, &o, 0, ep.data(), &h.err), "rollout batch");
    const double dt = k3c_now() - t0;
    int64_t sampled = 0;
    for (auto &x : ep)
        for (int64_t t = x.n_prompt; t < x.n; t++) sampled += x.mask[t];
    *tok_s = (double)sampled / (dt > 0 ? dt : 1e-9);
    int silent = 0;
    for (auto &x : ep) {
        int64_t k = 0;
        for (int64_t t = x.n_prompt; t < x.n; t++) k += x.mask[t];
        silent += k == 0;
    }
    h.check_le("rollouts sample", fmt("%d episodes", n), "none sampled", (double)silent, 0);
    for (auto *x : e) k3c_env_free(x);
    return ep;
}

static void free_all(std::vector<k3c_episode> &v) {
    for (auto &x : v) k3c_episode_free(&x);
}

int main() {
    harness h;
    k3c_cuda_backend cb;
    h.ok(k3c_cuda_backend_init(&cb, 0, 0, &h.err), "cuda backend");
    printf("device %s\n", cb.cu.name);
    char tmpl[] = "/tmp/k3c_rollout_cuda_XXXXXX";
    if (!mkdtemp(tmpl)) h.ok(k3c_errf(&h.err, K3C_EIO, "mkdtemp"), "temporary directory");
    const std::string dir = tmpl;
    make_init(h, dir);
    k3c_model mc, mg;
    k3c_tok *tok;
    h.ok(k3c_model_open_f32(dir.c_str(), 0, &mc, &h.err), "cpu model");
    h.ok(k3c_model_open_f32(dir.c_str(), 0, &mg, &h.err), "gpu model");
    h.ok(k3c_model_use_backend_f32(&mg, &cb.table, &h.err), "use_backend");
    h.ok(k3c_tok_load_dir(dir.c_str(), nullptr, &tok, &h.err), "tokenizer");
    const int N = 64;
    double gs, cs, gs2, cs2;
    std::vector<k3c_episode> g0 = rollouts(h, &mg, tok, N, &gs), c0 = rollouts(h, &mc, tok, N, &cs);
    compare(h, "initial weights", &mc, g0, c0);
    /* the parameters change in device memory, as an optimizer step writes them: the next rollouts must read them.
     * The new values are another random init (a scaling of these would leave a random model's greedy ids as they are) */
    const size_t P = mc.table.total;
    k3c_model other;
    h.ok(k3c_model_create_f32(&mc.cfg, 0, &other, &h.err), "other model");
    k3c_model_init_f32(&other, 8, 0.05);
    std::vector<float> w((const float *)other.w, (const float *)other.w + P);
    k3c_model_free_f32(&other);
    memcpy(mc.w, w.data(), sizeof(float) * P);
    h.ok(cb.table.upload(mg.w, w.data(), sizeof(float) * P, &h.err), "upload");
    h.ok(cb.table.sync(&h.err), "sync");
    std::vector<k3c_episode> g1 = rollouts(h, &mg, tok, N, &gs2), c1 = rollouts(h, &mc, tok, N, &cs2);
    compare(h, "changed weights", &mc, g1, c1);
    int moved = 0;
    for (int i = 0; i < N; i++)
        moved += g1[(size_t)i].n != g0[(size_t)i].n ||
                 memcmp(g1[(size_t)i].ids, g0[(size_t)i].ids, sizeof(int32_t) * (size_t)g0[(size_t)i].n) != 0;
    printf("episode 0: %lld ids, then %lld; %d of %d episodes moved\n", (long long)g0[0].n, (long long)g1[0].n, moved, N);
    h.check_le("rollouts see new weights", fmt("%d episodes", N), "same", moved > 0 ? 0 : 1, 0);
    printf("rollout tokens/s (%d greedy episodes, one engine): gpu %.0f / %.0f, cpu %.0f / %.0f\n", N, gs, gs2, cs,
           cs2);
    free_all(g0), free_all(c0), free_all(g1), free_all(c1);
    k3c_tok_free(tok);
    k3c_model_free_f32(&mg);
    k3c_model_free_f32(&mc);
    k3c_cuda_backend_destroy(&cb);
    std::string rm = "rm -rf '" + dir + "'";
    if (system(rm.c_str()) != 0) printf("note: could not remove %s\n", dir.c_str());
    return h.summary();
}
