/* test_train_faults.c — the trainer end to end, part 2 of 2: crash safety (a half-written checkpoint, SIGKILLs), errors
 * on bad configs, shards, tokenizers; the loss going down; `k3c train` (docs/TRAINING.md §1–§2). See train_fixture.h. */
#include "train_fixture.h"

#include <signal.h>
#include <sys/wait.h>
#include <time.h>

/* ---------------------------------------------------------------- the reference run */

/* The straight 10-step run (out dir A_exact, as in test_train.c) that the crash tests must reproduce bit for bit.
 * Returns its wall time in seconds, which scales the kill test's delays. Checked in test_train.c; here a failure only
 * is reported. */
static double reference_run(const fixture *fx) {
    char cfg[1200];
    k3c_err err = {0};
    k3c_train_result r;
    run_params p = defaults("A_exact");
    write_run(fx, "run_A_exact", &p, cfg, sizeof cfg);
    double t0 = k3c_now();
    int e = train(cfg, 0, 0, NULL, &r, &err);
    double t = k3c_now() - t0;
    if (e || r.steps != N_STEPS) CHECK(0, "reference run: %lld steps: %s", (long long)r.steps, err.msg);
    return t;
}

/* ---------------------------------------------------------------- 3. crashes */

static void truncate_file(const char *path, long keep) {
    size_t n;
    char *d = slurp(path, &n);
    if (d) {
        FILE *f = fopen(path, "wb");
        if (f) {
            fwrite(d, 1, (size_t)keep < n ? (size_t)keep : n, f);
            fclose(f);
        }
    }
    free(d);
}

/* A run killed while writing the checkpoint of step 6 (its temporary directory half-written, metrics of step 6 already
 * logged) and, separately, a step_7 directory renamed into place whose `latest` was never updated (made unloadable
 * here, so that loading it instead of `latest` would fail). Resume must restart from step 5 and finish bit-exactly. */
static void test_partial_checkpoint(const fixture *fx) {
    char cfg[1200], p[1400], q[1300];
    k3c_err err = {0};
    k3c_train_result r;
    run_params rp = defaults("K_partial");
    rp.ckpt_every = 1;
    rp.keep = 3;
    write_run(fx, "run_K_partial", &rp, cfg, sizeof cfg);
    CHECK_OK(train(cfg, 0, 7, NULL, &r, &err), &err);
    /* step_7 exists but latest still names step_5; step_6 is back in its temporary directory, model truncated */
    out_path(fx, "K_partial", "step_00000006", p, sizeof p);
    out_path(fx, "K_partial", ".tmp_step_00000006", q, sizeof q);
    CHECK(rename(p, q) == 0, "rename %s", p);
    snprintf(p, sizeof p, "%s/model.safetensors", q);
    truncate_file(p, 1000);
    out_path(fx, "K_partial", "step_00000007/model.safetensors", p, sizeof p);
    truncate_file(p, 1000);
    out_path(fx, "K_partial", "latest", p, sizeof p);
    CHECK_OK(k3c_write_file_atomic(p, "step_00000005\n", 14, &err), &err);
    /* the metrics of steps 6 and 7 were written before the crash */
    FILE *log = tmpfile();
    CHECK_OK(train(cfg, 1, 0, log, &r, &err), &err);
    int lines = log ? count_lines(log) : -1;
    if (log) fclose(log);
    CHECK(r.steps == N_STEPS && lines == N_STEPS - 5, "partial checkpoint: resumed to %lld with %d steps (want from 5)",
          (long long)r.steps, lines);
    check_same_final(fx, "A_exact", "K_partial", "after a partial checkpoint");
    long long st[32];
    int n_tmp;
    out_path(fx, "K_partial", "", p, sizeof p);
    int ns = list_steps(p, st, 32, &n_tmp);
    CHECK(n_tmp == 0 && ns == 3 && st[2] == 10, "partial checkpoint: %d temporary dirs left, %d step dirs", n_tmp, ns);
    char why[1200] = "";
    out_path(fx, "K_partial", "step_00000010", p, sizeof p);
    CHECK(ckpt_loads(fx, p, N_STEPS, why, sizeof why) == K3C_OK, "after partial checkpoint: %s", why);
    /* metrics.jsonl must still hold one object per step: the rows of steps 6-7 logged before the crash are replaced,
     * not repeated (a plot or a reader of the file would see steps going backwards). */
    mrow rows[64];
    int bad, n = read_metrics(fx, "K_partial", rows, 64, &bad);
    CHECK(bad == 0 && steps_once(rows, n, N_STEPS),
          "metrics.jsonl after crash + resume has %d rows for %d steps (steps logged before the crash are repeated)", n,
          N_STEPS);
}

