/* cmd_model.c — `k3c logits`, `k3c golden-check` and `k3c generate`: run a Hugging Face checkpoint (Kimi-Linear or
 * Kimi-K3 format) forward (and backward) on the CPU and compare with golden outputs (shared/golden/README.md). */
#include "cli.h"
#include "model/golden.h"
#include "model/model.h"
#include "ops/backend.h"
#include "base/json.h"
#include "serve/sampler.h"
#include "tok/tok.h"

#include <unistd.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Reads an I32 tensor `name` ([B, T] or [T]) from a safetensors file. */
static int read_ids(const char *path, const char *name, int32_t **ids, int64_t *B, int64_t *T, k3c_err *err) {
    k3c_safetensors *st;
    int rc = k3c_st_open(path, &st, err);
    if (rc) return rc;
    const k3c_st_tensor *t = k3c_st_find(st, name);
    if (!t || t->dtype != K3C_I32 || t->ndim < 1 || t->ndim > 2) {
        k3c_st_close(st);
        return k3c_errf(err, K3C_EFORMAT, "%s: needs an I32 tensor '%s' of shape [B, T] or [T]", path, name);
    }
    *B = t->ndim == 2 ? t->shape[0] : 1;
    *T = t->shape[t->ndim - 1];
    *ids = malloc(t->nbytes ? t->nbytes : 4);
    if (*ids) memcpy(*ids, t->data, t->nbytes);
    k3c_st_close(st);
    return *ids ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "out of memory");
}

static int32_t *doc_offsets(int64_t B, int64_t T) {
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(B + 1));
    if (cu)
        for (int64_t b = 0; b <= B; b++) cu[b] = (int32_t)(b * T);
    return cu;
}

static int kda_mode(int argc, char **argv, int *chunk) {
    const char *k = cli_opt(argc, argv, "--kda");
    if (!k || strcmp(k, "64") == 0) {
        *chunk = 64;
        return 1;
    }
    if (strcmp(k, "16") == 0) {
        *chunk = 16;
        return 1;
    }
    if (strcmp(k, "recurrent") == 0) {
        *chunk = 0;
        return 1;
    }
    return 0;
}

/* n logits of the last forward in host memory (a copy downloaded from the model's backend; free it). */
static float *host_logits(const k3c_model *m, const float *logits, size_t n, k3c_err *err) {
    float *h = malloc(sizeof(float) * n + 1);
    if (!h) {
        k3c_errf(err, K3C_ENOMEM, "out of memory");
        return NULL;
    }
    if (k3c_model_backend_f32(m)->download(h, logits, sizeof(float) * n, err)) {
        free(h);
        return NULL;
    }
    return h;
}

int cmd_logits(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        printf("usage: k3c logits --model DIR --ids FILE --out FILE [--name input_ids] [--kda 64|16|recurrent]\n"
               "                  [--device cpu|cuda]\n"
               "Runs the model on the I32 [B, T] tensor `input_ids` of a safetensors file (each row one sequence) and\n"
               "writes raw little-endian float32 logits [B, T, V] to --out (atomically).\n");
        return 0;
    }
    const char *dir = cli_opt(argc, argv, "--model"), *ids_path = cli_opt(argc, argv, "--ids");
    const char *out = cli_opt(argc, argv, "--out"), *name = cli_opt(argc, argv, "--name");
    int chunk;
    if (!dir || !ids_path || !out) return cli_usage_error("logits", "--model, --ids and --out are required");
    if (!kda_mode(argc, argv, &chunk)) return cli_usage_error("logits", "--kda must be 64, 16 or recurrent");
    const char *device = cli_opt(argc, argv, "--device");
    if (cli_device_check("logits", device)) return 2;
    k3c_err err = {0};
    k3c_model m;
    cli_device dev = {0};
    int32_t *ids = NULL, *cu = NULL;
    int64_t B = 0, T = 0;
    if (k3c_model_open_f32(dir, 0, &m, &err)) return cli_fail("logits", &err);
    m.kda_chunk = chunk;
    int rc = cli_device_open(device, &dev, &err);
    if (!rc) rc = cli_device_use(&dev, &m, &err);
    if (!rc) rc = read_ids(ids_path, name ? name : "input_ids", &ids, &B, &T, &err);
    k3c_arena arena = {0};
    if (!rc && !(cu = doc_offsets(B, T))) rc = k3c_errf(&err, K3C_ENOMEM, "out of memory");
    if (!rc) rc = k3c_model_arena_init_f32(&m, k3c_model_plan_bytes_f32(&m, B * T, (int)B), &arena, &err);
    k3c_model_batch b = {B * T, (int)B, ids, cu, NULL, 0};
    k3c_acts *acts;
    float *logits;
    double loss;
    float *hl = NULL;
    if (!rc) rc = k3c_model_forward_f32(&m, &b, &arena, &acts, &loss, &logits, &err);
    if (!rc && !(hl = host_logits(&m, logits, (size_t)(B * T * m.cfg.vocab_size), &err))) rc = err.code;
    if (!rc) rc = k3c_write_file_atomic(out, hl, sizeof(float) * (size_t)(B * T * m.cfg.vocab_size), &err);
    free(hl);
    if (!rc)
        printf("wrote %s: [%lld, %lld, %lld] float32 logits (mean next-token loss %.6f)\n", out, (long long)B,
               (long long)T, (long long)m.cfg.vocab_size, loss);
    k3c_model_arena_free_f32(&m, &arena);
    free(ids);
    free(cu);
    k3c_model_free_f32(&m);
    cli_device_release(&dev);
    return rc ? cli_fail("logits", &err) : 0;
}

