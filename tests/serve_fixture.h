/* serve_fixture.h — shared by the serving tests: a servable model directory built on the spot (a BPE tokenizer
 * trained with the K3 and K2 chat markers as special tokens, the tiny K3 test config with that vocabulary, random
 * weights), and `k3c serve` run as a child process on a free loopback port. Static functions; include once. */
#ifndef K3C_SERVE_FIXTURE_H
#define K3C_SERVE_FIXTURE_H

#include "http_client.h"
#include "serve_corpus.h"
#include "test.h"

#include "base/json.h"
#include "model/model.h"
#include "tok/tok.h"
#include "tok/xtml.h"

static void serve_write(const char *path, const char *text) {
    k3c_err err = {0};
    CHECK_OK(k3c_write_file_atomic(path, text, strlen(text), &err), &err);
}

static char *serve_corpus(size_t *n) {
    k3c_sbuf s;
    serve_corpus_text(&s);
    *n = s.len;
    return s.buf;
}

/* The four media specials of the vision variant, and its tiny tower (text hidden 16 = the test config's). */
static const char *const SERVE_MEDIA[] = {"<|media_begin|>", "<|media_content|>", "<|media_pad|>", "<|media_end|>"};
#define SERVE_VISION_CONFIG                                                                                            \
    ",\n  \"media_placeholder_token_id\": %d,\n  \"vision_config\": {\"patch_size\": 14, \"vt_hidden_size\": 8, "      \
    "\"vt_intermediate_size\": 16, \"vt_num_attention_heads\": 2, \"vt_num_hidden_layers\": 1, \"qkv_hidden_size\": "  \
    "8, "                                                                                                              \
    "\"mm_hidden_size\": 8, \"text_hidden_size\": 16, \"merge_kernel_size\": [2, 2], \"merge_type\": \"sd2_tpool\", "  \
    "\"mm_projector_type\": \"patchmergerv2\", \"mlp_type\": \"mlp2\", \"activation_func\": \"gelu_pytorch_tanh\", "   \
    "\"projector_hidden_act\": \"gelu\", \"projector_ln_eps\": 1e-05, \"norm_type\": \"rmsnorm\", \"pos_emb_type\": "  \
    "\"divided_fixed\", \"init_pos_emb_height\": 8, \"init_pos_emb_width\": 8, \"init_pos_emb_time\": 2, "             \
    "\"pos_emb_interpolation_mode\": \"bilinear\", \"attn_bias\": false, \"linear_bias\": false, "                     \
    "\"patch_embed_proj_bias\": false}\n}\n"

/* Builds <dir>/{tiktoken.model(+.specials.json), k3c_tokenizer.json, config.json, model.safetensors}; with vision, also
 * the media specials, a vision_config and the tower's tensors (vision.safetensors + the index naming both files). */
