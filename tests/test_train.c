/* test_train.c — the trainer end to end (trainer.c, run_config.c, checkpoint.c), part 1 of 2: bit-exact resume across a
 * stage boundary, checkpoint layout and pruning, metrics.jsonl (docs/TRAINING.md §1–§2). Fixture: tests/train_fixture.h. */
#include "train_fixture.h"

#include "train/schedule.h"

/* ---------------------------------------------------------------- 1. resume bit-exactness */

/* Metrics of the resumed steps equal those of the straight run, bit for bit (they are written with %.9g). */
static void check_same_metrics(const fixture *fx, const char *x, const char *y, const char *what) {
    mrow ra[64], rb[64];
    int bad_a, bad_b, na = read_metrics(fx, x, ra, 64, &bad_a), nb = read_metrics(fx, y, rb, 64, &bad_b);
    CHECK(bad_a == 0 && bad_b == 0 && steps_once(ra, na, N_STEPS) && steps_once(rb, nb, N_STEPS),
          "%s: metrics rows %d / %d (bad %d / %d), want steps 1..%d once", what, na, nb, bad_a, bad_b, N_STEPS);
    int same = na == nb;
    for (int i = 0; same && i < na; i++)
        /* a run stopped by max_steps validates at its last step too, so y may have more val_loss entries than x */
        same = ra[i].loss == rb[i].loss && ra[i].lr == rb[i].lr && ra[i].grad_norm == rb[i].grad_norm &&
               ra[i].max_load_ratio == rb[i].max_load_ratio && (!ra[i].has_val || rb[i].has_val) &&
               (!ra[i].has_val || ra[i].val_loss == rb[i].val_loss);
    CHECK(same, "%s: per-step metrics of %s and %s differ", what, x, y);
}

static void test_resume(const fixture *fx, const char *balancing) {
    char cfg_a[1200], cfg_b[1200], out_a[64], out_b[64], name[64];
    k3c_err err = {0};
    k3c_train_result ra, rb;
    snprintf(out_a, sizeof out_a, "A_%s", balancing);
    snprintf(out_b, sizeof out_b, "B_%s", balancing);
    run_params p = defaults(out_a);
    p.balancing = balancing;
    snprintf(name, sizeof name, "run_A_%s", balancing);
    write_run(fx, name, &p, cfg_a, sizeof cfg_a);
    p.out = out_b;
    snprintf(name, sizeof name, "run_B_%s", balancing);
    write_run(fx, name, &p, cfg_b, sizeof cfg_b);

    CHECK_OK(train(cfg_a, 0, 0, NULL, &ra, &err), &err);
    CHECK(ra.steps == N_STEPS && isfinite(ra.last_loss) && isfinite(ra.last_val_loss), "%s: straight run: %lld steps",
          balancing, (long long)ra.steps);

    /* half-way (step 5 of stage s32's 6), then resume into stage s64 */
    CHECK_OK(train(cfg_b, 0, N_STEPS / 2, NULL, &rb, &err), &err);
    CHECK(rb.steps == N_STEPS / 2, "%s: max_steps run stopped at %lld", balancing, (long long)rb.steps);
    char latest[1300];
    out_path(fx, out_b, "latest", latest, sizeof latest);
    char *l = slurp(latest, NULL);
    CHECK(l && strcmp(l, "step_00000005\n") == 0, "%s: latest after 5 steps is '%s'", balancing, l ? l : "(none)");
    free(l);
    FILE *log = tmpfile();
    CHECK_OK(train(cfg_b, 1, 0, log, &rb, &err), &err);
    /* the resumed run did steps 6..10 only (a resume that restarted from scratch would log 10 lines) */
    int lines = log ? count_lines(log) : -1;
    CHECK(lines == N_STEPS - N_STEPS / 2, "%s: resumed run logged %d steps, want %d", balancing, lines,
          N_STEPS - N_STEPS / 2);
    if (log) fclose(log);
    CHECK(rb.steps == N_STEPS && rb.last_loss == ra.last_loss,
          "%s: resumed last loss %.17g vs straight %.17g (steps %lld)", balancing, rb.last_loss, ra.last_loss,
          (long long)rb.steps);
    CHECK(rb.last_val_loss == ra.last_val_loss, "%s: val loss %.17g vs %.17g", balancing, rb.last_val_loss,
          ra.last_val_loss);
    check_same_final(fx, out_a, out_b, balancing);
    check_same_metrics(fx, out_a, out_b, balancing);
    long long st[32];
    int n_tmp;
    out_path(fx, out_b, "", latest, sizeof latest);
    int ns = list_steps(latest, st, 32, &n_tmp);
    CHECK(ns == 2 && st[0] == 8 && st[1] == 10 && n_tmp == 0, "%s: B keeps %d checkpoints (%lld, %lld), %d temporary",
          balancing, ns, ns ? st[0] : -1, ns > 1 ? st[1] : -1, n_tmp);
}

