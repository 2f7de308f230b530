/* test_train_recovery.c — the trainer recovering from bad states: checkpoints carry per-file checksums that
 * every reader verifies and --resume falls back past a corrupt one; --resume before the first checkpoint starts from
 * step 0 and removes stale temporaries; the guard skips non-finite or spiking steps and rolls back to the last good
 * checkpoint with a lower learning rate (docs/TRAINING.md §8, §8.1). See train_fixture.h. */
#pragma GCC diagnostic ignored "-Wunused-function" /* the fixture helpers this program does not need */
#include "train_fixture.h"
#include "train/guard.h"

#include <sys/wait.h>

/* Event lines of <out>/metrics.jsonl whose "event" is `event` (and whose text contains `needle`, when given). */
static int count_events(const fixture *fx, const char *out, const char *event, const char *needle) {
    char p[1300], key[96];
    out_path(fx, out, "metrics.jsonl", p, sizeof p);
    char *text = slurp(p, NULL);
    int n = 0;
    snprintf(key, sizeof key, "\"event\":\"%s\"", event);
    for (char *save = NULL, *line = text ? strtok_r(text, "\n", &save) : NULL; line; line = strtok_r(NULL, "\n", &save))
        n += strstr(line, key) && (!needle || strstr(line, needle));
    free(text);
    return n;
}

/* Flips bit `bit` of the byte `from_end` bytes before the end of a file. */
static void flip_bit(const char *path, long from_end, int bit) {
    size_t n = 0;
    char *d = slurp(path, &n);
    CHECK(d && n > (size_t)from_end, "%s: cannot read", path);
    if (!d || n <= (size_t)from_end) return;
    d[n - 1 - (size_t)from_end] ^= (char)(1 << bit);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(d, 1, n, f);
        fclose(f);
    }
    free(d);
}

/* Output of `k3c <args> 2>&1` and its exit status. */
static int run_k3c(const char *args, char *out, size_t n) {
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", test_k3c_bin(), args);
    FILE *p = popen(cmd, "r");
    size_t got = p ? fread(out, 1, n - 1, p) : 0;
    out[got] = 0;
    int st = p ? pclose(p) : -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void reference_run(const fixture *fx) {
    char cfg[1200];
    k3c_err err = {0};
    k3c_train_result r;
    run_params p = defaults("A");
    write_run(fx, "run_A", &p, cfg, sizeof cfg);
    CHECK_OK(train(cfg, 0, 0, NULL, &r, &err), &err);
    CHECK(r.steps == N_STEPS, "reference run: %lld steps", (long long)r.steps);
}

/* ---------------------------------------------------------------- checksums */

/* One flipped bit in a checkpoint's weights (or optimizer state) is an error naming the file and saying "checksum", for
 * the library reader, `k3c inspect` and --resume; --resume falls back to the previous checkpoint, says so in
 * metrics.jsonl, and still ends bit-identical to the uninterrupted run. */
static void test_checksums(const fixture *fx) {
    char cfg[1200], dir[1300], p[1400], out[8192];
    k3c_err err = {0};
    k3c_train_result r;
    run_params rp = defaults("S");
    rp.keep = 3;
    write_run(fx, "run_S", &rp, cfg, sizeof cfg);
    CHECK_OK(train(cfg, 0, 6, NULL, &r, &err), &err);
    out_path(fx, "S", "step_00000006", dir, sizeof dir);
    int n_files = 0;
    CHECK_OK(k3c_checksums_verify(dir, &n_files, &err), &err);
    CHECK(n_files == 7, "checksums.json lists %d files, want 7 (config, model, optimizer, trainer state, tokenizer x3)",
          n_files);
    snprintf(p, sizeof p, "inspect %s", dir);
    int rc = run_k3c(p, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "every file matches checksums.json"), "inspect of a good checkpoint: %d\n%s", rc, out);

    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    flip_bit(p, 5, 3); /* inside the last tensor's data */
    k3c_checkpoint *ck = NULL;
    rc = k3c_ckpt_open(dir, &ck, &err);
    CHECK(rc == K3C_EFORMAT && strstr(err.msg, "model.safetensors") && strstr(err.msg, "checksum"),
          "open of a flipped bit: rc %d: %s", rc, err.msg);
    k3c_ckpt_close(ck);
    k3c_model m;
    rc = k3c_model_open_f32(dir, 0, &m, &err);
    CHECK(rc != K3C_OK && strstr(err.msg, "checksum"), "model open of a flipped bit: rc %d: %s", rc, err.msg);
    if (!rc) k3c_model_free_f32(&m);
    snprintf(p, sizeof p, "inspect %s", dir);
    rc = run_k3c(p, out, sizeof out);
    CHECK(rc == 1 && strstr(out, "model.safetensors") && strstr(out, "checksum"), "inspect: exit %d\n%s", rc, out);

    /* an older checkpoint's optimizer state damaged as well: the fallback skips it too */
    out_path(fx, "S", "step_00000004/optimizer.safetensors", p, sizeof p);
    flip_bit(p, 0, 0);
    CHECK_OK(train(cfg, 1, 0, NULL, &r, &err), &err);
    CHECK(r.steps == N_STEPS, "resume past corrupt checkpoints: %lld steps", (long long)r.steps);
    CHECK(count_events(fx, "S", "resume_fallback", "step_00000002") == 1 &&
              count_events(fx, "S", "resume_fallback", "checksum") == 1,
          "metrics.jsonl should note the fallback to step 2 and the checksum mismatch");
    mrow rows[32];
    int bad, n = read_metrics(fx, "S", rows, 32, &bad);
    CHECK(bad == 0 && steps_once(rows, n, N_STEPS), "metrics after the fallback: %d rows, %d bad", n, bad);
    check_same_final(fx, "A", "S", "resume past corrupt checkpoints");

    /* every checkpoint corrupt: an error that says why, not a silent restart */
    for (int s = 6; s <= N_STEPS; s += 2) {
        char rel[64];
        snprintf(rel, sizeof rel, "step_%08d/model.safetensors", s);
        out_path(fx, "S", rel, p, sizeof p);
        flip_bit(p, 1, 7);
    }
    rc = train(cfg, 1, 0, NULL, &r, &err);
    CHECK(rc != K3C_OK && strstr(err.msg, "checksum") && strstr(err.msg, "no checkpoint"),
          "resume with every checkpoint corrupt: rc %d: %s", rc, err.msg);
}

