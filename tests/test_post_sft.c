/* test_post_sft.c — SFT and RL runs (src/post/sft.c, rl.c): on a tiny model with a byte-level tokenizer carrying the
 * XTML specials, the masked SFT loss falls on environment trajectories; SFT and RL runs resumed from a checkpoint
 * match uninterrupted ones byte for byte; RL logs its metrics; malformed configs and data are refused by name. */
#include "test.h"

#include "model/model.h"
#include "serve/turn.h"

#include <sys/stat.h>

static char dir[512];

static void write_text(const char *name, const char *text) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    CHECK(f != NULL, "cannot write %s", p);
}

/* init/: the tiny K3 config with room for 256 byte tokens + 13 specials, random weights, the tokenizer. */
static int make_init(void) {
    k3c_err err = {0};
    k3c_config cfg;
    char p[1024];
    CHECK_OK(k3c_config_load("configs/k3_test_tiny.json", &cfg, &err), &err);
    cfg.vocab_size = 272;
    snprintf(p, sizeof p, "%s/init", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/init/config.json", dir);
    CHECK_OK(k3c_config_save(&cfg, p, &err), &err);
    k3c_model m;
    CHECK_OK(k3c_model_create_f32(&cfg, 0, &m, &err), &err);
    k3c_model_init_f32(&m, 7, 0.02);
    snprintf(p, sizeof p, "%s/init/model.safetensors", dir);
    CHECK_OK(k3c_model_save_f32(&m, p, &err), &err);
    k3c_model_free_f32(&m);
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    snprintf(p, sizeof p, "%s/init/tiktoken.model", dir);
    FILE *f = fopen(p, "w");
    for (int b = 0; f && b < 256; b++) fprintf(f, "%c%c== %d\n", b64[b >> 2], b64[(b & 3) << 4], b);
    if (f) fclose(f);
    const char *sp[] = {"<|endoftext|>",  "[BOS]",           "[EOS]",
                        "<|end_of_msg|>", "<|open|>",        "<|close|>",
                        "<|sep|>",        "<|media_begin|>", "<|media_content|>",
                        "<|media_end|>",  "<|media_pad|>",   "[UNK]",
                        "[PAD]"};
    snprintf(p, sizeof p, "%s/init/tiktoken.model.specials.json", dir);
    f = fopen(p, "w");
    for (int i = 0; f && i < 13; i++) fprintf(f, "%s\"%s\": %d", i ? ",\n" : "{\n", sp[i], 256 + i);
    if (f) fprintf(f, "\n}\n"), fclose(f);
    write_text("init/k3c_tokenizer.json", "{\"pattern\": \"cl100k\"}\n");
    return err.code == 0;
}

static void make_data(void) {
    char p[1024];
    snprintf(p, sizeof p, "%s/train.jsonl", dir);
    FILE *f = fopen(p, "w");
    k3c_err err = {0};
    for (int i = 0; f && i < 24; i++) {
        k3c_env *e;
        char *conv = NULL;
        CHECK_OK(k3c_env_new("arith", 3, 0, i, &e, &err), &err);
        if (e) CHECK_OK(k3c_env_reference(e, &conv, &err), &err);
        fprintf(f, "%s\n", conv ? conv : "");
        if (i == 5) fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n"); /* line 7 */
        free(conv);
        k3c_env_free(e);
    }
    if (f) fclose(f);
}

static void write_config(const char *name, const char *out, int steps, const char *extra) {
    char text[2048];
    snprintf(text, sizeof text,
             "{\"init\": \"init\", \"data\": \"train.jsonl\", \"out_dir\": \"%s\", \"format\": \"xtml\", \"thinking\": "
             "false, \"seq_len\": 768, \"steps\": %d, \"lr\": 0.01, \"warmup\": 1, \"schedule\": \"constant\", "
             "\"optimizer\": {\"matrix\": \"adamw\"}, \"checkpoint_every\": 2, \"seed\": 5, \"kda_chunk\": 16%s}\n",
             out, steps, extra);
    write_text(name, text);
}

static int run(const char *cfg_name, int resume, int64_t max_steps, k3c_sft_result *r, k3c_err *err) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, cfg_name);
    k3c_sft_config c;
    int rc = k3c_sft_config_load(p, &c, err);
    k3c_train_opts o = {.resume = resume, .max_steps = max_steps};
    return rc ? rc : k3c_sft_run(&c, &o, r, err);
}