/* The child of the kill test: trains the given config (resuming when asked) and exits. */
static int child_main(const char *cfg, int resume) {
    k3c_err err = {0};
    k3c_train_result r;
    int rc = train(cfg, resume, 0, NULL, &r, &err);
    if (rc) fprintf(stderr, "child: %s\n", err.msg);
    return rc ? 1 : 0;
}

/* SIGKILL a training child (checkpoint_every 1) at random moments; after each kill `latest` is either absent (killed
 * before the first checkpoint) or names a directory that fully loads; finally resume to the end and compare. */
static void test_kill(const fixture *fx, double run_seconds) {
    char cfg[1200], p[1300];
    k3c_err err = {0};
    run_params rp = defaults("K_kill");
    rp.ckpt_every = 1;
    write_run(fx, "run_K_kill", &rp, cfg, sizeof cfg);
    uint64_t seed = getenv("K3C_TEST_SEED") ? strtoull(getenv("K3C_TEST_SEED"), NULL, 10)
                                            : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    int fails_before = test_failed_, kills = 0;
    out_path(fx, "K_kill", "latest", p, sizeof p);
    for (int round = 0; round < 8; round++) {
        int resume = exists(p);
        long long done = 0;
        char *cur = resume ? slurp(p, NULL) : NULL;
        if (cur && sscanf(cur, "step_%lld", &done) != 1) done = 0;
        free(cur);
        if (done >= N_STEPS) { /* the last child finished: start over so that there is something to interrupt */
            char out[1300];
            out_path(fx, "K_kill", "", out, sizeof out);
            replace_tree(out, NULL);
            resume = 0, done = 0;
        }
        pid_t pid = fork();
        if (pid == 0) {
            /* a fresh image: OpenMP / OpenBLAS thread pools do not survive fork() */
            char r[4];
            snprintf(r, sizeof r, "%d", resume);
            execl("/proc/self/exe", "test_train_faults", "--child", cfg, r, (char *)NULL);
            _exit(127);
        }
        /* a resumed child has only the remaining steps to run */
        double delay = k3c_uniform_at(seed, (uint64_t)round) * run_seconds * (double)(N_STEPS - done + 1) / N_STEPS;
        struct timespec ts = {(time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
        nanosleep(&ts, NULL);
        int status = 0;
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        kills += WIFSIGNALED(status); /* else it had already finished */
        CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) != 0), "kill round %d: child failed with status %d", round,
              WEXITSTATUS(status));
        if (!exists(p)) continue;
        char dir[1300], why[1200] = "";
        long long step = -1;
        char *l = slurp(p, NULL);
        CHECK(l && sscanf(l, "step_%lld", &step) == 1, "kill round %d: latest '%s'", round, l ? l : "");
        free(l);
        char out[1300];
        out_path(fx, "K_kill", "", out, sizeof out);
        CHECK_OK(k3c_train_ckpt_latest(out, dir, sizeof dir, &err), &err);
        CHECK(ckpt_loads(fx, dir, step, why, sizeof why) == K3C_OK, "kill round %d (after %.3f s): latest %s: %s",
              round, delay, dir, why);
    }
    k3c_train_result r;
    CHECK_OK(train(cfg, exists(p), 0, NULL, &r, &err), &err);
    CHECK(r.steps == N_STEPS, "after kills: %lld steps", (long long)r.steps);
    check_same_final(fx, "A_exact", "K_kill", "after SIGKILLs");
    if (test_failed_ != fails_before || getenv("K3C_TEST_VERBOSE"))
        printf("  kill test: %d of 8 children killed (delays up to %.2f s), K3C_TEST_SEED=%llu\n", kills, run_seconds,
               (unsigned long long)seed);
}

/* ---------------------------------------------------------------- 4. bad input */

