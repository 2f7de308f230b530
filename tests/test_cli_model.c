/* test_cli_model.c — the model commands end to end: `k3c golden-check` on the Kimi-Linear golden (passes) and on a
 * tampered copy (fails), `k3c logits` on the K3 golden (matches its teacher-forced logits), `k3c generate --greedy`
 * (reproduces greedy_ids), clear errors for a missing model and for a --device this build lacks. */
#include "test.h"

#include "model/golden.h"

static int run(const char *cmd, char *out, size_t n) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t got = fread(out, 1, n - 1, p);
    out[got] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void golden_check_cli(void) {
    char cmd[2048], out[65536];
    const char *dir = test_shared("golden/kimi_linear_tiny_a");
    snprintf(cmd, sizeof cmd, "%s golden-check --model %s --golden %s/golden.safetensors 2>&1", test_k3c_bin(), dir,
             dir);
    int rc = run(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "golden-check: passed"), "golden-check failed (%d):\n%s", rc, out);
    /* a golden whose loss is off by 1% must fail: rewrite the file with a changed loss */
    const char *tmp = test_tmpdir("cli_model");
    k3c_err err = {0};
    k3c_safetensors *st;
    char gpath[1024], bad[1200];
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
    snprintf(bad, sizeof bad, "%s/bad_golden.safetensors", tmp);
    if (k3c_st_open(gpath, &st, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    int n = k3c_st_count(st);
    k3c_st_entry *e = calloc((size_t)n, sizeof *e);
    float loss;
    for (int i = 0; i < n; i++) {
        const k3c_st_tensor *t = k3c_st_at(st, i);
        e[i] = (k3c_st_entry){t->name, t->dtype, t->ndim, {0}, t->data};
        memcpy(e[i].shape, t->shape, sizeof t->shape);
        if (!strcmp(t->name, "loss")) {
            memcpy(&loss, t->data, 4);
            loss *= 1.01f;
            e[i].data = &loss;
        }
    }
    CHECK_OK(k3c_st_write(bad, e, n, NULL, &err), &err);
    free(e);
    k3c_st_close(st);
    snprintf(cmd, sizeof cmd, "%s golden-check --model %s --golden %s 2>&1", test_k3c_bin(), dir, bad);
    rc = run(cmd, out, sizeof out);
    CHECK(rc == 1 && strstr(out, "FAIL") && strstr(out, "loss"), "tampered golden must fail (%d):\n%s", rc, out);
}

static void logits_and_generate_cli(void) {
    char cmd[2048], out[8192];
    const char *dir = test_shared("golden/k3_tiny_a");
    const char *tmp = test_tmpdir("cli_logits");
    snprintf(cmd, sizeof cmd, "%s logits --model %s --ids %s/golden.safetensors --out %s/logits.f32 2>&1",
             test_k3c_bin(), dir, dir, tmp);
    int rc = run(cmd, out, sizeof out);
    CHECK(rc == 0, "logits failed (%d): %s", rc, out);
    char p[1200];
    snprintf(p, sizeof p, "%s/logits.f32", tmp);
    char *raw;
    size_t n;
    k3c_err err = {0};
    k3c_safetensors *st;
    char gpath[1024];
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
    if (k3c_read_file(p, &raw, &n, &err) || k3c_st_open(gpath, &st, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    const k3c_st_tensor *gl = k3c_st_find(st, "logits");
    CHECK(gl && n == gl->nbytes, "logits size %zu vs golden %zu", n, gl ? gl->nbytes : 0);
    if (gl && n == gl->nbytes) {
        float *ref = malloc(n);
        k3c_st_read_f32(gl, ref, n / 4, &err);
        CHECK_LE(test_rel_err_f((const float *)raw, ref, n / 4), 1e-4, "k3c logits vs k3_tiny_a golden");
        free(ref);
    }
    k3c_st_close(st);
    free(raw);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --ids %s --greedy 16 2>&1", test_k3c_bin(), dir, gpath);
    rc = run(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "413 960 1151 279 192 223 193 264 36 345 2027 1638 1187 320 972 587"),
          "greedy ids differ (%d): %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s logits --model /nonexistent --ids x --out y 2>&1", test_k3c_bin());
    rc = run(cmd, out, sizeof out);
    CHECK(rc == 1 && strstr(out, "/nonexistent"), "missing model: clear error naming it (%d): %s", rc, out);
    /* --device: an unknown name is a usage error; cuda in a CPU-only build says how to get a CUDA build */
    snprintf(cmd, sizeof cmd, "%s generate --model %s --ids %s --greedy 1 --device tpu 2>&1", test_k3c_bin(), dir,
             gpath);
    rc = run(cmd, out, sizeof out);
    CHECK(rc == 2 && strstr(out, "--device must be cpu or cuda"), "--device tpu (%d): %s", rc, out);
    /* --kernels: a known mode for --device cuda only */
    snprintf(cmd, sizeof cmd, "%s train --config x --device cuda --kernels fp64 2>&1", test_k3c_bin());
    rc = run(cmd, out, sizeof out);
    CHECK(rc == 2 && strstr(out, "--kernels must be bf16, fp16 or fp32 (got 'fp64')"), "--kernels fp64 (%d): %s", rc,
          out);
    snprintf(cmd, sizeof cmd, "%s train --config x --kernels fp32 2>&1", test_k3c_bin());
    rc = run(cmd, out, sizeof out);
    CHECK(rc == 2 && strstr(out, "apply to --device cuda"), "--kernels without --device cuda (%d): %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --ids %s --greedy 1 --device cuda 2>&1", test_k3c_bin(), dir,
             gpath);
    rc = run(cmd, out, sizeof out);
    CHECK(rc == 1 && strstr(out, "make cuda"), "--device cuda in a CPU build (%d): %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --ids %s --greedy 16 --device cpu 2>&1", test_k3c_bin(), dir,
             gpath);
    rc = run(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "413 960 1151 279 192 223 193 264 36 345 2027 1638 1187 320 972 587"),
          "--device cpu: greedy ids differ (%d): %s", rc, out);
    /* the sampler flags: logprobs on stderr (the greedy id is the top one), settings out of range are usage errors */
    snprintf(cmd, sizeof cmd, "%s generate --model %s --ids %s --greedy 2 --logprobs 3 2>&1", test_k3c_bin(), dir,
             gpath);
    rc = run(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "[0] id 413 logprob ") && strstr(out, " top 413:") && strstr(out, "[1] id 960"),
          "--logprobs 3 (%d): %s", rc, out);
    snprintf(cmd, sizeof cmd,
             "%s generate --model %s --ids %s --max-new 4 --top-k 5 --min-p 0.05 --repetition-penalty 1.2 "
             "--presence-penalty 0.5 --frequency-penalty 0.1 --seed 3 2>&1",
             test_k3c_bin(), dir, gpath);
    rc = run(cmd, out, sizeof out);
    CHECK(rc == 0, "every sampler flag together (%d): %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --ids %s --greedy 1 --min-p 2 2>&1", test_k3c_bin(), dir, gpath);
    rc = run(cmd, out, sizeof out);
    CHECK(rc == 2 && strstr(out, "min-p"), "--min-p 2 is a usage error (%d): %s", rc, out);
}