static int same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    int ok = !k3c_read_file(a, &x, &nx, NULL) && !k3c_read_file(b, &y, &ny, NULL) && nx == ny && !memcmp(x, y, nx);
    free(x);
    free(y);
    return ok;
}

/* Per-position loss weights through the whole model (k3c_model_batch.weight): weights of 1 equal no weights bit for
 * bit; a weight c everywhere equals the backward scale c; zero weights give zero gradients. */
static void test_weights(void) {
    k3c_err err = {0};
    char p[1024];
    snprintf(p, sizeof p, "%s/init", dir);
    k3c_model m;
    CHECK_OK(k3c_model_open_f32(p, 1, &m, &err), &err);
    if (err.code) return;
    enum { T = 24 };
    int32_t ids[T], cu[2] = {0, T};
    float w1[T], w2[T], w0[T] = {0};
    for (int t = 0; t < T; t++) ids[t] = (t * 37 + 5) % 256, w1[t] = 1, w2[t] = 2.5f;
    const size_t P = m.table.total;
    float *g[4];
    double loss[4];
    const float *ws[4] = {NULL, w1, w2, w0};
    k3c_arena ar = {0};
    CHECK_OK(k3c_model_arena_init_f32(&m, k3c_model_plan_bytes_f32(&m, T, 1), &ar, &err), &err);
    for (int k = 0; k < 4; k++) {
        k3c_model_batch b = {.T = T, .n_docs = 1, .ids = ids, .cu_seqlens = cu, .weight = ws[k]};
        k3c_acts *acts;
        memset(m.g, 0, sizeof(float) * P);
        k3c_arena_reset(&ar, 0);
        CHECK_OK(k3c_model_forward_f32(&m, &b, &ar, &acts, &loss[k], NULL, &err), &err);
        CHECK_OK(k3c_model_backward_f32(&m, acts, k == 0 ? 2.5 : 1.0, &err), &err);
        g[k] = malloc(sizeof(float) * P);
        memcpy(g[k], m.g, sizeof(float) * P);
    }
    double num = 0, den = 0, z = 0;
    for (size_t i = 0; i < P; i++) {
        num += ((double)g[2][i] - g[0][i]) * ((double)g[2][i] - g[0][i]), den += (double)g[0][i] * g[0][i];
        z = fmax(z, fabs(g[3][i]));
    }
    CHECK(loss[1] == loss[0], "weights 1: loss %.17g vs %.17g", loss[1], loss[0]);
    CHECK(fabs(loss[2] - 2.5 * loss[0]) <= 1e-6 * loss[0] && sqrt(num / den) < 1e-6,
          "weight 2.5 == scale 2.5: loss %.9g vs %.9g, gradient rel %.3g (tol 1e-6)", loss[2], 2.5 * loss[0],
          sqrt(num / den));
    CHECK(loss[3] == 0 && z == 0, "weights 0: loss %g, max |g| %g", loss[3], z);
    for (int k = 0; k < 4; k++) free(g[k]);
    k3c_model_arena_free_f32(&m, &ar);
    k3c_model_free_f32(&m);
}

/* Episodes decoded together on the engine (k3c_rollout_batch) equal the same episodes run one by one through
 * k3c_generate (same samplers: draws keyed by (seed, position)), and each sampled id's recorded logprob is the
 * log-softmax of the training forward over the episode at that position. */