static void expect_config_error(const fixture *fx, const char *name, const run_params *p, const char *key1,
                                const char *key2) {
    char cfg[1200];
    k3c_err err = {0};
    k3c_run_config rc;
    write_run(fx, name, p, cfg, sizeof cfg);
    int e = k3c_run_config_load(cfg, &rc, &err);
    CHECK(e == K3C_ECONFIG && contains(err.msg, cfg) && contains(err.msg, key1) && (!key2 || contains(err.msg, key2)),
          "%s: code %d, message '%s' (want ECONFIG naming %s and %s)", name, e, err.msg, key1, key2 ? key2 : "-");
}

static void test_bad_config(const fixture *fx) {
    run_params p;
    k3c_run_config rc;
    k3c_err err = {0};
    char cfg[1200];
    p = defaults("bad");
    write_run(fx, "good", &p, cfg, sizeof cfg);
    CHECK_OK(k3c_run_config_load(cfg, &rc, &err), &err);
    CHECK(rc.n_sources == 2 && rc.n_stages == 2 && rc.kda_chunk == 16 && rc.stage[0].tokens_per_step == TPS &&
              rc.stage[1].mixture[1] == 0.8 && contains(rc.source_dir[1], "/data/b") &&
              contains(rc.model_config, fx->dir),
          "good config read back wrong");

    p = defaults("bad"), p.extra = ", \"learning_rate\": 0.1";
    expect_config_error(fx, "bad_root_key", &p, "learning_rate", "unknown");
    p = defaults("bad"), p.stage1 = "{\"name\": \"x\", \"seq_len\": 32, \"steps\": 2, \"lr\": 0.01, \"seqlen\": 64}";
    expect_config_error(fx, "bad_stage_key", &p, "stages[1].seqlen", "unknown");
    p = defaults("bad"), p.extra = ", \"optimizer_x\": {}";
    expect_config_error(fx, "bad_root_key2", &p, "optimizer_x", NULL);
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 256, \"steps\": 2, \"lr\": 0.01}";
    expect_config_error(fx, "bad_seq_len", &p, "stages[0].seq_len", "tokens_per_step");
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 32, \"steps\": 0, \"lr\": 0.01}";
    expect_config_error(fx, "bad_steps0", &p, "stages[0]", "steps");
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 32, \"steps\": -3, \"lr\": 0.01}";
    expect_config_error(fx, "bad_steps_neg", &p, "stages[0]", "steps");
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 32, \"steps\": 2.5, \"lr\": 0.01}";
    expect_config_error(fx, "bad_steps_frac", &p, "stages[0].steps", "integer");
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 32, \"lr\": 0.01}";
    expect_config_error(fx, "bad_steps_missing", &p, "stages[0].steps", "missing");
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 32, \"steps\": 2, \"lr\": 0.01, \"mixture\": {\"a\": 1, \"c\": 1}}";
    expect_config_error(fx, "bad_mix_source", &p, "stages[0].mixture.c", "no data source");
    p = defaults("bad"),
    p.stage1 = "{\"seq_len\": 32, \"steps\": 2, \"lr\": 0.01, \"mixture\": {\"a\": 1, \"b\": -0.5}}";
    expect_config_error(fx, "bad_mix_weight", &p, "stages[1].mixture.b", "≥ 0");
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 32, \"steps\": 2, \"lr\": 0.01, \"mixture\": {\"a\": 0, \"b\": 0}}";
    expect_config_error(fx, "bad_mix_zero", &p, "stages[0].mixture", "sum to 0");
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 32, \"steps\": 2, \"lr\": 0.01, \"schedule\": \"cosinus\"}";
    expect_config_error(fx, "bad_schedule", &p, "stages[0].schedule", "cosinus");
    p = defaults("bad"), p.balancing = "median";
    expect_config_error(fx, "bad_balancing", &p, "balancing", "median");
    p = defaults("bad"), p.model = NULL;
    expect_config_error(fx, "bad_no_model", &p, "model", "missing");
    p = defaults("bad"), p.kda_chunk = "7";
    expect_config_error(fx, "bad_kda_chunk", &p, "kda_chunk", NULL);
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 32, \"steps\": 2}";
    expect_config_error(fx, "bad_no_lr", &p, "stages[0].lr", "missing");
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 32, \"steps\": 2, \"lr\": 0.01, \"warmup\": 3}";
    expect_config_error(fx, "bad_warmup", &p, "stages[0]", "warmup");
    /* a bad optimizer name or Muon precision, and a good one (the default config already has an optimizer object, so
     * these are written whole) */
    static const char *const opt[3] = {"\"matrix\": \"sgd\"", "\"muon_precision\": \"fp16\"",
                                       "\"muon_precision\": \"bf16\""};
    static const char *const opt_key[3] = {"optimizer.matrix", "optimizer.muon_precision", NULL};
    for (int i = 0; i < 3; i++) {
        k3c_sbuf s;
        k3c_sbuf_init(&s);
        k3c_sbuf_printf(&s,
                        "{\"model\": \"model.json\", \"tokenizer\": \"tok.tiktoken\", \"out_dir\": \"bad\", "
                        "\"data\": {\"a\": \"data/a\"}, \"optimizer\": {%s}, "
                        "\"stages\": [{\"seq_len\": 32, \"tokens_per_step\": 64, \"steps\": 1, \"lr\": 0.1}]}",
                        opt[i]);
        snprintf(cfg, sizeof cfg, "%s/bad_optimizer%d.json", fx->dir, i);
        write_text(cfg, s.buf);
        k3c_sbuf_free(&s);
        int e = k3c_run_config_load(cfg, &rc, &err);
        if (opt_key[i])
            CHECK(e == K3C_ECONFIG && contains(err.msg, opt_key[i]) && contains(err.msg, cfg), "%s: %d '%s'", opt[i], e,
                  err.msg);
        else
            CHECK(e == K3C_OK && strcmp(rc.muon_precision, "bf16") == 0, "%s: %d '%s' ('%s')", opt[i], e, err.msg,
                  rc.muon_precision);
    }
    snprintf(cfg, sizeof cfg, "%s/bad_json.json", fx->dir);
    write_text(cfg, "{\"model\": \"model.json\",\n \"stages\": [}\n");
    int e = k3c_run_config_load(cfg, &rc, &err);
    CHECK(e != K3C_OK && contains(err.msg, "bad_json.json:2:"), "malformed JSON: %d '%s'", e, err.msg);
}

