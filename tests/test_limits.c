/* test_limits.c — bounded inputs: every config dimension has an upper bound stated in its error, sizes
 * are computed with overflow checks, and a command checks the memory it will need before allocating it. The CLI cases
 * run `k3c` as a child and measure its peak RSS (getrusage of the child), so "fails fast" means "in little memory". */
#include "test.h"

#include "model/config.h"
#include "model/model.h"
#include "model/params.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* Peak RSS a refused command may reach: the binary, its libraries and (under ASan) the sanitizer runtime; the bug this
 * guards against grew to gigabytes. */
#define SMALL_RSS_KB (64 * 1024)

/* Runs k3c with argv (NULL-terminated, argv[0] = "k3c"); returns its exit status, its output in out[n] and its peak
 * resident set in KiB. */
static int run_child(char *const argv[], char *out, size_t n, long *maxrss_kb) {
    char log[512];
    snprintf(log, sizeof log, "build/tmp/test_limits.%ld.log", (long)getpid());
    fflush(stdout); /* or the child would print the parent's buffered lines again */
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(log, "w", stdout);
        if (f) dup2(fileno(stdout), 2);
        execv(test_k3c_bin(), argv);
        _exit(127);
    }
    int st = 0;
    struct rusage ru = {0};
    wait4(pid, &st, 0, &ru);
    *maxrss_kb = ru.ru_maxrss;
    out[0] = 0;
    FILE *f = fopen(log, "r");
    if (f) {
        size_t got = fread(out, 1, n - 1, f);
        out[got] = 0;
        fclose(f);
    }
    unlink(log);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* dir/config.json = configs/k3_test_tiny.json with `from` replaced by `to`, next to a copy of a golden model file (so
 * that the directory is a checkpoint `k3c inspect` accepts up to the config). */