static void test_rollout_batch(void) {
    k3c_err err = {0};
    char p[1024];
    snprintf(p, sizeof p, "%s/out_a/step_00000008", dir);
    k3c_model m; /* the policy a run trains: a float32 model, its rollouts on the engine over its parameters */
    k3c_tok *tok = NULL;
    CHECK_OK(k3c_model_open_f32(p, 0, &m, &err), &err);
    if (err.code) return;
    CHECK_OK(k3c_tok_load_dir(p, NULL, &tok, &err), &err);
    if (err.code) {
        k3c_model_free_f32(&m);
        return;
    }
    enum { N = 6 };
    k3c_env *e[N] = {0};
    k3c_sampler sm[N];
    k3c_episode a[N], b;
    k3c_rollout_opts o = {.max_turns = 3, .max_tokens = 700, .max_new_per_turn = 24};
    for (int i = 0; i < N; i++) {
        CHECK_OK(k3c_env_new("arith_tool", 5, 0, i / 2, &e[i], &err), &err);
        sm[i] = (k3c_sampler){.temperature = i == 0 ? 0.0 : 1.0, .top_p = 1, .seed = 11 + (uint64_t)i};
    }
    CHECK_OK(k3c_rollout_batch(&m, e, sm, N, tok, &o, 0, a, &err), &err);
    int same = 1;
    double worst = 0;
    const int64_t V = m.cfg.vocab_size;
    for (int i = 0; !err.code && i < N; i++) {
        k3c_env *f;
        k3c_policy pol;
        CHECK_OK(k3c_env_new("arith_tool", 5, 0, i / 2, &f, &err), &err);
        CHECK_OK(k3c_policy_from_model(&m, &sm[i], &pol, &err), &err);
        CHECK_OK(k3c_rollout(f, tok, &pol, &o, &b, &err), &err);
        same &= b.n == a[i].n && !memcmp(b.ids, a[i].ids, sizeof *b.ids * (size_t)b.n) &&
                !memcmp(b.mask, a[i].mask, (size_t)b.n) && b.turns == a[i].turns &&
                b.reward.reward == a[i].reward.reward && b.format_valid == a[i].format_valid &&
                b.truncated == a[i].truncated && b.n_prompt == a[i].n_prompt;
        k3c_episode_free(&b);
        k3c_policy_free(&pol);
        k3c_env_free(f);
        /* logprobs against the training forward */
        k3c_arena ar = {0};
        k3c_model_batch mb = {.T = a[i].n, .n_docs = 1, .ids = a[i].ids};
        k3c_acts *acts;
        float *logits;
        CHECK_OK(k3c_model_arena_init_f32(&m, k3c_model_plan_bytes_f32(&m, a[i].n, 1), &ar, &err), &err);
        CHECK_OK(k3c_model_forward_f32(&m, &mb, &ar, &acts, NULL, &logits, &err), &err);
        for (int64_t t = a[i].n_prompt; !err.code && t < a[i].n; t++) {
            if (!a[i].mask[t]) continue;
            double lp;
            k3c_logp_entropy(logits + (t - 1) * V, V, a[i].ids[t], &lp, NULL);
            worst = fmax(worst, fabs(lp - a[i].logp[t]));
        }
        k3c_model_arena_free_f32(&m, &ar);
    }
    CHECK(same, "batched episodes == one-by-one episodes");
    CHECK(worst < 1e-4, "engine logprobs vs the training forward: max |diff| %.3g (tol 1e-4)", worst);
    for (int i = 0; i < N; i++) k3c_episode_free(&a[i]), k3c_env_free(e[i]);
    k3c_tok_free(tok);
    k3c_model_free_f32(&m);
}

/* RL from the SFT checkpoint: rollouts, metrics, checkpoints, bit-exact resume, refused settings. */
static void write_rl(const char *name, const char *out, const char *extra) {
    char text[1024];
    snprintf(text, sizeof text,
             "{\"init\": \"out_a/step_00000008\", \"env\": \"arith\", \"out_dir\": \"%s\", \"steps\": 2, "
             "\"prompts_per_step\": 2, \"group_size\": 2, \"max_new\": 8, \"max_tokens\": 600, \"lr\": 0.001, "
             "\"eval_every\": 2, \"eval_episodes\": 1, \"checkpoint_every\": 1, \"seed\": 3%s}\n",
             out, extra);
    write_text(name, text);
}

static int run_rl(const char *name, int resume, int64_t max_steps, k3c_rl_result *r, k3c_err *err) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    k3c_rl_config c;
    int rc = k3c_rl_config_load(p, &c, err);
    k3c_train_opts o = {.resume = resume, .max_steps = max_steps};
    return rc ? rc : k3c_rl_run(&c, &o, r, err);
}