/* Copies source a to a new directory and damages one byte of its first train shard. */
static void damaged_source(const fixture *fx, const char *name, long offset_from_end_or_start, int from_start) {
    char dst[1200], shard[1300];
    snprintf(dst, sizeof dst, "%s/data/%s", fx->dir, name);
    replace_tree(dst, fx->src[0]);
    snprintf(shard, sizeof shard, "%s/train-00000%s", dst, K3C_SHARD_EXT);
    size_t n;
    char *d = slurp(shard, &n);
    if (!d || n < 200) {
        CHECK(0, "no shard %s", shard);
        free(d);
        return;
    }
    long at = from_start ? offset_from_end_or_start : (long)n - offset_from_end_or_start;
    d[at] ^= 0x01;
    FILE *f = fopen(shard, "wb");
    if (f) {
        fwrite(d, 1, n, f);
        fclose(f);
    }
    free(d);
}

/* k3c_train_run of config cfg fails with code (0: any error), a message containing all of a, b, c, and trains nothing. */
static void expect_train_error(const fixture *fx, const char *what, const char *cfg, const char *out, int code,
                               const char *a, const char *b, const char *c) {
    k3c_err err = {0};
    k3c_train_result r;
    char p[1300];
    int e = train(cfg, 0, 0, NULL, &r, &err);
    CHECK((code ? e == code : e != K3C_OK) && contains(err.msg, a) && (!b || contains(err.msg, b)) &&
              (!c || contains(err.msg, c)),
          "%s: code %d (want %d), message '%s' (want %s, %s, %s)", what, e, code, err.msg, a, b ? b : "-", c ? c : "-");
    out_path(fx, out, "latest", p, sizeof p);
    CHECK(r.steps == 0 && !exists(p), "%s: the error came after %lld training steps (it should stop before the first)",
          what, (long long)r.steps);
}