/* ---------------------------------------------------------------- resume before the first checkpoint */

/* A run killed before its first checkpoint leaves .tmp_step_* and metrics rows behind but no `latest`: --resume starts
 * from step 0, removes the temporaries and ends bit-identical to the uninterrupted run. */
static void test_resume_before_first(const fixture *fx) {
    char cfg[1200], p[1400];
    k3c_err err = {0};
    k3c_train_result r;
    run_params rp = defaults("F");
    write_run(fx, "run_F", &rp, cfg, sizeof cfg);
    out_path(fx, "F", "", p, sizeof p);
    mkdir(p, 0755);
    out_path(fx, "F", ".tmp_step_00000002", p, sizeof p);
    mkdir(p, 0755);
    out_path(fx, "F", ".tmp_step_00000002/model.safetensors", p, sizeof p);
    write_text(p, "half a file");
    out_path(fx, "F", "metrics.jsonl", p, sizeof p);
    write_text(p, "{\"step\":1,\"stage\":0,\"tokens\":128,\"loss\":9.9,\"lr\":0.01,\"grad_norm\":1,"
                  "\"max_load_ratio\":1}\n");
    CHECK_OK(train(cfg, 1, 0, NULL, &r, &err), &err);
    CHECK(r.steps == N_STEPS, "resume before the first checkpoint: %lld steps", (long long)r.steps);
    long long st[32];
    int n_tmp = 0;
    out_path(fx, "F", "", p, sizeof p);
    list_steps(p, st, 32, &n_tmp);
    CHECK(n_tmp == 0, "%d stale .tmp_step_* left", n_tmp);
    mrow rows[32];
    int bad, n = read_metrics(fx, "F", rows, 32, &bad);
    CHECK(bad == 0 && steps_once(rows, n, N_STEPS) && rows[0].loss != 9.9, "metrics: %d rows, %d bad", n, bad);
    CHECK(count_events(fx, "F", "resume_from_scratch", "step 0") == 1, "metrics.jsonl should note the fresh start");
    check_same_final(fx, "A", "F", "resume before the first checkpoint");
    /* and an out dir that does not exist yet */
    rp = defaults("F2");
    write_run(fx, "run_F2", &rp, cfg, sizeof cfg);
    CHECK_OK(train(cfg, 1, 2, NULL, &r, &err), &err);
    CHECK(r.steps == 2, "resume into a new out dir: %lld steps", (long long)r.steps);
}

/* ---------------------------------------------------------------- the step guard */

/* Trains config `name` (a copy of the defaults with `extra` run-config members) under K3C_TEST_FAULT=fault. */
static int train_with_fault(const fixture *fx, const char *name, const char *extra, const char *fault,
                            k3c_train_result *r, k3c_err *err) {
    char cfg[1200], run[64];
    run_params rp = defaults(name);
    rp.extra = extra;
    snprintf(run, sizeof run, "run_%s", name);
    write_run(fx, run, &rp, cfg, sizeof cfg);
    setenv("K3C_TEST_FAULT", fault, 1);
    int rc = train(cfg, 0, 0, NULL, r, err);
    unsetenv("K3C_TEST_FAULT");
    return rc;
}