static void test_rl(void) {
    k3c_err err = {0};
    k3c_rl_result a, b;
    write_rl("rl_a.json", "rl_a", "");
    CHECK_OK(run_rl("rl_a.json", 0, 0, &a, &err), &err);
    CHECK(a.steps == 2 && a.episodes == 8 && isfinite(a.first_eval_reward) && isfinite(a.last_eval_reward),
          "rl: %lld steps, %lld episodes, eval %g -> %g", (long long)a.steps, (long long)a.episodes,
          a.first_eval_reward, a.last_eval_reward);
    char p[1024], *text = NULL;
    size_t n = 0;
    snprintf(p, sizeof p, "%s/rl_a/metrics.jsonl", dir);
    CHECK_OK(k3c_read_file(p, &text, &n, &err), &err);
    const char *keys[] = {"\"reward\":",       "\"r_answer\":",  "\"format_valid\":", "\"zero_var_groups\":",
                          "\"response_len\":", "\"clip_high\":", "\"kl\":",           "\"eval_reward\":"};
    for (size_t i = 0; text && i < sizeof keys / sizeof *keys; i++)
        CHECK(strstr(text, keys[i]) != NULL, "metrics lack %s:\n%s", keys[i], text);
    free(text);
    /* the held-out episodes of each evaluation, as the model wrote them: one line per episode, reward as averaged */
    for (int st = 0; st <= 2; st += 2) {
        snprintf(p, sizeof p, "%s/rl_a/eval_step_%08d.jsonl", dir, st);
        text = NULL;
        CHECK_OK(k3c_read_file(p, &text, &n, &err), &err);
        const char *rw = text ? strstr(text, "\"reward\":") : NULL;
        double want = st ? a.last_eval_reward : a.first_eval_reward;
        CHECK(rw && fabs(atof(rw + 9) - want) < 1e-5 && strstr(text, "\"output\":\"") &&
                  strstr(text, "\"format_valid\":") && strchr(text, '\n') == text + n - 1,
              "eval dump of step %d (reward %g): %s", st, want, text ? text : "");
        free(text);
    }
    write_rl("rl_b.json", "rl_b", "");
    CHECK_OK(run_rl("rl_b.json", 0, 1, &b, &err), &err);
    CHECK_OK(run_rl("rl_b.json", 1, 0, &b, &err), &err);
    char pa[1024], pb[1024];
    snprintf(pa, sizeof pa, "%s/rl_a/step_00000002/model.safetensors", dir);
    snprintf(pb, sizeof pb, "%s/rl_b/step_00000002/model.safetensors", dir);
    CHECK(b.steps == 2 && same_file(pa, pb), "resumed RL run == uninterrupted");
    /* each checkpoint records the chat options it was tuned with, which serve and chat take as defaults */
    int thinking = 5;
    snprintf(pa, sizeof pa, "%s/out_a/step_00000008", dir);
    CHECK(k3c_turn_chat_thinking(pa, &thinking, &err) == 0 && thinking == 0, "SFT records thinking off (%d)", thinking);
    snprintf(pa, sizeof pa, "%s/rl_a/step_00000002", dir);
    thinking = 5;
    CHECK(k3c_turn_chat_thinking(pa, &thinking, &err) == 0 && thinking == 0, "RL records thinking off (%d)", thinking);
    snprintf(pa, sizeof pa, "%s/rl_a/step_00000002/model.safetensors", dir);
    /* the KL to the frozen init checkpoint and several clipped updates per batch */
    /* (a length penalty over the whole budget makes every group's rewards differ, so every step updates) */
    write_text("rl_c.json",
               "{\"init\": \"out_a/step_00000008\", \"env\": \"arith\", \"out_dir\": \"rl_c\", \"steps\": 2, "
               "\"prompts_per_step\": 2, \"group_size\": 2, \"max_new\": 40, \"max_tokens\": 600, \"lr\": 0.001, "
               "\"seed\": 3, \"beta\": 0.1, \"ppo_epochs\": 2, \"temperature\": 1.5, \"overlong_buffer\": 599, "
               "\"overlong_penalty\": 1}\n");
    CHECK_OK(run_rl("rl_c.json", 0, 0, &b, &err), &err);
    snprintf(p, sizeof p, "%s/rl_c/metrics.jsonl", dir);
    CHECK_OK(k3c_read_file(p, &text, &n, &err), &err);
    /* step 1 updates (one group's lengths differ): the second epoch's ratios move off 1 and the clip acts; the
     * engine's rollout log-probs equal the trainer's recomputation up to float32 noise */
    const char *l1 = text ? strstr(text, "{\"step\":1,") : NULL, *ch = l1 ? strstr(l1, "\"clip_high\":") : NULL,
               *rm = l1 ? strstr(l1, "\"ratio_mean\":") : NULL, *ld = l1 ? strstr(l1, "\"rollout_logp_diff\":") : NULL;
    CHECK(l1 && strstr(l1, "\"updated_seqs\":2") && ch && rm && ld && atof(ch + 12) > 0 && atof(rm + 13) != 1.0 &&
              atof(ld + 20) < 1e-4,
          "metrics: %s", text);
    free(text);
    write_rl("rl_f.json", "rl_f", ", \"beta\": -0.1");
    CHECK(run_rl("rl_f.json", 0, 0, &b, &err) != K3C_OK && strstr(err.msg, "beta: must be >= 0"), "%s", err.msg);
    write_rl("rl_d.json", "rl_d", ", \"env\": \"chess\"");
    CHECK(run_rl("rl_d.json", 0, 0, &b, &err) != K3C_OK, "duplicate/unknown env refused: %s", err.msg);
    write_text("rl_e.json",
               "{\"init\": \"out_a/step_00000008\", \"env\": \"poker\", \"out_dir\": \"x\", \"steps\": 1}");
    CHECK(run_rl("rl_e.json", 0, 0, &b, &err) == K3C_ECONFIG && strstr(err.msg, "env: environment \"poker\""), "%s",
          err.msg);
    /* DAPO dynamic sampling (at most 2 draws), TIS and pass@k: each step logs its draws; a step that drew fewer than
     * max_draws batches filled its batch with groups of reward variance */
    write_rl("rl_h.json", "rl_h",
             ", \"dynamic_sampling\": true, \"max_draws\": 2, \"tis_cap\": 2, \"pass_k\": 2, \"pass_n\": 3, "
             "\"pass_tasks\": 2, \"temperature\": 1.5");
    CHECK_OK(run_rl("rl_h.json", 0, 0, &b, &err), &err);
    CHECK(b.pass1[0] >= 0 && b.pass1[0] <= 1 && b.pass_k[1] >= 0 && b.pass_k[1] <= 1 && b.episodes >= 8 &&
              b.episodes <= 16,
          "pass@1 %g, pass@2 %g, %lld episodes", b.pass1[0], b.pass_k[1], (long long)b.episodes);
    text = NULL;
    snprintf(p, sizeof p, "%s/rl_h/metrics.jsonl", dir);
    CHECK_OK(k3c_read_file(p, &text, &n, &err), &err);
    int64_t drawn_eps = 0;
    for (const char *l = text; l && (l = strstr(l, "\"draws\":")); l++) {
        int draws = atoi(l + 8), drawn = atoi(strstr(l, "\"groups_drawn\":") + 15),
            flat = atoi(strstr(l, "\"groups_filtered\":") + 18), kept = atoi(strstr(l, "\"groups_kept\":") + 14);
        drawn_eps += 2 * drawn;
        CHECK(draws >= 1 && draws <= 2 && drawn == 2 * draws && kept <= 2 && kept <= drawn - flat &&
                  (draws == 2 || kept == 2) && strstr(l, "\"tis_mean\":"),
              "dynamic sampling: %d draws, %d drawn, %d flat, %d kept", draws, drawn, flat, kept);
    }
    CHECK(drawn_eps == b.episodes && text && strstr(text, "\"train_pass_k\":"), "episodes %lld vs %lld: %s",
          (long long)drawn_eps, (long long)b.episodes, text ? text : "");
    free(text);
    write_rl("rl_i.json", "rl_i", ", \"pass_k\": 9, \"pass_n\": 4");
    CHECK(run_rl("rl_i.json", 0, 0, &b, &err) == K3C_ECONFIG && strstr(err.msg, "pass_k"), "%s", err.msg);
    /* format_gate: on unless set false; a non-boolean is refused */
    const char *gates[] = {"", ", \"format_gate\": false", ", \"format_gate\": 1"};
    for (int g = 0; g < 3; g++) {
        write_rl("rl_g.json", "rl_g", gates[g]);
        snprintf(p, sizeof p, "%s/rl_g.json", dir);
        k3c_rl_config c;
        int rc = k3c_rl_config_load(p, &c, &err);
        CHECK(g == 2 ? rc == K3C_ECONFIG && strstr(err.msg, "format_gate") : !rc && c.format_gate == (g == 0),
              "format_gate case %d: rc %d %s", g, rc, err.msg);
    }
}