static void test_bad_data(const fixture *fx) {
    char cfg[1200];
    run_params p;
    k3c_err err = {0};

    /* a flipped bit inside the tokens: the checksum names the file */
    damaged_source(fx, "a_flip", 40, 0);
    p = defaults("bad_shard"), p.data = "{\"a\": \"data/a_flip\", \"b\": \"data/b\"}";
    write_run(fx, "run_bad_shard", &p, cfg, sizeof cfg);
    expect_train_error(fx, "corrupt shard", cfg, "bad_shard", K3C_EFORMAT, "a_flip/train-00000.k3cshard", "checksum",
                       NULL);
    damaged_source(fx, "a_magic", 0, 1);
    p = defaults("bad_magic"), p.data = "{\"a\": \"data/a_magic\", \"b\": \"data/b\"}";
    write_run(fx, "run_bad_magic", &p, cfg, sizeof cfg);
    expect_train_error(fx, "wrong magic", cfg, "bad_magic", K3C_EFORMAT, "a_magic/train-00000.k3cshard", "magic", NULL);

    /* the model's vocabulary cannot hold the data's ids */
    p = defaults("bad_vocab"), p.model = "\"model_small.json\"";
    write_run(fx, "run_bad_vocab", &p, cfg, sizeof cfg);
    expect_train_error(fx, "model vocab < data vocab", cfg, "bad_vocab", K3C_ECONFIG, "vocab_size", "300", "299");

    /* a tokenizer that does not exist is found before any training step, not at the first checkpoint */
    p = defaults("bad_tok"), p.tokenizer = "no_such.tiktoken";
    write_run(fx, "run_bad_tok", &p, cfg, sizeof cfg);
    expect_train_error(fx, "missing tokenizer", cfg, "bad_tok", 0, "no_such.tiktoken", NULL, NULL);

    /* a tokenizer that cannot decode the data's ids (283 ids, data up to 299) would ship in every checkpoint */
    {
        char path[1200], corpus[1200];
        snprintf(corpus, sizeof corpus, "%s/corpus/a.txt", fx->dir);
        size_t len;
        char *t0 = slurp(corpus, &len);
        const char *texts[1] = {t0};
        k3c_tok *t = NULL;
        k3c_tok_train_opts to = {
            .vocab_size = VOCAB_RANKS - 17, .pattern = K3C_TOK_PATTERN_CL100K, .specials = SPECIALS, .n_specials = 13};
        CHECK_OK(k3c_tok_train(texts, &len, 1, &to, &t, &err), &err);
        free(t0);
        snprintf(path, sizeof path, "%s/tok_small.tiktoken", fx->dir);
        if (t) CHECK_OK(k3c_tok_save(t, path, &err), &err);
        k3c_tok_free(t);
        p = defaults("bad_tok_vocab"), p.tokenizer = "tok_small.tiktoken";
        write_run(fx, "run_bad_tok_vocab", &p, cfg, sizeof cfg);
        expect_train_error(fx, "tokenizer smaller than the data's vocabulary", cfg, "bad_tok_vocab", 0,
                           "tok_small.tiktoken", "283", "300");
    }

    /* a tokenizer file with a bad line: the error names the file and the line */
    size_t n;
    char *text = slurp(fx->tok, &n);
    if (!text) {
        CHECK(0, "cannot read %s", fx->tok);
        return;
    }
    static const struct {
        const char *line, *what;
    } bad[] = {{"@@notbase64@@ 99", "bad base64"}, {"YWJj", "without a space"}, {"YWJjZA== 7", "out of order"}};
    for (int k = 0; k < 3; k++) {
        k3c_sbuf s;
        k3c_sbuf_init(&s);
        int line = 1;
        for (char *q = text, *nl; *q; q = nl + 1, line++) {
            nl = strchr(q, '\n');
            if (!nl) nl = q + strlen(q) - 1;
            if (line == 100)
                k3c_sbuf_printf(&s, "%s\n", bad[k].line);
            else
                k3c_sbuf_append(&s, q, (size_t)(nl - q + 1));
        }
        char path[1200];
        snprintf(path, sizeof path, "%s/bad%d.tiktoken", fx->dir, k);
        write_text(path, s.buf);
        k3c_sbuf_free(&s);
        k3c_tok *t = NULL;
        int e = k3c_tok_load(path, K3C_TOK_PATTERN_CL100K, 0, &t, &err);
        char want[1300];
        snprintf(want, sizeof want, "%s:100:", path);
        CHECK(e == K3C_EFORMAT && contains(err.msg, want) && contains(err.msg, bad[k].what), "tokenizer %s: %d '%s'",
              bad[k].what, e, err.msg);
        k3c_tok_free(t);
    }
    free(text);
}

