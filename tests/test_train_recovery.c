/* test_train_recovery.c — the trainer recovering from bad states (issue 17): checkpoints carry per-file checksums that
 * every reader verifies and --resume falls back past a corrupt one; --resume before the first checkpoint starts from
 * step 0 and removes stale temporaries; the guard skips non-finite or spiking steps and rolls back to the last good
 * checkpoint with a lower learning rate (docs/TRAINING.md §6). See train_fixture.h. */
#pragma GCC diagnostic ignored "-Wunused-function" /* the fixture helpers this program does not need */
#include "train_fixture.h"

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

int main(void) {
    fixture fx;
    memset(&fx, 0, sizeof fx);
    if (build_fixture(&fx, "test_train_recovery")) return test_summary();
    reference_run(&fx);
    test_checksums(&fx);
    test_resume_before_first(&fx);
    if (test_failed_ == 0) replace_tree(fx.dir, NULL); /* kept for inspection when something failed */
    return test_summary();
}