/* A NaN loss, or a NaN in a gradient, on batch 4: the batch is skipped and logged, the run trains its 10 steps. Both
 * runs end bit-identical: the NaN-gradient batch went through forward, backward and clipping, the NaN-loss batch stopped
 * after the forward, so the skip changed nothing the next steps see (weights, optimizer state, router biases, step). */
static void test_guard_skip(const fixture *fx) {
    k3c_err err = {0};
    k3c_train_result r;
    const char *names[2] = {"G_loss", "G_grad"}, *faults[2] = {"loss:4:1", "grad:4:1"};
    const char *reasons[2] = {"loss is nan", "gradient norm is nan"};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(train_with_fault(fx, names[i], "", faults[i], &r, &err), &err);
        CHECK(r.steps == N_STEPS && r.skipped == 1 && r.rollbacks == 0 && r.lr_scale == 1.0,
              "%s: %lld steps, %lld skipped, %lld rollbacks", names[i], (long long)r.steps, (long long)r.skipped,
              (long long)r.rollbacks);
        CHECK(isfinite(r.last_loss), "%s: last loss %g", names[i], r.last_loss);
        CHECK(count_events(fx, names[i], "skip", reasons[i]) == 1 && count_events(fx, names[i], "skip", "\"step\":4,"),
              "%s: metrics.jsonl should hold one skip event at step 4 saying \"%s\"", names[i], reasons[i]);
        mrow rows[32];
        int bad, n = read_metrics(fx, names[i], rows, 32, &bad);
        CHECK(bad == 0 && steps_once(rows, n, N_STEPS), "%s: metrics: %d rows, %d bad", names[i], n, bad);
    }
    check_same_final(fx, "G_loss", "G_grad", "a NaN gradient skipped like a NaN loss");
    char a[1300], b[1300]; /* and the skipped batch was consumed: not the reference run */
    out_path(fx, "A", "step_00000010/model.safetensors", a, sizeof a);
    out_path(fx, "G_grad", "step_00000010/model.safetensors", b, sizeof b);
    CHECK(!files_equal(a, b), "the run with a skipped batch equals the reference run");
}

/* Three NaN gradients in a row (guard.max_skips 3): back to the checkpoint of step 4 with the learning rate halved,
 * logged, and the run still trains to the end. */
static void test_guard_rollback(const fixture *fx) {
    k3c_err err = {0};
    k3c_train_result r;
    CHECK_OK(train_with_fault(fx, "R", ", \"guard\": {\"max_skips\": 3, \"lr_factor\": 0.5}", "grad:5:3", &r, &err),
             &err);
    CHECK(r.steps == N_STEPS && r.skipped == 3 && r.rollbacks == 1 && r.lr_scale == 0.5,
          "rollback: %lld steps, %lld skipped, %lld rollbacks, lr x %g", (long long)r.steps, (long long)r.skipped,
          (long long)r.rollbacks, r.lr_scale);
    CHECK(isfinite(r.last_loss), "after the rollback: last loss %g", r.last_loss);
    CHECK(count_events(fx, "R", "skip", NULL) == 3 &&
              count_events(fx, "R", "rollback", "back from step 4 to step 4") == 1 &&
              count_events(fx, "R", "rollback", "\"lr_scale\":0.5") == 1,
          "metrics.jsonl should hold 3 skips and a rollback to step 4 with lr_scale 0.5");
    mrow ref[32], rows[32];
    int bad_a, bad_r, na = read_metrics(fx, "A", ref, 32, &bad_a), nr = read_metrics(fx, "R", rows, 32, &bad_r);
    CHECK(bad_r == 0 && steps_once(rows, nr, N_STEPS) && na == N_STEPS, "rollback metrics: %d rows, %d bad", nr, bad_r);
    for (int i = 0; i < nr && i < na; i++) { /* the same schedule, halved from step 5 on */
        double want = ref[i].lr * (rows[i].step > 4 ? 0.5 : 1.0);
        CHECK(fabs(rows[i].lr - want) <= 1e-8 * want,
              /* metrics hold 9 significant digits */ "step %lld: lr %g, want %g", (long long)rows[i].step, rows[i].lr,
              want);
    }
    char p[1300];
    out_path(fx, "R", "step_00000010/trainer_state.json", p, sizeof p);
    char *st = slurp(p, NULL);
    CHECK(st && strstr(st, "\"lr_scale\": 0.5"), "the final trainer_state.json should keep lr_scale 0.5: %s",
          st ? st : "(none)");
    free(st);
    /* with no checkpoint to go back to: an error that says so */
    int rc = train_with_fault(fx, "R0", "", "grad:1:3", &r, &err);
    CHECK(rc == K3C_ENUMERIC && strstr(err.msg, "3 batches in a row skipped") && strstr(err.msg, "no checkpoint"),
          "rollback without a checkpoint: rc %d: %s", rc, err.msg);
}

