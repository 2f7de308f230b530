/* test_sdk.c — `k3c serve` driven by the official client SDKs (docs/SERVING.md "Client compatibility"): a fixture
 * model fine-tuned by `k3c sft` to call the calculator tool, the npm packages openai and @anthropic-ai/sdk installed into
 * build/npm on demand (missing node/npm is a failure, not a skip), the server on a free port with an API key, and every
 * tests/sdk/NAME.mjs run by node; their "ok NAME" / "FAIL NAME: detail" lines are this program's checks. */
#include "serve_fixture.h"

#include <glob.h>
#include <sys/stat.h>

#define NPM_PREFIX "build/npm"
#define FIXTURE "build/tmp/sdk_fixture" /* shared by runs and builds (plain, ASan) */
#define KEY "sk-sdk-test"
#define NAME "k3c-tiny-tools"

/* Pinned so that every run, and test_tok_parity (gpt-tokenizer), sees the same packages. */
static const char *const PACKAGES[][2] = {
    {"gpt-tokenizer", "4.0.0"}, {"openai", "7.60.0"}, {"@anthropic-ai/sdk", "1.17.0"}};
#define N_PACKAGES (sizeof PACKAGES / sizeof *PACKAGES)

static int have_package(const char *name, const char *version) {
    char p[512], want[64];
    snprintf(p, sizeof p, NPM_PREFIX "/node_modules/%s/package.json", name);
    snprintf(want, sizeof want, "\"version\": \"%s\"", version);
    char *text = NULL;
    size_t n;
    k3c_read_file(p, &text, &n, NULL);
    int ok = text && strstr(text, want);
    free(text);
    return ok;
}

/* Runs one npm install of all the packages when any is missing; 0 when all are usable. */
static int ensure_npm(void) {
    if (system("command -v node >/dev/null 2>&1") != 0 || system("command -v npm >/dev/null 2>&1") != 0) {
        printf("FAIL: node and npm are required for the SDK tests (Debian: apt-get install nodejs npm; or run `make "
               "setup`)\n");
        return -1;
    }
    int missing = 0;
    for (size_t i = 0; i < N_PACKAGES; i++) missing += !have_package(PACKAGES[i][0], PACKAGES[i][1]);
    if (!missing) return 0;
    char cmd[1024] = "npm install --prefix " NPM_PREFIX " --no-audit --no-fund --loglevel=error";
    for (size_t i = 0; i < N_PACKAGES; i++)
        snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), " %s@%s", PACKAGES[i][0], PACKAGES[i][1]);
    printf("installing the SDKs into " NPM_PREFIX " ...\n");
    fflush(stdout);
    snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), " >build/npm-install.log 2>&1");
    if (system(cmd) != 0) {
        printf("FAIL: %s failed (see build/npm-install.log)\n", cmd);
        return -1;
    }
    return 0;
}

/* The one conversation the fixture learns: a tool request answered with a calculator call, the tool's result answered
 * with the final text. tests/sdk/lib.mjs holds the same request. */
#define TOOL                                                                                                           \
    "{\"type\":\"function\",\"function\":{\"name\":\"calculator\",\"description\":\"Evaluate an arithmetic "           \
    "expression\",\"parameters\":{\"type\":\"object\",\"properties\":{\"expression\":{\"type\":\"string\"}},"          \
    "\"required\":[\"expression\"]}}}"
#define CONVERSATION                                                                                                   \
    "{\"messages\":[{\"role\":\"user\",\"content\":\"What is 6 times 7?\"},{\"role\":\"assistant\",\"content\":\"\","  \
    "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"calculator\",\"arguments\":\"{\\\"expression\\\"" \
    ":\\\"6 * 7\\\"}\"}}]},{\"role\":\"tool\",\"content\":\"42\"},{\"role\":\"assistant\",\"content\":\"The answer "   \
    "is 42.\"}],\"tools\":[" TOOL "]}\n"

static int run_cmd(const char *cmd) {
    fflush(stdout);
    int rc = system(cmd);
    CHECK(rc == 0, "'%s' failed (exit %d)", cmd, rc);
    return rc;
}

#define SFT_CONFIG                                                                                                     \
    "{\"init\": \"init\", \"data\": \"train.jsonl\", \"out_dir\": \"sft\", \"thinking\": false, \"seq_len\": 512, "    \
    "\"steps\": 100, \"lr\": 0.01, \"warmup\": 2, \"schedule\": \"constant\", \"optimizer\": {\"matrix\": "            \
    "\"adamw\"}, "                                                                                                     \
    "\"seed\": 3, \"kda_chunk\": 16, \"threads\": 2, \"checkpoint_every\": 100, \"keep_checkpoints\": 1}\n"