/* Three invocations: 0→3, 3→6 (ends exactly at the stage boundary), 6→10. */
static void test_resume_chain(const fixture *fx) {
    char cfg[1200];
    k3c_err err = {0};
    k3c_train_result r;
    run_params p = defaults("C_exact");
    write_run(fx, "run_C_exact", &p, cfg, sizeof cfg);
    CHECK_OK(train(cfg, 0, 3, NULL, &r, &err), &err);
    CHECK_OK(train(cfg, 1, 6, NULL, &r, &err), &err);
    CHECK(r.steps == 6, "chain: second leg ended at %lld", (long long)r.steps);
    CHECK_OK(train(cfg, 1, 0, NULL, &r, &err), &err);
    CHECK(r.steps == N_STEPS, "chain: third leg ended at %lld", (long long)r.steps);
    check_same_final(fx, "A_exact", "C_exact", "chain 3/6/10");
    check_same_metrics(fx, "A_exact", "C_exact", "chain 3/6/10");
    /* resuming a finished run is a no-op that succeeds */
    CHECK_OK(train(cfg, 1, 0, NULL, &r, &err), &err);
    CHECK(r.steps == N_STEPS, "resume of a finished run: %lld steps", (long long)r.steps);
}

/* The same with two OpenMP threads (the other runs use one, which keeps the test fast on a shared machine): 5 steps
 * across a stage boundary straight, and 2 + 3 resumed. */
static void test_resume_threads(const fixture *fx) {
    char cfg_x[1200], cfg_y[1200];
    k3c_err err = {0};
    k3c_train_result rx, ry;
    run_params p = defaults("T2_x");
    p.threads = 2;
    p.stage0 = "{\"seq_len\": 32, \"steps\": 3, \"lr\": 0.01, \"mixture\": {\"a\": 0.8, \"b\": 0.2}}";
    p.stage1 = "{\"seq_len\": 64, \"steps\": 2, \"lr\": 0.01, \"mixture\": {\"a\": 0.2, \"b\": 0.8}}";
    write_run(fx, "run_T2_x", &p, cfg_x, sizeof cfg_x);
    p.out = "T2_y";
    write_run(fx, "run_T2_y", &p, cfg_y, sizeof cfg_y);
    CHECK_OK(train(cfg_x, 0, 0, NULL, &rx, &err), &err);
    CHECK_OK(train(cfg_y, 0, 2, NULL, &ry, &err), &err);
    CHECK_OK(train(cfg_y, 1, 0, NULL, &ry, &err), &err);
    CHECK(rx.steps == 5 && ry.steps == 5 && rx.last_loss == ry.last_loss, "2 threads: last loss %.17g vs %.17g",
          rx.last_loss, ry.last_loss);
    check_same_final_at(fx, "T2_x", "T2_y", 5, "2 threads");
}

/* ---------------------------------------------------------------- 2. checkpoints and metrics */