static int serve_model_dir_v(const char *dir, int vision) {
    k3c_err err = {0};
    size_t n;
    char *text = serve_corpus(&n);
    const char *texts[1] = {text}, *specials[K3C_CHAT_N_SPECIALS + 4];
    memcpy(specials, k3c_chat_specials, sizeof k3c_chat_specials); /* the chat markers (tok/xtml.h) */
    memcpy(specials + K3C_CHAT_N_SPECIALS, SERVE_MEDIA, sizeof SERVE_MEDIA);
    k3c_tok_train_opts to = {.vocab_size = SERVE_RANKS,
                             .pattern = K3C_TOK_PATTERN_KIMI,
                             .specials = specials,
                             .n_specials = K3C_CHAT_N_SPECIALS + (vision ? 4 : 0)};
    k3c_tok *t = NULL;
    int rc = k3c_tok_train(texts, &n, 1, &to, &t, &err);
    free(text);
    CHECK_OK(rc, &err);
    if (rc) return rc;
    int32_t vocab = k3c_tok_n_vocab(t), pad = k3c_tok_special_id(t, "<|media_pad|>");
    char p[4400];
    snprintf(p, sizeof p, "%s/tiktoken.model", dir);
    CHECK_OK(rc = k3c_tok_save(t, p, &err), &err);
    k3c_tok_free(t);
    snprintf(p, sizeof p, "%s/k3c_tokenizer.json", dir);
    serve_write(p, "{\"pattern\": \"kimi\"}\n");
    /* configs/k3_test_tiny.json with the tokenizer's vocabulary */
    char *cfg_text = NULL;
    size_t cn;
    if (rc || (rc = k3c_read_file("configs/k3_test_tiny.json", &cfg_text, &cn, &err))) {
        CHECK_OK(rc, &err);
        return rc;
    }
    char *v = strstr(cfg_text, "\"vocab_size\": 32,");
    CHECK(v != NULL, "configs/k3_test_tiny.json: vocab_size 32 not found");
    if (!v) return K3C_EINVAL;
    k3c_sbuf c;
    k3c_sbuf_init(&c);
    k3c_sbuf_append(&c, cfg_text, (size_t)(v - cfg_text));
    k3c_sbuf_printf(&c, "\"vocab_size\": %d,%s", vocab, v + strlen("\"vocab_size\": 32,"));
    if (vision) { /* the config's closing brace gives way to the vision fields */
        while (c.len && c.buf[c.len - 1] != '}') c.len--;
        c.len--;
        k3c_sbuf_printf(&c, SERVE_VISION_CONFIG, pad);
    }
    free(cfg_text);
    snprintf(p, sizeof p, "%s/config.json", dir);
    serve_write(p, c.buf);
    k3c_sbuf_free(&c);
    k3c_config cfg;
    k3c_model m;
    CHECK_OK(rc = k3c_config_load(p, &cfg, &err), &err);
    if (!rc) CHECK_OK(rc = k3c_model_create_f32(&cfg, 0, &m, &err), &err);
    if (rc) return rc;
    k3c_model_init_f32(&m, 7, 0.5); /* a wide init: the sampled text is varied */
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK_OK(rc = k3c_model_save_f32(&m, p, &err), &err);
    k3c_vision *vt = NULL;
    if (!rc && vision) CHECK_OK(rc = k3c_vision_create_f32(&cfg.vision, 0, &vt, &err), &err);
    if (vt) {
        k3c_vision_init_f32(vt, 9);
        CHECK_OK(rc = k3c_vision_save_beside(vt, dir, &err), &err);
    }
    k3c_vision_free(vt);
    k3c_model_free_f32(&m);
    return rc;
}

static inline int serve_model_dir(const char *dir) { return serve_model_dir_v(dir, 0); }

/* ---------------------------------------------------------------- the server as a child process */

#include <signal.h>
#include <sys/wait.h>

typedef struct {
    pid_t pid; /* -1: none */
    FILE *out; /* its stdout, after the "listening on" line */
    int port;  /* 0: it did not start */
} serve_proc;

/* Starts `k3c serve --model dir --port 0 args...` (args NULL-terminated) with its stdout on a pipe, reads the port it
 * prints and waits for /health 200, which must answer only 200 or 503 (loading) before. port 0 on failure (checked). */
static inline serve_proc serve_start(const char *dir, const char *const *args) {
    serve_proc sv = {-1, NULL, 0};
    const char *argv[48] = {test_k3c_bin(), "serve", "--model", dir, "--port", "0"};
    int n = 6, fds[2];
    for (int i = 0; args && args[i] && n < 47; i++) argv[n++] = args[i];
    argv[n] = NULL;
    if (pipe(fds)) return sv;
    fflush(stdout); /* the child must not write the parent's buffered lines again */
    sv.pid = fork();
    if (sv.pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    sv.out = fdopen(fds[0], "r");
    char line[512];
    if (sv.out && fgets(line, sizeof line, sv.out)) {
        const char *p = strstr(line, "127.0.0.1:");
        if (p) sv.port = atoi(p + 10);
    }
    CHECK(sv.port > 0, "server did not print its port");
    int odd = 0; /* answers other than 200 / 503 */
    for (int i = 0; sv.port && i < 1200; i++) {
        http_resp r;
        int rc = http_do(sv.port, "GET", "/health", NULL, NULL, &r), st = r.status;
        http_resp_free(&r);
        odd += !rc && st != 200 && st != 503;
        if (!rc && st == 200) {
            CHECK(odd == 0, "/health answered something else than 200 or 503 %d times", odd);
            return sv;
        }
        usleep(50 * 1000);
    }
    if (sv.port) CHECK(0, "/health never became 200");
    sv.port = 0;
    return sv;
}

/* SIGTERM, then a clean exit: status 0 and "stopped" in the rest of its output. */
static inline void serve_stop(serve_proc *sv) {
    if (sv->pid > 0) {
        kill(sv->pid, SIGTERM);
        int st = 0;
        waitpid(sv->pid, &st, 0);
        char rest[4096];
        size_t n = sv->out ? fread(rest, 1, sizeof rest - 1, sv->out) : 0;
        rest[n] = 0;
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && strstr(rest, "stopped"), "clean stop (status %d): %s", st, rest);
    }
    if (sv->out) fclose(sv->out);
    *sv = (serve_proc){-1, NULL, 0};
}

#endif