int main(void) {
    snprintf(dir, sizeof dir, "build/tmp/test_post_sft.%d", (int)getpid());
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    CHECK(system(cmd) == 0, "mkdir");
    if (!make_init()) return test_summary();
    make_data();
    k3c_err err = {0};
    k3c_sft_result a, b;
    write_config("a.json", "out_a", 8, "");
    CHECK_OK(run("a.json", 0, 0, &a, &err), &err);
    CHECK(a.steps == 8 && a.n_traj == 24 && a.bad_lines == 1, "steps %lld, %lld trajectories, %lld bad lines",
          (long long)a.steps, (long long)a.n_traj, (long long)a.bad_lines);
    /* From random weights the byte-level loss starts near ln 272 = 5.6 and must fall on these templated answers. */
    CHECK(a.first_loss > 4.5 && a.last_loss < a.first_loss - 1.0, "loss %.3f -> %.3f", a.first_loss, a.last_loss);

    write_config("b.json", "out_b", 8, "");
    CHECK_OK(run("b.json", 0, 3, &b, &err), &err);
    CHECK(b.steps == 3, "stopped at %lld", (long long)b.steps);
    CHECK(run("b.json", 0, 0, &b, &err) == K3C_EINVAL && strstr(err.msg, "use --resume"), "%s", err.msg);
    CHECK_OK(run("b.json", 1, 0, &b, &err), &err);
    char pa[1024], pb[1024];
    snprintf(pa, sizeof pa, "%s/out_a/step_00000008/model.safetensors", dir);
    snprintf(pb, sizeof pb, "%s/out_b/step_00000008/model.safetensors", dir);
    CHECK(b.steps == 8 && same_file(pa, pb), "resumed at step 2 (last checkpoint before 3) == uninterrupted");
    snprintf(pa, sizeof pa, "%s/out_a/step_00000008/optimizer.safetensors", dir);
    snprintf(pb, sizeof pb, "%s/out_b/step_00000008/optimizer.safetensors", dir);
    CHECK(same_file(pa, pb), "optimizer state identical after resume");
    /* The checkpoint is a model directory: SFT can start from it (and serving can open it). */
    write_text("c.json", "{\"init\": \"out_a/step_00000008\", \"data\": \"train.jsonl\", \"out_dir\": \"out_c\", "
                         "\"thinking\": false, \"seq_len\": 768, \"steps\": 1}\n");
    CHECK_OK(run("c.json", 0, 0, &b, &err), &err);
    CHECK(b.first_loss < a.first_loss - 1.0, "continuing from the SFT checkpoint: %.3f", b.first_loss);

    write_config("bad1.json", "out_x", 8, ", \"learning_rate\": 1");
    CHECK(run("bad1.json", 0, 0, &b, &err) == K3C_ECONFIG && strstr(err.msg, "bad1.json: learning_rate: unknown key"),
          "%s", err.msg);
    write_text("bad2.json", "{\"data\": \"train.jsonl\", \"out_dir\": \"o\", \"steps\": 1}");
    CHECK(run("bad2.json", 0, 0, &b, &err) == K3C_ECONFIG && strstr(err.msg, "init"), "%s", err.msg);
    write_config("bad3.json", "out_y", 8, ", \"optimizer\": {\"matrix\": \"sgd\"}");
    CHECK(run("bad3.json", 0, 0, &b, &err) != K3C_OK, "duplicate key refused: %s", err.msg);
    write_text("junk.jsonl", "{\"messages\": 3}\nnot json\n");
    write_text("bad4.json", "{\"init\": \"init\", \"data\": \"junk.jsonl\", \"out_dir\": \"o4\", \"steps\": 1}");
    CHECK(run("bad4.json", 0, 0, &b, &err) == K3C_EINVAL && strstr(err.msg, "junk.jsonl: no usable trajectory"), "%s",
          err.msg);
    test_weights();
    test_rollout_batch();
    test_rl();
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
    return test_summary();
}