static void test_checkpoints(const fixture *fx) {
    char p[2400], dir[1300];
    k3c_err err = {0};
    out_path(fx, "A_exact", "latest", p, sizeof p);
    char *l = slurp(p, NULL);
    CHECK(l && strcmp(l, "step_00000010\n") == 0, "latest is '%s'", l ? l : "(none)");
    free(l);
    long long st[32];
    int n_tmp;
    out_path(fx, "A_exact", "", p, sizeof p);
    int ns = list_steps(p, st, 32, &n_tmp);
    CHECK(ns == 2 && st[0] == 8 && st[1] == 10 && n_tmp == 0, "keep_checkpoints 2: %d left (%lld, %lld), %d temporary",
          ns, ns ? st[0] : -1, ns > 1 ? st[1] : -1, n_tmp);
    CHECK_OK(k3c_train_ckpt_latest(p, dir, sizeof dir, &err), &err);
    CHECK(contains(dir, "step_00000010"), "k3c_train_ckpt_latest: %s", dir);

    /* a Hugging Face model directory */
    char why[1200] = "";
    CHECK(ckpt_loads(fx, dir, N_STEPS, why, sizeof why) == K3C_OK, "step_10: %s", why);
    k3c_config cfg;
    CHECK_OK(k3c_config_load(dir, &cfg, &err), &err);
    CHECK(cfg.vocab_size == VOCAB && cfg.num_layers == 4 && k3c_config_num_moe(&cfg) == 3,
          "config: vocab %lld layers %lld", (long long)cfg.vocab_size, (long long)cfg.num_layers);
    k3c_checkpoint *ck = NULL;
    CHECK_OK(k3c_ckpt_open(dir, &ck, &err), &err);
    if (ck) {
        CHECK(k3c_ckpt_count(ck) > 20, "checkpoint has %d tensors", k3c_ckpt_count(ck));
        k3c_ckpt_close(ck);
    }
    /* the tokenizer travels with the model */
    snprintf(p, sizeof p, "%s/tiktoken.model", dir);
    CHECK(files_equal(p, fx->tok), "tiktoken.model is not a copy of the run's tokenizer");
    k3c_tok *t = NULL;
    CHECK_OK(k3c_tok_load_dir(dir, NULL, &t, &err), &err);
    if (t) {
        CHECK(k3c_tok_get_pattern(t) == K3C_TOK_PATTERN_CL100K, "checkpoint tokenizer pattern");
        CHECK(k3c_tok_n_vocab(t) == VOCAB && k3c_tok_n_specials(t) == 13 &&
                  k3c_tok_special_id(t, "<|endoftext|>") == VOCAB_RANKS,
              "checkpoint tokenizer: vocab %d specials %d", k3c_tok_n_vocab(t), k3c_tok_n_specials(t));
        k3c_tok_free(t);
    }
    snprintf(p, sizeof p, "%s/k3c_tokenizer.json", dir);
    k3c_json *j = NULL;
    CHECK_OK(k3c_json_parse_file(p, &j, &err), &err);
    const k3c_json *pat = k3c_json_get(j, "pattern");
    CHECK(pat && pat->type == K3C_JSON_STRING && strcmp(pat->string, "cl100k") == 0, "k3c_tokenizer.json pattern");
    k3c_json_free(j);

    /* metrics.jsonl: one object per step (log_every 1), validation at steps 4, 8 (eval_every) and 10 (last) */
    mrow rows[64];
    int bad, n = read_metrics(fx, "A_exact", rows, 64, &bad);
    CHECK(bad == 0 && steps_once(rows, n, N_STEPS), "metrics.jsonl: %d rows, %d bad", n, bad);
    int val_ok = 1, stage_ok = 1, tok_ok = 1, load_ok = 1;
    for (int i = 0; i < n; i++) {
        int want_val = rows[i].step % 4 == 0 || rows[i].step == N_STEPS;
        val_ok &= rows[i].has_val == want_val && (!want_val || rows[i].val_loss > 0);
        stage_ok &= rows[i].stage == (rows[i].step <= 6 ? 0 : 1);
        tok_ok &= rows[i].tokens == rows[i].step * TPS;
        /* an expert takes at most one route per token: max/mean ≤ n / k = 2 */
        load_ok &= rows[i].max_load_ratio >= 1 && rows[i].max_load_ratio <= 2 && rows[i].grad_norm > 0;
    }
    CHECK(val_ok, "val_loss must be present exactly at steps 4, 8, 10");
    CHECK(stage_ok && tok_ok && load_ok, "metrics stage %d tokens %d load/grad_norm %d", stage_ok, tok_ok, load_ok);
    /* the lr of each row is the stage schedule at the 1-based step within the stage (optim.h: "step is the 1-based
     * update index"): s32 warms up over 1 step so step 1 runs at the peak 0.01; s64 decays linearly to 0.1 · 0.005 at
     * its last step (10). */
    double worst = 0;
    int worst_step = 0;
    for (int i = 0; i < n; i++) {
        int s = rows[i].step <= 6 ? 0 : 1;
        int64_t in_stage = s == 0 ? rows[i].step : rows[i].step - 6;
        k3c_schedule sch = s == 0 ? (k3c_schedule){K3C_SCHED_COSINE, 0.01, 1, 6, 0.1}
                                  : (k3c_schedule){K3C_SCHED_LINEAR, 0.005, 0, 4, 0.1};
        double want = k3c_schedule_lr(&sch, in_stage), d = fabs(rows[i].lr - want) / want;
        if (d > worst) worst = d, worst_step = (int)rows[i].step;
    }
    CHECK(worst <= 1e-8,
          "lr schedule: step %d off by %.3g (relative); step 1 lr %g (want 0.01), step 10 lr %g (want 0.0005)",
          worst_step, worst, n ? rows[0].lr : NAN, n >= N_STEPS ? rows[N_STEPS - 1].lr : NAN);
    out_path(fx, "A_exact", "metrics.png", p, sizeof p);
    CHECK(!exists(p), "the library drew metrics.png (plotting belongs to `k3c train`)");
}