#define RECIPE SFT_CONFIG CONVERSATION /* FIXTURE/ready holds it: a changed recipe rebuilds the fixture */

/* FIXTURE/init (tokenizer, tiny K3, small random weights), FIXTURE/train.jsonl, FIXTURE/sft (k3c sft, thinking off). */
static int make_fixture(void) {
    double t0 = k3c_now();
    char cmd[1024];
    if (run_cmd("rm -rf " FIXTURE " && mkdir -p " FIXTURE "/init")) return -1;
    if (serve_model_dir(FIXTURE "/init")) return -1;
    k3c_err err = {0};
    k3c_config cfg;
    k3c_model m;
    CHECK_OK(k3c_config_load(FIXTURE "/init/config.json", &cfg, &err), &err);
    if (err.code || k3c_model_create_f32(&cfg, 0, &m, &err)) return -1;
    k3c_model_init_f32(&m, 7, 0.02); /* a narrow init learns faster than serve_fixture's wide one */
    CHECK_OK(k3c_model_save_f32(&m, FIXTURE "/init/model.safetensors", &err), &err);
    k3c_model_free_f32(&m);
    k3c_sbuf d;
    k3c_sbuf_init(&d);
    for (int i = 0; i < 8; i++) k3c_sbuf_append(&d, CONVERSATION, strlen(CONVERSATION));
    serve_write(FIXTURE "/train.jsonl", d.buf);
    k3c_sbuf_free(&d);
    serve_write(FIXTURE "/sft.json", SFT_CONFIG);
    snprintf(cmd, sizeof cmd, "OMP_WAIT_POLICY=passive %s sft --config " FIXTURE "/sft.json --quiet", test_k3c_bin());
    if (err.code || run_cmd(cmd)) return -1;
    printf("fixture: built in %.1f s\n", k3c_now() - t0);
    serve_write(FIXTURE "/ready", RECIPE);
    return 0;
}

/* The fixture's checkpoint directory in ckpt, built first when missing or made by another recipe. */
static int build_fixture(char *ckpt, size_t cap) {
    char *text = NULL;
    size_t n;
    k3c_read_file(FIXTURE "/ready", &text, &n, NULL);
    int fresh = text && n == strlen(RECIPE) && !memcmp(text, RECIPE, n);
    free(text);
    text = NULL;
    if (fresh)
        printf("fixture: reusing " FIXTURE "\n");
    else if (make_fixture())
        return -1;
    if (k3c_read_file(FIXTURE "/sft/latest", &text, &n, NULL)) {
        CHECK(0, FIXTURE "/sft/latest: missing");
        return -1;
    }
    while (n && (text[n - 1] == '\n' || text[n - 1] == ' ')) text[--n] = 0;
    snprintf(ckpt, cap, FIXTURE "/sft/%s", text);
    free(text);
    return 0;
}

/* Runs one .mjs file; its ok / FAIL lines become checks, a non-zero exit or no line at all a failure. */
static void run_file(const char *file, int port) {
    char cwd[2048], cmd[6000];
    if (!getcwd(cwd, sizeof cwd)) cwd[0] = 0;
    snprintf(cmd, sizeof cmd,
             "K3C_URL=http://127.0.0.1:%d/v1 K3C_KEY=" KEY " K3C_MODEL=" NAME " K3C_NPM='%s/" NPM_PREFIX
             "/node_modules' node '%s' 2>&1",
             port, cwd, file);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL, "cannot run %s", cmd);
    if (!p) return;
    char line[8192];
    int lines = 0;
    while (fgets(line, sizeof line, p)) {
        printf("%s: %s", file, line);
        if (strncmp(line, "ok ", 3) == 0) test_passed_++, lines++;
        if (strncmp(line, "FAIL ", 5) == 0) test_failed_++, lines++;
    }
    int rc = pclose(p);
    CHECK(rc == 0 && lines > 0, "%s: exit %d after %d checks", file, rc, lines);
}

int main(void) {
    if (ensure_npm() != 0) {
        test_failed_++;
        return test_summary();
    }
    char ckpt[1200];
    if (build_fixture(ckpt, sizeof ckpt) == 0) {
        static const char *const args[] = {"--slots", "2",      "--api-key", KEY, "--max-tokens-cap",
                                           "96",      "--name", NAME,        NULL};
        serve_proc sv = serve_start(ckpt, args);
        glob_t g;
        if (sv.port && glob("tests/sdk/*.mjs", 0, NULL, &g) == 0) {
            for (size_t i = 0; i < g.gl_pathc; i++)
                if (!strstr(g.gl_pathv[i], "/lib.mjs")) run_file(g.gl_pathv[i], sv.port);
            globfree(&g);
        } else if (sv.port)
            CHECK(0, "no tests/sdk/*.mjs");
        serve_stop(&sv);
    }
    return test_summary();
}