static double rel_err_f(const float *x, const k3c_st_tensor *ref, double *work, size_t n) {
    if (k3c_st_read_f64(ref, work, n, NULL)) return INFINITY; /* wrong size or dtype: report as a failure */
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = x[i] - work[i];
        num += d * d;
        den += work[i] * work[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Forward + backward on the golden's input_ids; prints logits / loss / gradient errors. Returns the exit code. */
static int golden_check(const char *dir, const char *gpath, int chunk, const char *device, double tol_out,
                        double tol_grad, int verbose, k3c_err *err) {
    k3c_model m;
    cli_device dev = {0};
    if (k3c_model_open_f32(dir, 1, &m, err)) return -1;
    m.kda_chunk = chunk;
    k3c_safetensors *gs = NULL;
    int32_t *ids = NULL, *cu = NULL;
    int64_t B = 0, T = 0;
    int rc = cli_device_open(device, &dev, err);
    if (!rc) rc = cli_device_use(&dev, &m, err);
    if (!rc) rc = k3c_st_open(gpath, &gs, err);
    if (!rc) rc = read_ids(gpath, "input_ids", &ids, &B, &T, err);
    if (!rc && !(cu = doc_offsets(B, T))) rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    k3c_arena arena = {0};
    if (!rc) rc = k3c_model_arena_init_f32(&m, k3c_model_plan_bytes_f32(&m, B * T, (int)B), &arena, err);
    k3c_model_batch b = {B * T, (int)B, ids, cu, NULL, 0};
    k3c_acts *acts;
    float *logits = NULL;
    double loss = 0;
    int fails = 0;
    if (!rc) rc = k3c_model_forward_f32(&m, &b, &arena, &acts, &loss, &logits, err);
    if (!rc) rc = k3c_model_backward_f32(&m, acts, 1.0, err);
    if (!rc) {
        const k3c_st_tensor *gl = k3c_st_find(gs, "logits"), *gloss = k3c_st_find(gs, "loss");
        size_t n = (size_t)(B * T * m.cfg.vocab_size);
        double *work = malloc(sizeof(double) * n);
        float *hl = gl ? host_logits(&m, logits, n, err) : NULL;
        if (gl && !hl) rc = err->code;
        if (gl && hl && work) {
            double e = rel_err_f(hl, gl, work, n);
            printf("%-64s rel %.3e %s\n", "logits", e, e <= tol_out ? "ok" : "FAIL");
            fails += !(e <= tol_out);
        }
        if (gloss && work) {
            double e = k3c_st_read_f64(gloss, work, 1, NULL) ? INFINITY : fabs(loss - work[0]) / fabs(work[0]);
            printf("%-64s rel %.3e %s (k3c %.8f, golden %.8f)\n", "loss", e, e <= tol_out ? "ok" : "FAIL", loss,
                   work[0]);
            fails += !(e <= tol_out);
        }
        free(work);
        free(hl);
        k3c_golden_row *rows = calloc(4096, sizeof *rows);
        int nr = 0;
        rc = rows ? k3c_golden_grads_f32(&m, gs, rows, 4096, &nr, err) : k3c_errf(err, K3C_ENOMEM, "out of memory");
        double worst = 0;
        for (int i = 0; !rc && i < nr; i++) {
            int zero = rows[i].ref_norm == 0;
            int ok = zero ? rows[i].abs_err <= 1e-6 : rows[i].rel_err <= tol_grad;
            if (!zero && rows[i].rel_err > worst) worst = rows[i].rel_err;
            fails += !ok;
            if (verbose || !ok)
                printf("%-64s %s %.3e %s\n", rows[i].name, zero ? "abs" : "rel",
                       zero ? rows[i].abs_err : rows[i].rel_err, ok ? "ok" : "FAIL");
        }
        if (!rc)
            printf("%d gradients compared, worst relative error %.3e (tolerance %.0e), %d failures\n", nr, worst,
                   tol_grad, fails);
        free(rows);
    }
    k3c_model_arena_free_f32(&m, &arena);
    free(ids);
    free(cu);
    k3c_st_close(gs);
    k3c_model_free_f32(&m);
    cli_device_release(&dev);
    return rc ? -1 : fails ? 1 : 0;
}

int cmd_golden_check(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        printf("usage: k3c golden-check --model DIR --golden FILE [--kda 64|16|recurrent] [--tol-out 1e-4]\n"
               "                        [--tol-grad 1e-3] [--device cpu|cuda] [--verbose]\n"
               "Runs forward + backward (float32) on the golden file's input_ids and prints the relative error of\n"
               "logits, loss and every grad.* tensor present (checkpoint or transformers names). Exit 1 above "
               "tolerance.\n");
        return 0;
    }
    const char *dir = cli_opt(argc, argv, "--model"), *golden = cli_opt(argc, argv, "--golden");
    double tol_out, tol_grad;
    int chunk;
    if (!dir || !golden) return cli_usage_error("golden-check", "--model and --golden are required");
    if (!cli_opt_double(argc, argv, "--tol-out", 1e-4, &tol_out) ||
        !cli_opt_double(argc, argv, "--tol-grad", 1e-3, &tol_grad))
        return 2;
    if (!kda_mode(argc, argv, &chunk)) return cli_usage_error("golden-check", "--kda must be 64, 16 or recurrent");
    const char *device = cli_opt(argc, argv, "--device");
    if (cli_device_check("golden-check", device)) return 2;
    k3c_err err = {0};
    int rc = golden_check(dir, golden, chunk, device, tol_out, tol_grad, cli_flag(argc, argv, "--verbose"), &err);
    if (rc < 0) return cli_fail("golden-check", &err);
    printf("%s\n", rc ? "golden-check: FAILED" : "golden-check: passed");
    return rc;
}

/* The tokenizer a k3c checkpoint carries: tiktoken.model (+ .specials.json) and k3c_tokenizer.json {"pattern": ...}. */
static int load_model_tokenizer(const char *dir, const char *pattern_opt, k3c_tok **tok, k3c_err *err) {
    char p[4200], pattern[32] = "cl100k";
    snprintf(p, sizeof p, "%s/k3c_tokenizer.json", dir);
    k3c_json *j = NULL;
    char *text;
    size_t n;
    if (!pattern_opt && access(p, R_OK) == 0 && !k3c_read_file(p, &text, &n, err)) {
        if (!k3c_json_parse(text, n, p, &j, err)) {
            const k3c_json *v = k3c_json_get(j, "pattern");
            if (v && v->type == K3C_JSON_STRING) snprintf(pattern, sizeof pattern, "%s", v->string);
            k3c_json_free(j);
        }
        free(text);
    }
    if (pattern_opt) snprintf(pattern, sizeof pattern, "%s", pattern_opt);
    k3c_tok_pattern pat;
    if (k3c_tok_pattern_parse(pattern, &pat))
        return k3c_errf(err, K3C_EINVAL, "unknown tokenizer pattern '%s'", pattern);
    snprintf(p, sizeof p, "%s/tiktoken.model", dir);
    int rc = k3c_tok_load(p, pat, 0, tok, err);
    if (rc) return rc;
    snprintf(p, sizeof p, "%s/tiktoken.model.specials.json", dir);
    if (access(p, R_OK) == 0 && (rc = k3c_tok_load_specials_json(*tok, p, NULL, err))) {
        k3c_tok_free(*tok);
        *tok = NULL;
    }
    return rc;
}

/* Decoding loop shared by --ids and --prompt: appends n tokens to seq (length *len); prints ids or streams text. */
static int decode_loop(k3c_model *m, int32_t *seq, int64_t *len, long long n, const k3c_sampler *smp,
                       const k3c_tok *tok, int32_t stop_id, k3c_err *err) {
    k3c_arena arena = {0};
    int64_t V = m->cfg.vocab_size;
    float *pw = malloc(sizeof(float) * (size_t)V);
    int32_t *iw = malloc(sizeof(int32_t) * (size_t)V);
    int rc = pw && iw ? k3c_model_arena_init_f32(m, k3c_model_plan_bytes_f32(m, *len + n, 1), &arena, err)
                      : k3c_errf(err, K3C_ENOMEM, "out of memory");
    for (long long i = 0; !rc && i < n; i++) {
        k3c_arena_reset(&arena, 0);
        k3c_model_batch b = {*len, 1, seq, NULL, NULL, 0};
        k3c_acts *acts;
        float *logits;
        rc = k3c_model_forward_f32(m, &b, &arena, &acts, NULL, &logits, err);
        float *last = rc ? NULL : host_logits(m, logits + (*len - 1) * V, (size_t)V, err); /* the last row only */
        if (!rc && !last) rc = err->code;
        if (rc) break;
        int32_t next = k3c_sample(smp, last, V, (uint64_t)*len, pw, iw);
        free(last);
        seq[(*len)++] = next;
        if (tok) {
            const unsigned char *bytes;
            size_t nb;
            if (next == stop_id) break;
            if (!k3c_tok_is_special(tok, next) && !k3c_tok_token_bytes(tok, next, &bytes, &nb, NULL))
                fwrite(bytes, 1, nb, stdout);
        } else {
            printf("%s%d", i ? " " : "", next);
        }
        fflush(stdout);
    }
    if (!rc) printf("\n");
    k3c_model_arena_free_f32(m, &arena);
    free(pw);
    free(iw);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        printf("usage: k3c generate --model DIR (--prompt TEXT | --ids FILE [--name prompt_ids])\n"
               "                    [--max-new N] [--greedy N] [--temperature T] [--top-p P] [--seed S]\n"
               "                    [--pattern cl100k|kimi] [--kda 64|16|recurrent] [--device cpu|cuda]\n"
               "--prompt encodes TEXT with the checkpoint's tokenizer (tiktoken.model) and prints the continuation;\n"
               "--ids reads I32 token ids from a safetensors file and prints the new ids. --greedy N = --max-new N\n"
               "--temperature 0. Sampling: temperature (default 0.8) and nucleus top-p (default 0.95), seeded.\n"
               "Each step recomputes the prefix; the latent-cache decoder comes with serving.\n");
        return 0;
    }
    const char *dir = cli_opt(argc, argv, "--model"), *ids_path = cli_opt(argc, argv, "--ids");
    const char *prompt = cli_opt(argc, argv, "--prompt"), *name = cli_opt(argc, argv, "--name");
    long long n, greedy, seed;
    double temp, top_p;
    int chunk;
    if (!dir || (!ids_path == !prompt))
        return cli_usage_error("generate", "--model and one of --ids / --prompt are required");
    if (!cli_opt_int(argc, argv, "--max-new", 64, &n) || !cli_opt_int(argc, argv, "--greedy", -1, &greedy) ||
        !cli_opt_int(argc, argv, "--seed", 0, &seed) || !cli_opt_double(argc, argv, "--temperature", 0.8, &temp) ||
        !cli_opt_double(argc, argv, "--top-p", 0.95, &top_p))
        return 2;
    if (greedy >= 0) {
        n = greedy;
        temp = 0;
    }
    if (n < 0 || temp < 0 || !(top_p > 0 && top_p <= 1))
        return cli_usage_error("generate", "need max-new ≥ 0, temperature ≥ 0, 0 < top-p ≤ 1");
    if (!kda_mode(argc, argv, &chunk)) return cli_usage_error("generate", "--kda must be 64, 16 or recurrent");
    const char *device = cli_opt(argc, argv, "--device");
    if (cli_device_check("generate", device)) return 2;
    k3c_err err = {0};
    k3c_model m;
    cli_device dev = {0};
    if (k3c_model_open_f32(dir, 0, &m, &err)) return cli_fail("generate", &err);
    m.kda_chunk = chunk;
    k3c_tok *tok = NULL;
    int32_t *prompt_ids = NULL, stop = -1;
    int64_t B = 1, T = 0;
    int rc = cli_device_open(device, &dev, &err);
    if (!rc) rc = cli_device_use(&dev, &m, &err);
    if (!rc && prompt) {
        k3c_tok_ids v = {0};
        rc = load_model_tokenizer(dir, cli_opt(argc, argv, "--pattern"), &tok, &err);
        if (!rc) rc = k3c_tok_encode(tok, prompt, strlen(prompt), 0, &v, &err);
        if (!rc && v.n == 0) rc = k3c_errf(&err, K3C_EINVAL, "the prompt encodes to no tokens");
        prompt_ids = v.ids;
        T = (int64_t)v.n;
        if (!rc) stop = k3c_tok_special_id(tok, "<|endoftext|>");
        if (!rc) printf("%s", prompt);
    } else if (!rc) {
        rc = read_ids(ids_path, name ? name : "prompt_ids", &prompt_ids, &B, &T, &err);
    }
    int32_t *seq = rc ? NULL : malloc(sizeof(int32_t) * (size_t)(B * T + n));
    if (!rc && !seq) rc = k3c_errf(&err, K3C_ENOMEM, "out of memory");
    if (!rc) {
        memcpy(seq, prompt_ids, sizeof(int32_t) * (size_t)(B * T));
        int64_t len = B * T;
        k3c_sampler smp = {temp, top_p, (uint64_t)seed};
        rc = decode_loop(&m, seq, &len, n, &smp, tok, stop, &err);
    }
    free(prompt_ids);
    free(seq);
    k3c_tok_free(tok);
    k3c_model_free_f32(&m);
    cli_device_release(&dev);
    return rc ? cli_fail("generate", &err) : 0;
}