/* A new run (no resume) started in an out dir that still holds a finished run's checkpoints (step_8, step_10): either
 * a clear error naming the out dir before any step, or a run whose `latest` names a loadable checkpoint of its own. The
 * new checkpoints must not be pruned as "older" than the stale ones, and `latest` must never name a deleted directory. */
static void test_fresh_run_in_used_dir(const fixture *fx) {
    char cfg[1200], p[1300], q[1300];
    k3c_err err = {0};
    k3c_train_result r;
    out_path(fx, "A_exact", "", p, sizeof p);
    out_path(fx, "A_rerun", "", q, sizeof q);
    replace_tree(q, p);
    run_params rp = defaults("A_rerun");
    write_run(fx, "run_A_rerun", &rp, cfg, sizeof cfg);
    int e = train(cfg, 0, 4, NULL, &r, &err);
    if (e) {
        CHECK(r.steps == 0 && contains(err.msg, "A_rerun"), "fresh run in a used out dir failed after %lld steps: %s",
              (long long)r.steps, err.msg);
        return;
    }
    char dir[1300], why[1200] = "";
    CHECK_OK(k3c_train_ckpt_latest(q, dir, sizeof dir, &err), &err);
    CHECK(contains(dir, "step_00000004") && ckpt_loads(fx, dir, 4, why, sizeof why) == K3C_OK,
          "fresh run in a used out dir: latest %s: %s", dir, why);
}

int main(void) {
    fixture fx;
    memset(&fx, 0, sizeof fx);
    double t0 = k3c_now();
    if (build_fixture(&fx, "test_train")) return test_summary();
    double t1 = k3c_now();
    test_resume(&fx, "exact");
    test_resume(&fx, "histogram");
    char a[1300], b[1300];
    out_path(&fx, "A_exact", "step_00000010/model.safetensors", a, sizeof a);
    out_path(&fx, "A_histogram", "step_00000010/model.safetensors", b, sizeof b);
    CHECK(!files_equal(a, b), "exact and histogram balancing trained identical models (balancing not applied?)");
    test_resume_chain(&fx);
    test_resume_threads(&fx);
    double t2 = k3c_now();
    test_checkpoints(&fx);
    test_fresh_run_in_used_dir(&fx);
    double t3 = k3c_now();
    if (test_failed_ == 0) replace_tree(fx.dir, NULL); /* kept for inspection when something failed */
    if (getenv("K3C_TEST_VERBOSE"))
        printf("  times: fixture %.2f s, resume %.2f s, checkpoints %.2f s\n", t1 - t0, t2 - t1, t3 - t2);
    return test_summary();
}
