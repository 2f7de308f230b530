/* test_tok_input.c — the tokenizer on long and malformed input (docs/FORMATS.md §8): a 3 MiB pre-token, a 50 MB
 * unbroken line in bounded memory, encode speed and round trip on real text, invalid UTF-8 (check, strict, CLI). */
#include "test.h"
#include "tok_fixture.h"

#include <sys/wait.h>

/* ---------------------------------------------------------------- long unbroken text, invalid UTF-8 */
static void random_letters(char *s, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        s[i] = (char)('a' + (seed >> 33) % 26);
    }
}

/* n bytes of lower-case words run together (a URL slug, minified text): one pre-token, about 4 bytes per id */
static void run_together(char *s, size_t n, uint64_t seed) {
    static const char *const words[] = {"token", "memory", "bounded", "line", "without", "space", "kimi", "model",
                                        "the",   "and",    "of",      "data", "encode",  "test",  "long", "piece"};
    for (size_t i = 0; i < n;) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        const char *w = words[(seed >> 33) % 16];
        for (size_t k = 0; w[k] && i < n; k++) s[i++] = w[k];
    }
}

/* kB on the "key:" line of /proc/self/status */
static long status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, strlen(key)) == 0) v = atol(line + strlen(key));
    if (f) fclose(f);
    return v;
}

static void test_long_piece(const k3c_tok *k3) {
    /* a 3 MiB pre-token is merged in stretches cut where no token spans: exactly the ids of merging it whole */
    size_t n = 3u << 20;
    char *s = malloc(n);
    random_letters(s, n, 7);
    k3c_tok_ids a = {0}, b = {0};
    k3c_err err = {0};
    CHECK_OK(k3c_tok_encode(k3, s, n, K3C_TOK_NO_CHUNKING, &a, &err), &err);
    CHECK_OK(k3c_tok_encode_piece(k3, s, n, 2, &b, &err), &err);
    CHECK(a.n == b.n && memcmp(a.ids, b.ids, a.n * sizeof *a.ids) == 0, "3 MiB piece: stretches %zu ids, whole %zu",
          a.n, b.n);
    /* 3 MiB of one letter has no place where no token spans: cut regardless, still byte-exact */
    memset(s, 'a', n);
    a.n = 0;
    CHECK_OK(k3c_tok_encode(k3, s, n, K3C_TOK_NO_CHUNKING, &a, &err), &err);
    check_round_trip(k3, a.ids, a.n, s, n, "3 MiB of 'a'");
    k3c_tok_ids_free(&a);
    k3c_tok_ids_free(&b);
    free(s);
    /* a 50 MB line without whitespace (one pre-token) encodes in under 200 MB, measured in a child process */
    int fd[2];
    if (pipe(fd) != 0) return;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        long base = status_kb("VmRSS:");
        size_t len = 50000000;
        char *line = malloc(len);
        run_together(line, len, 11);
        k3c_tok_ids v = {0};
        int rc = k3c_tok_encode(k3, line, len, K3C_TOK_NO_CHUNKING, &v, NULL);
        long peak[2] = {rc == K3C_OK && v.n > len / 16 ? status_kb("VmHWM:") - base : -1, (long)v.n};
        if (write(fd[1], peak, sizeof peak) != sizeof peak) _exit(1);
        _exit(0);
    }
    close(fd[1]);
    long peak[2] = {-1, 0};
    CHECK(read(fd[0], peak, sizeof peak) == sizeof peak, "no report from the child");
    close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    CHECK(peak[0] > 0 && peak[0] < 200 * 1024, "50 MB unbroken line: %ld kB peak above the start (want < 200 MB)",
          peak[0]);
    if (getenv("K3C_TEST_VERBOSE")) printf("  50 MB line: %ld ids, peak +%ld kB\n", peak[1], peak[0]);
}