typedef struct {
    int32_t ids[32];
    int n, stop_after;
} seen;

static int collect(void *ctx, int32_t id, int64_t i) {
    seen *s = ctx;
    if (s->n < 32 && i == s->n) s->ids[s->n++] = id;
    return s->stop_after && s->n >= s->stop_after;
}

/* k3c_generate through the library: the greedy ids the CLI prints, streamed in order; a stop id ends generation
 * without being streamed; a callback's non-zero return ends it too. */
static void generate_library(void) {
    static const int32_t want[16] = {413, 960, 1151, 279, 192, 223, 193, 264, 36, 345, 2027, 1638, 1187, 320, 972, 587};
    const char *dir = test_shared("golden/k3_tiny_a");
    char gpath[1200];
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
    k3c_err err = {0};
    k3c_serve sv;
    k3c_safetensors *st = NULL;
    if (k3c_serve_open(dir, 0, NULL, &sv, &err)) {
        CHECK(0, "serve_open: %s", err.msg);
        return;
    }
    CHECK_OK(k3c_st_open(gpath, &st, &err), &err);
    const k3c_st_tensor *t = st ? k3c_st_find(st, "prompt_ids") : NULL;
    CHECK(t && t->dtype == K3C_I32, "golden prompt_ids");
    int64_t np = t ? (int64_t)(t->nbytes / 4) : 0, len = 0;
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(np + 16));
    for (int run = 0; t && seq && run < 3; run++) {
        memcpy(seq, t->data, t->nbytes);
        seen s = {{0}, 0, run == 2 ? 1 : 0};
        k3c_gen_opts o = {
            .sampler = {.top_p = 1}, .max_new = 16, .stop_id = run == 1 ? want[2] : -1, .on_token = collect, .ctx = &s};
        CHECK_OK(k3c_generate(sv.weights, seq, np, &o, &len, &err), &err);
        int64_t want_len = run == 0 ? 16 : run == 1 ? 3 : 1;
        int streamed = run == 1 ? 2 : (int)want_len;
        CHECK(len == np + want_len && s.n == streamed, "run %d: length %lld, %d streamed", run, (long long)(len - np),
              s.n);
        for (int i = 0; i < s.n && i < 16; i++)
            CHECK(s.ids[i] == want[i] && seq[np + i] == want[i], "run %d id %d: %d", run, i, s.ids[i]);
    }
    k3c_gen_opts bad = {.sampler = {.top_p = 1}, .max_new = 4, .stop_id = -1};
    CHECK(k3c_generate(sv.weights, seq, 0, &bad, &len, &err) == K3C_EINVAL, "an empty prompt is an error");
    free(seq);
    k3c_st_close(st);
    k3c_serve_close(&sv);
}

