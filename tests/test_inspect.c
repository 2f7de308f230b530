/* test_inspect.c — `k3c inspect` end to end (docs/FORMATS.md §2–6): the two golden model dirs (tensor count, dtype
 * histogram, logical parameter count, layer plan, clean cross-check), --json, a mismatched config, and bad inputs. */
#include "test.h"

#include "base/json.h"

#include <sys/wait.h>

/* Runs `k3c <args> 2>&1`; returns the exit status and the output (caller frees). */
static int run_k3c(const char *args, char **out) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", test_k3c_bin(), args);
    FILE *p = popen(cmd, "r");
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!p || !buf) {
        *out = buf;
        if (buf) buf[0] = 0;
        return -1;
    }
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (cap - n < 1024) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    buf[n] = 0;
    *out = buf;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void has(const char *out, const char *needle, const char *what) {
    CHECK(strstr(out, needle) != NULL, "%s: output lacks \"%s\":\n%s", what, needle, out);
}

static void test_kimi_linear(void) {
    char args[4400], *out;
    snprintf(args, sizeof args, "inspect %s", test_shared("golden/kimi_linear_tiny_a"));
    int rc = run_k3c(args, &out);
    CHECK(rc == 0, "kimi_linear_tiny_a: exit %d:\n%s", rc, out);
    has(out, "tensors       151\n", "kimi_linear");
    has(out, "339,828 parameters (339,804 trainable + 24 router correction biases)", "kimi_linear");
    has(out, "layers        4: KKKM ", "kimi_linear");
    has(out, "ffn plan      DEEE ", "kimi_linear");
    has(out, "F32   151 tensors, 1,359,312 bytes", "kimi_linear");
    has(out, "gate softplus, output gate low-rank", "kimi_linear");
    has(out, "checks        ok", "kimi_linear");
    CHECK(!strstr(out, "warning"), "kimi_linear: unexpected warnings:\n%s", out);
    free(out);
}

static void test_k3(void) {
    char args[4400], *out;
    snprintf(args, sizeof args, "inspect %s", test_shared("golden/k3_tiny_a"));
    int rc = run_k3c(args, &out);
    CHECK(rc == 0, "k3_tiny_a: exit %d:\n%s", rc, out);
    /* 1492 tensors; U8 weight_packed count twice, weight_scale not at all (values checked against the file header). */
    has(out, "tensors       1,492\n", "k3");
    has(out, "5,507,776 parameters (5,507,584 trainable + 192 router correction biases)", "k3");
    has(out, "layers        13: KKKM KKKM KKKM M ", "k3");
    has(out, "U8    1,152 tensors, 1,253,376 bytes", "k3");
    has(out, "BF16  310 tensors, 6,292,544 bytes", "k3");
    has(out, "F32   30 tensors, 8,832 bytes", "k3");
    has(out, "gate lower-bound (g_min -5), output gate full-rank", "k3");
    has(out, "AttnRes       block size 5", "k3");
    has(out, "routed experts MXFP4 (group 32)", "k3");
    has(out, "model         kimi_k3 (tensor prefix \"language_model.\")", "k3");
    has(out, "checks        ok", "k3");
    free(out);
}

static void test_json(void) {
    char args[4400], *out;
    snprintf(args, sizeof args, "inspect --json %s", test_shared("golden/kimi_linear_tiny_a"));
    int rc = run_k3c(args, &out);
    CHECK(rc == 0, "--json: exit %d", rc);
    k3c_json *j = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_json_parse(out, strlen(out), "inspect --json", &j, &err), &err);
    if (j) {
        const k3c_json *t = k3c_json_get(j, "tensors"), *p = k3c_json_get(j, "parameters"),
                       *c = k3c_json_get(j, "config");
        CHECK(t && t->is_integer && t->integer == 151, "json tensors");
        const k3c_json *tot = p ? k3c_json_get(p, "total") : NULL,
                       *cb = p ? k3c_json_get(p, "router_correction_biases") : NULL;
        CHECK(tot && tot->integer == 339828 && cb && cb->integer == 24, "json parameters");
        const k3c_json *mt = c ? k3c_json_get(c, "model_type") : NULL, *w = k3c_json_get(j, "warnings");
        CHECK(mt && mt->type == K3C_JSON_STRING && strcmp(mt->string, "kimi_linear") == 0, "json config.model_type");
        CHECK(w && w->type == K3C_JSON_ARRAY && w->n == 0, "json warnings empty");
        const k3c_json *plan = k3c_json_get(j, "plan");
        CHECK(plan && plan->type == K3C_JSON_STRING && strcmp(plan->string, "KKKM") == 0, "json plan");
        k3c_json_free(j);
    }
    free(out);
}