/* ---------------------------------------------------------------- 5. the loss goes down */

static void test_loss_decreases(const fixture *fx) {
    char cfg[1200];
    k3c_err err = {0};
    k3c_train_result r;
    run_params p = defaults("L");
    p.stage0 =
        "{\"name\": \"s64\", \"seq_len\": 64, \"steps\": 30, \"lr\": 0.01, \"warmup\": 2, \"schedule\": \"cosine\", "
        "\"mixture\": {\"a\": 0.5, \"b\": 0.5}}";
    p.stage1 = NULL;
    p.ckpt_every = 0;
    p.eval_every = 0;
    write_run(fx, "run_L", &p, cfg, sizeof cfg);
    CHECK_OK(train(cfg, 0, 0, NULL, &r, &err), &err);
    mrow rows[64];
    int bad, n = read_metrics(fx, "L", rows, 64, &bad);
    CHECK(bad == 0 && steps_once(rows, n, 30), "loss run: %d metrics rows", n);
    if (n < 30) return;
    /* at init (std 0.02) the logits are nearly flat, so the first loss is close to ln V */
    CHECK(fabs(rows[0].loss - log(VOCAB)) < 0.1, "first loss %.4f vs ln %d = %.4f", rows[0].loss, VOCAB, log(VOCAB));
    double tail = 0;
    for (int i = 25; i < 30; i++) tail += rows[i].loss / 5;
    /* "clearly below": at least 1 nat (a factor e in perplexity) under the first value, averaged over the last 5 steps */
    CHECK(tail < rows[0].loss - 1.0, "loss did not fall: first %.4f, mean of steps 26-30 %.4f (unigram entropy %.4f)",
          rows[0].loss, tail, r.unigram_entropy);
    if (getenv("K3C_TEST_VERBOSE"))
        printf("  loss: first %.4f, last-5 mean %.4f, unigram entropy %.4f, %.0f tok/s\n", rows[0].loss, tail,
               r.unigram_entropy, r.tokens_per_s);
}

/* `k3c train` (the CLI) trains, then plots the trainer's metrics.jsonl to metrics.png when gnuplot exists. */
static void test_cli_train(const fixture *fx) {
    char cfg[1200], p[1300], cmd[3000];
    run_params rp = defaults("C");
    rp.stage1 = NULL;
    rp.ckpt_every = 0;
    write_run(fx, "run_C", &rp, cfg, sizeof cfg);
    snprintf(cmd, sizeof cmd, "%s train --config '%s' --quiet >/dev/null 2>&1", test_k3c_bin(), cfg);
    CHECK(system(cmd) == 0, "%s failed", cmd);
    out_path(fx, "C", "metrics.jsonl", p, sizeof p);
    CHECK(exists(p), "k3c train wrote no metrics.jsonl");
    out_path(fx, "C", "metrics.png", p, sizeof p);
    if (system("command -v gnuplot >/dev/null 2>&1") == 0) CHECK(exists(p), "k3c train drew no metrics.png");
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--child") == 0) return child_main(argv[2], atoi(argv[3]));
    fixture fx;
    memset(&fx, 0, sizeof fx);
    double t0 = k3c_now();
    if (build_fixture(&fx, "test_train_faults")) return test_summary();
    double t1 = k3c_now();
    double run_seconds = reference_run(&fx);
    double t2 = k3c_now();
    test_partial_checkpoint(&fx);
    test_kill(&fx, run_seconds * 1.3); /* kill delays up to 1.3 times one full run */
    double t3 = k3c_now();
    test_bad_config(&fx);
    test_bad_data(&fx);
    double t4 = k3c_now();
    test_loss_decreases(&fx);
    test_cli_train(&fx);
    double t5 = k3c_now();
    if (test_failed_ == 0) replace_tree(fx.dir, NULL); /* kept for inspection when something failed */
    if (getenv("K3C_TEST_VERBOSE"))
        printf("  times: fixture %.2f s, reference run %.2f s, crash %.2f s, bad input %.2f s, loss %.2f s\n", t1 - t0,
               t2 - t1, t3 - t2, t4 - t3, t5 - t4);
    return test_summary();
}