static void write_ckpt(const char *dir, const char *from, const char *to) {
    char *text = NULL, p[1200];
    size_t n;
    CHECK(k3c_read_file("configs/k3_test_tiny.json", &text, &n, NULL) == K3C_OK, "read configs/k3_test_tiny.json");
    if (!text) return;
    char *at = strstr(text, from);
    CHECK(at != NULL, "configs/k3_test_tiny.json lacks %s", from);
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    if (f && at) {
        fprintf(f, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
        fclose(f);
    }
    free(text);
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/model.safetensors'", test_shared("golden/k3_tiny_a/model.safetensors"), dir);
    CHECK(system(cmd) == 0, "%s", cmd);
}

/* `k3c inspect` of a 1 KB config asking for 2^30 experts (or a 2^62-wide hidden state): refused by the bound, naming
 * the field and the bound, in little memory and without a sanitizer report. */
static void test_inspect_refuses(const char *tmp) {
    static const struct {
        const char *from, *to, *field, *bound;
    } cases[] = {
        {"\"num_experts\": 4,", "\"num_experts\": 1073741824,", "text_config.num_experts", "in 0..16384"},
        {"\"hidden_size\": 16,", "\"hidden_size\": 4611686018427387904,", "text_config.hidden_size", "in 1..65536"},
        {"\"vocab_size\": 32,", "\"vocab_size\": 9223372036854775807,", "text_config.vocab_size", "in 1..16777216"},
        {"\"moe_intermediate_size\": 8,", "\"moe_intermediate_size\": 1099511627776,",
         "text_config.moe_intermediate_size", "in 1..262144"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[1024], out[8192];
        snprintf(dir, sizeof dir, "%s/inspect%zu", tmp, i);
        write_ckpt(dir, cases[i].from, cases[i].to);
        char *argv[] = {"k3c", "inspect", dir, NULL};
        long rss = 0;
        int rc = run_child(argv, out, sizeof out, &rss);
        CHECK(rc == 1, "%s: exit %d, want 1:\n%s", cases[i].field, rc, out);
        CHECK(strstr(out, cases[i].field) && strstr(out, cases[i].bound) && strstr(out, "config.json"),
              "%s: the error should name the file, field and bound \"%s\":\n%s", cases[i].field, cases[i].bound, out);
        CHECK(!strstr(out, "runtime error") && !strstr(out, "AddressSanitizer"), "%s: sanitizer report:\n%s",
              cases[i].field, out);
        CHECK(rss > 0 && rss < SMALL_RSS_KB, "%s: peak RSS %ld KiB (limit %d)", cases[i].field, rss, SMALL_RSS_KB);
        if (getenv("K3C_TEST_VERBOSE")) printf("  inspect %s: exit %d, peak RSS %ld KiB\n", cases[i].field, rc, rss);
    }
}

/* Every dimension of the validator has an upper bound: one past it is an error naming the field and the bound. */
static void test_bounds(void) {
    k3c_config base;
    k3c_err err = {0};
    CHECK_OK(k3c_config_load("configs/k3_test_tiny.json", &base, &err), &err);
    CHECK_OK(k3c_config_validate(&base, "tiny", &err), &err);
    static const struct {
        size_t off;
        int64_t over;
        const char *field;
    } cases[] = {
#define F(member) offsetof(k3c_config, member)
        {F(vocab_size), (1 << 24) + 1, "vocab_size"},
        {F(hidden_size), (1 << 16) + 1, "hidden_size"},
        {F(intermediate_size), (1 << 18) + 1, "intermediate_size"},
        {F(max_positions), (1 << 26) + 1, "max_position_embeddings"},
        {F(kda_heads), 1025, "linear_attn_config.num_heads"},
        {F(kda_head_dim), 1025, "linear_attn_config.head_dim"},
        {F(conv_kernel), 65, "short_conv_kernel_size"},
        {F(q_lora_rank), (1 << 16) + 1, "q_lora_rank"},
        {F(kv_lora_rank), (1 << 16) + 1, "kv_lora_rank"},
        {F(qk_nope_dim), 1025, "qk_nope_head_dim"},
        {F(qk_rope_dim), 1025, "qk_rope_head_dim"},
        {F(v_head_dim), 1025, "v_head_dim"},
        {F(num_experts), (1 << 14) + 1, "num_experts"},
        {F(num_shared_experts), 65, "num_shared_experts"},
        {F(moe_intermediate_size), (1 << 18) + 1, "moe_intermediate_size"},
        {F(latent_dim), (1 << 16) + 1, "routed_expert_hidden_size"},
        {F(first_k_dense), K3C_MAX_LAYERS + 1, "first_k_dense_replace"},
        {F(moe_layer_freq), K3C_MAX_LAYERS + 1, "moe_layer_freq"},
        {F(attn_res_block), K3C_MAX_LAYERS + 1, "attn_res_block_size"},
        {F(hidden_size), INT64_MAX, "hidden_size"},
        {F(num_experts), INT64_MAX, "num_experts"},
#undef F
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        k3c_config c = base;
        memcpy((char *)&c + cases[i].off, &cases[i].over, sizeof(int64_t));
        err = (k3c_err){0};
        int rc = k3c_config_validate(&c, "cfg.json", &err);
        CHECK(rc == K3C_ECONFIG && strstr(err.msg, cases[i].field) && strstr(err.msg, ".."),
              "%s = %lld: rc %d, message \"%s\"", cases[i].field, (long long)cases[i].over, rc, err.msg);
        k3c_param_table t;
        CHECK(k3c_params_build(&c, &t, &err) == K3C_ECONFIG, "%s: the parameter table of an invalid config",
              cases[i].field);
    }
}

/* Checked arithmetic at the edges, and the memory check. */
static void test_checked_sizes(void) {
    int64_t r = 0;
    CHECK(k3c_mul_ok(1ll << 31, 1ll << 31, &r) && r == 1ll << 62, "2^31 * 2^31");
    CHECK(!k3c_mul_ok(1ll << 32, 1ll << 31, &r), "2^32 * 2^31 overflows");
    CHECK(!k3c_mul_ok(-(1ll << 62), 4, &r), "-2^62 * 4 overflows");
    CHECK(k3c_add_ok(INT64_MAX - 1, 1, &r) && r == INT64_MAX, "max - 1 + 1");
    CHECK(!k3c_add_ok(INT64_MAX, 1, &r), "max + 1 overflows");
    k3c_err err = {0};
    uint64_t have = k3c_mem_available();
    CHECK(have > (1u << 20), "k3c_mem_available = %llu bytes", (unsigned long long)have);
    CHECK_OK(k3c_mem_check(1u << 20, "1 MiB", &err), &err);
    int rc = k3c_mem_check(have + (1ull << 40), "a terabyte more", &err);
    CHECK(rc == K3C_ENOMEM && strstr(err.msg, "a terabyte more needs") && strstr(err.msg, "GiB available"), "rc %d: %s",
          rc, err.msg);
}

/* A config inside every bound whose model does not fit in this machine: creating the model is refused before any
 * allocation, in the library and through the CLI (`k3c logits` builds the float32 model first). */
static void test_model_too_big(const char *tmp) {
    k3c_config c;
    k3c_err err = {0};
    CHECK_OK(k3c_config_load("configs/k3_test_tiny.json", &c, &err), &err);
    c.vocab_size = 1 << 24; /* embedding and lm_head: 2 · 2^24 · 2^16 floats = 8 TiB */
    c.hidden_size = 1 << 16;
    c.vision.text_hidden = c.hidden_size;
    CHECK_OK(k3c_config_validate(&c, "big", &err), &err);
    k3c_model m;
    int rc = k3c_model_create_f32(&c, 1, &m, &err);
    CHECK(rc == K3C_ENOMEM && strstr(err.msg, "model (weights and gradients) needs") && strstr(err.msg, "available"),
          "rc %d: %s", rc, err.msg);
    if (!rc) k3c_model_free_f32(&m);

    char dir[1024], out[8192];
    snprintf(dir, sizeof dir, "%s/big", tmp);
    write_ckpt(dir, "\"vocab_size\": 32,", "\"vocab_size\": 16777216,");
    char *text = NULL, p[1200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    k3c_read_file(p, &text, NULL, NULL);
    char *at = text ? strstr(text, "\"hidden_size\": 16,") : NULL;
    FILE *f = at ? fopen(p, "w") : NULL;
    if (f) {
        fprintf(f, "%.*s\"hidden_size\": 65536,%s", (int)(at - text), text, at + strlen("\"hidden_size\": 16,"));
        fclose(f);
    }
    free(text);
    char ids[1100];
    snprintf(ids, sizeof ids, "%s/ids.safetensors", dir);
    char *argv[] = {"k3c", "logits", "--model", dir, "--ids", ids, "--out", ids, NULL}; /* logits builds the model */
    long rss = 0;
    rc = run_child(argv, out, sizeof out, &rss);
    CHECK(rc != 0 && strstr(out, "needs") && strstr(out, "GiB available"), "logits: exit %d:\n%s", rc, out);
    CHECK(rss > 0 && rss < SMALL_RSS_KB, "logits: peak RSS %ld KiB (limit %d)", rss, SMALL_RSS_KB);
    if (getenv("K3C_TEST_VERBOSE")) printf("  logits of an 8 TiB model: exit %d, peak RSS %ld KiB\n", rc, rss);
    /* generate reads the checkpoint as stored and allocates nothing for the weights: the config's shapes do not match
       the files, which it says, naming the file */
    char *gen[] = {"k3c", "generate", "--model", dir, "--prompt", "x", NULL};
    rc = run_child(gen, out, sizeof out, &rss);
    CHECK(rc != 0 && strstr(out, "model.safetensors"), "generate: exit %d:\n%s", rc, out);
    CHECK(rss > 0 && rss < SMALL_RSS_KB, "generate: peak RSS %ld KiB (limit %d)", rss, SMALL_RSS_KB);
}

int main(void) {
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%.500s", test_tmpdir("test_limits"));
    test_bounds();
    test_checked_sizes();
    test_inspect_refuses(tmp);
    test_model_too_big(tmp);
    return test_summary();
}