/* The guard's judgement on its own: non-finite numbers, a spike against the running median (only once enough losses
 * are known), the rollback count, the state's JSON round trip, and the run-config bounds. */
static void test_guard_unit(const fixture *fx) {
    k3c_run_config rc = {.guard_spike_factor = 5, .guard_window = 8, .guard_max_skips = 2, .guard_lr_factor = 0.5};
    k3c_guard g;
    k3c_guard_init(&g);
    char why[256];
    CHECK(k3c_guard_judge(&g, &rc, NAN, 0, why, sizeof why) && strstr(why, "loss is nan"), "NaN loss: %s", why);
    CHECK(k3c_guard_judge(&g, &rc, 2.0, INFINITY, why, sizeof why) && strstr(why, "gradient norm is inf"), "inf: %s",
          why);
    CHECK(!k3c_guard_judge(&g, &rc, 100.0, 1.0, why, sizeof why), "no spike test before any loss is known");
    for (int i = 0; i < 7; i++) k3c_guard_accept(&g, &rc, 2.0 + 0.1 * i);
    CHECK(!k3c_guard_judge(&g, &rc, 100.0, 1.0, why, sizeof why), "no spike test with 7 of 8 losses");
    k3c_guard_accept(&g, &rc, 2.0);
    CHECK(k3c_guard_judge(&g, &rc, 12.0, 1.0, why, sizeof why) && strstr(why, "running median 2.25"),
          "a spike of 12 over a median of 2.25: %s", why);
    CHECK(!k3c_guard_judge(&g, &rc, 11.0, 1.0, why, sizeof why), "11 is under 5 x 2.25");
    CHECK(!k3c_guard_reject(&g, &rc) && k3c_guard_reject(&g, &rc) && g.skipped == 2, "max_skips 2: roll back at 2");
    k3c_guard_accept(&g, &rc, 2.0);
    CHECK(g.fails == 0 && g.n == 8, "an accepted step ends the failure run: fails %lld", (long long)g.fails);
    g.lr_scale = 0.25;
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    k3c_sbuf_printf(&s, "{\"step\": 1");
    k3c_guard_to_json(&g, &s);
    k3c_sbuf_printf(&s, "}");
    k3c_json *j = NULL;
    k3c_guard h;
    k3c_guard_init(&h);
    k3c_err err = {0};
    CHECK_OK(k3c_json_parse(s.buf, s.len, "state", &j, &err), &err);
    CHECK_OK(k3c_guard_from_json(&h, j, "state", &err), &err);
    CHECK(h.lr_scale == 0.25 && h.n == g.n && h.next == g.next && memcmp(h.loss, g.loss, sizeof(double) * 8) == 0,
          "guard state round trip");
    k3c_json_free(j);
    k3c_sbuf_free(&s);
    static const char *const bad[][2] = {{"{\"spike_factor\": 0.5}", "guard.spike_factor"},
                                         {"{\"window\": 0}", "guard.window"},
                                         {"{\"max_skips\": -1}", "guard.max_skips"},
                                         {"{\"lr_factor\": 1.5}", "guard.lr_factor"},
                                         {"{\"spike\": 3}", "guard.spike"}};
    for (int i = 0; i < 5; i++) {
        char cfg[1200], extra[128];
        run_params rp = defaults("bad_guard");
        snprintf(extra, sizeof extra, ", \"guard\": %s", bad[i][0]);
        rp.extra = extra;
        write_run(fx, "run_bad_guard", &rp, cfg, sizeof cfg);
        k3c_run_config r2;
        int e = k3c_run_config_load(cfg, &r2, &err);
        CHECK(e == K3C_ECONFIG && strstr(err.msg, bad[i][1]) && strstr(err.msg, "run_bad_guard.json"), "%s: %s",
              bad[i][0], err.msg);
    }
}

int main(void) {
    fixture fx;
    memset(&fx, 0, sizeof fx);
    if (build_fixture(&fx, "test_train_recovery")) return test_summary();
    reference_run(&fx);
    test_checksums(&fx);
    test_resume_before_first(&fx);
    test_guard_unit(&fx);
    test_guard_skip(&fx);
    test_guard_rollback(&fx);
    if (test_failed_ == 0) replace_tree(fx.dir, NULL); /* kept for inspection when something failed */
    return test_summary();
}