/* k3c_golden_check (the library behind golden-check) in float64: logits, loss and every gradient of the Kimi-Linear
 * golden within the float32 CLI's tolerances; a golden without input_ids is an error naming the file. */
static void golden_check_library(void) {
    const char *dir = test_shared("golden/kimi_linear_tiny_a");
    char gpath[1200];
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
    k3c_err err = {0};
    k3c_model m;
    if (k3c_model_open_f64(dir, 1, &m, &err)) {
        CHECK(0, "open: %s", err.msg);
        return;
    }
    k3c_golden_report r = {.rows = calloc(4096, sizeof(k3c_golden_row)), .max_rows = 4096};
    CHECK_OK(k3c_golden_check_f64(&m, gpath, &r, &err), &err);
    CHECK(r.has_logits && r.logits_rel <= 1e-4 && r.has_loss && r.loss_rel <= 1e-4 && r.loss_ref > 0,
          "outputs: logits %g, loss %g (golden %g)", r.logits_rel, r.loss_rel, r.loss_ref);
    double worst = 0;
    for (int i = 0; i < r.n_rows; i++)
        if (r.rows[i].ref_norm > 0 && r.rows[i].rel_err > worst) worst = r.rows[i].rel_err;
    CHECK(r.n_rows > 20 && worst <= 1e-3, "%d gradients, worst %g", r.n_rows, worst);
    const char *cfg = test_shared("golden/kimi_linear_tiny_a/config.json");
    CHECK(k3c_golden_check_f64(&m, cfg, &r, &err) != K3C_OK && strstr(err.msg, "config.json"), "not a golden: %s",
          err.msg);
    free(r.rows);
    k3c_model_free_f64(&m);
}

int main(void) {
    golden_check_cli();
    logits_and_generate_cli();
    generate_library();
    golden_check_library();
    return test_summary();
}