static void test_invalid_utf8(const k3c_tok *k3) {
    static const struct {
        const char *s;
        size_t at;
    } cases[] = {
        {"h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80", 15}, /* valid: the length */
        {"ab\xff"
         "c",
         2},                         /* a byte that never starts a sequence */
        {"abc\x80", 3},              /* stray continuation */
        {"\xc0\xaf", 0},             /* overlong '/' */
        {"x\xed\xa0\x80", 1},        /* a surrogate */
        {"xy\xf4\x90\x80\x80", 2},   /* past U+10FFFF */
        {"\xe2\x82\xac\xe2\x82", 3}, /* cut short at the end */
        {"\xe2\x82"
         "a",
         0}, /* cut short before ASCII */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t n = strlen(cases[i].s), at = k3c_utf8_check(cases[i].s, n);
        CHECK(at == cases[i].at, "utf8 case %zu: first invalid byte %zu, want %zu", i, at, cases[i].at);
    }
    k3c_tok_ids v = {0};
    k3c_err err = {0};
    CHECK(k3c_tok_encode(k3, "ok \xff!", 5, K3C_TOK_STRICT_UTF8, &v, &err) == K3C_EFORMAT && v.n == 0 &&
              strstr(err.msg, "at byte 3"),
          "strict encode refuses invalid UTF-8 naming byte 3: %s", err.msg);
    CHECK_OK(k3c_tok_encode(k3, "ok \xff!", 5, 0, &v, &err), &err);
    char *fixed = NULL;
    size_t fl = 0, bad = 0;
    CHECK_OK(k3c_utf8_replace("a\xff\xc0\xaf"
                              "b",
                              5, &fixed, &fl, &bad, &err),
             &err);
    CHECK(fixed && bad == 3 && fl == 11 &&
              memcmp(fixed,
                     "a\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                     "b",
                     11) == 0,
          "replace: %zu bad, %zu bytes", bad, fl);
    free(fixed);
    k3c_tok_ids_free(&v);
    /* the CLI warns by default with the offset and refuses with --invalid-utf8 error */
    char path[] = "/tmp/k3c_test_utf8_XXXXXX", cmd[2048];
    int fd = mkstemp(path);
    if (fd < 0 || write(fd,
                        "abc d\xe9"
                        "f",
                        7) != 7)
        CHECK(0, "cannot write %s", path);
    if (fd >= 0) close(fd);
    const char *vocab = test_shared("golden/kimi_tokenizer/tiktoken.model");
    snprintf(cmd, sizeof cmd, "%s tokenizer encode --vocab %s --input %s 2>&1 >/dev/null", test_k3c_bin(), vocab, path);
    FILE *p = popen(cmd, "r");
    char out[512] = {0};
    size_t got = p ? fread(out, 1, sizeof out - 1, p) : 0;
    int st = p ? pclose(p) : -1;
    CHECK(got && st == 0 && strstr(out, "warning: invalid UTF-8 at byte 5"), "CLI warning: '%s'", out);
    snprintf(cmd, sizeof cmd, "%s tokenizer encode --vocab %s --input %s --invalid-utf8 error >/dev/null 2>&1",
             test_k3c_bin(), vocab, path);
    CHECK(system(cmd) != 0, "--invalid-utf8 error refuses the text");
    unlink(path);
}

static void test_speed(const k3c_tok *k3, const char *text, size_t n) {
    k3c_tok_ids v = {0};
    double t0 = k3c_now();
    k3c_err err = {0};
    CHECK_OK(k3c_tok_encode(k3, text, n, 0, &v, &err), &err);
    double dt = k3c_now() - t0, mbps = (double)n / 1e6 / dt;
    CHECK(mbps >= 1.0, "Kimi encode %.2f MB/s < 1 MB/s", mbps);
    if (getenv("K3C_TEST_VERBOSE")) printf("  kimi encode: %zu bytes -> %zu ids, %.1f MB/s\n", n, v.n, mbps);
    check_round_trip(k3, v.ids, v.n, text, n, "jargon");
    k3c_tok_ids_free(&v);
}

int main(void) {
    k3c_tok *k3 = load_kimi("kimi_k3");
    if (k3) {
        test_long_piece(k3);
        test_invalid_utf8(k3);
    }
    size_t n;
    char *text = jargon(400000, &n);
    if (k3) test_speed(k3, text, n);
    free(text);
    k3c_tok_free(k3);
    return test_summary();
}