/* A config that disagrees with the checkpoint (MLA moved from layer 4 to layer 1): loads, but warns per layer. */
static void test_mismatch(void) {
    const char *dir = test_tmpdir("inspect");
    char src[4400], cmd[9000], *out;
    const char *golden = test_shared("golden/kimi_linear_tiny_a");
    char *abs = realpath(golden, NULL);
    CHECK(abs != NULL, "realpath %s", golden);
    if (!abs) return;
    snprintf(cmd, sizeof cmd,
             "ln -s '%s/model.safetensors' '%s/model.safetensors' && sed -e 's/\"linear_attention\",/\"TMP\",/' "
             "-e 's/\"full_attention\"/\"linear_attention\"/' -e '0,/\"TMP\"/s/\"TMP\"/\"full_attention\"/' "
             "-e 's/\"TMP\"/\"linear_attention\"/g' '%s/config.json' > '%s/config.json'",
             abs, dir, abs, dir);
    CHECK(system(cmd) == 0, "setup: %s", cmd);
    free(abs);
    snprintf(src, sizeof src, "inspect %s", dir);
    int rc = run_k3c(src, &out);
    CHECK(rc == 0, "mismatch: exit %d (warnings do not fail):\n%s", rc, out);
    has(out, "layers        4: MKKK ", "mismatch");
    has(out, "warnings      ", "mismatch");
    has(out, "warning: layer 0: the config says MLA but the checkpoint holds KDA tensors", "mismatch");
    has(out, "warning: layer 3: the config says KDA but the checkpoint holds MLA tensors", "mismatch");
    free(out);
    /* The per-tensor warnings are all in --json (the text lists the first 20). */
    snprintf(src, sizeof src, "inspect --json %s", dir);
    rc = run_k3c(src, &out);
    CHECK(rc == 0, "mismatch --json: exit %d", rc);
    has(out, "layer 0 (MLA, dense): missing model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "mismatch");
    has(out, "unexpected tensor model.layers.3.self_attn.kv_b_proj.weight", "mismatch");
    has(out, "model.layers.0.self_attn.q_proj.weight: shape [64, 64] but the config implies [96, 64]", "mismatch");
    has(out, "\"num_warnings\": 36", "mismatch");
    has(out, "\"total\": 339828", "mismatch");
    free(out);
}

static void test_errors(void) {
    char *out;
    int rc = run_k3c("inspect build/tmp/no-such-checkpoint-dir", &out);
    CHECK(rc == 1 && strstr(out, "k3c inspect: error:") && strstr(out, "no-such-checkpoint-dir/config.json"),
          "missing dir: exit %d: %s", rc, out);
    free(out);
    /* A directory with a config but no weights. */
    char args[4400];
    snprintf(args, sizeof args, "inspect %s", test_shared("golden"));
    rc = run_k3c(args, &out);
    CHECK(rc == 1 && strstr(out, "config.json"), "no config: exit %d: %s", rc, out);
    free(out);
    const char *dir = test_tmpdir("inspect_bad");
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/config.json'", test_shared("golden/kimi_linear_tiny_a/config.json"), dir);
    CHECK(system(cmd) == 0, "setup %s", cmd);
    snprintf(args, sizeof args, "inspect %s", dir);
    rc = run_k3c(args, &out);
    CHECK(rc == 1 && strstr(out, "model.safetensors"), "config without weights: exit %d: %s", rc, out);
    free(out);
    /* A malformed config is reported with its field. */
    snprintf(cmd, sizeof cmd, "sed -i 's/\"hidden_act\": \"silu\"/\"hidden_act\": \"relu\"/' '%s/config.json'", dir);
    CHECK(system(cmd) == 0, "setup %s", cmd);
    rc = run_k3c(args, &out);
    CHECK(rc == 1 && strstr(out, "hidden_act") && strstr(out, "relu"), "bad config: exit %d: %s", rc, out);
    free(out);
    rc = run_k3c("inspect", &out);
    CHECK(rc == 2 && strstr(out, "missing <checkpoint dir>"), "no args: exit %d: %s", rc, out);
    free(out);
    rc = run_k3c("inspect --frobnicate x", &out);
    CHECK(rc == 2 && strstr(out, "--frobnicate"), "unknown option: exit %d: %s", rc, out);
    free(out);
    rc = run_k3c("inspect --help", &out);
    CHECK(rc == 0 && strstr(out, "usage: k3c inspect") && strstr(out, "--json"), "--help: exit %d", rc);
    free(out);
}

int main(void) {
    test_kimi_linear();
    test_k3();
    test_json();
    test_mismatch();
    test_errors();
    return test_summary();
}
