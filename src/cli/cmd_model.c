/* cmd_model.c — `k3c logits`, `k3c golden-check` and `k3c generate`: run a Hugging Face checkpoint (Kimi-Linear or
 * Kimi-K3 format) forward (and backward) on the CPU and compare with golden outputs (shared/golden/README.md). */
#include "cli.h"
#include "k3c/check.h"
#include "k3c/serve.h"
#include "k3c/tok.h"

#include <unistd.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int32_t *doc_offsets(int64_t B, int64_t T) {
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(B + 1));
    if (cu)
        for (int64_t b = 0; b <= B; b++) cu[b] = (int32_t)(b * T);
    return cu;
}

int cmd_logits(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        printf("usage: k3c logits --model DIR --ids FILE --out FILE [--name input_ids] [--kda 64|16|recurrent]\n"
               "                  [--device cpu|cuda] [--gemm fp32|tf32|bf16] [--kernels bf16|fp16|fp32]\n"
               "Runs the model on the I32 [B, T] tensor `input_ids` of a safetensors file (each row one sequence) and\n"
               "writes raw little-endian float32 logits [B, T, V] to --out (atomically).\n");
        return 0;
    }
    const char *dir = cli_opt(argc, argv, "--model"), *ids_path = cli_opt(argc, argv, "--ids");
    const char *out = cli_opt(argc, argv, "--out"), *name = cli_opt(argc, argv, "--name");
    int chunk;
    if (!dir || !ids_path || !out) return cli_usage_error("logits", "--model, --ids and --out are required");
    if (!cli_kda_chunk(argc, argv, &chunk)) return cli_usage_error("logits", "--kda must be 64, 16 or recurrent");
    const cli_device_opts dopt = cli_device_opts_get(argc, argv);
    if (cli_device_check("logits", &dopt)) return 2;
    k3c_err err = {0};
    k3c_model *m;
    cli_device dev = {0};
    int32_t *ids = NULL, *cu = NULL;
    int64_t B = 0, T = 0;
    if (k3c_model_load_dir_f32(dir, 0, &m, &err)) return cli_fail("logits", &err);
    k3c_model_set_kda_chunk(m, chunk);
    int rc = cli_device_open(&dopt, &dev, &err);
    if (!rc) rc = cli_device_use(&dev, m, &err);
    if (!rc) rc = k3c_st_read_ids(ids_path, name ? name : "input_ids", &ids, &B, &T, &err);
    k3c_arena arena = {0};
    if (!rc && !(cu = doc_offsets(B, T))) rc = k3c_errf(&err, K3C_ENOMEM, "out of memory");
    if (!rc) rc = k3c_model_arena_init_f32(m, k3c_model_plan_bytes_f32(m, B * T, (int)B), &arena, &err);
    k3c_model_batch b = {B * T, (int)B, ids, cu, NULL, 0, 0, NULL, NULL, NULL, NULL};
    k3c_acts *acts;
    float *logits;
    double loss;
    if (!rc) rc = k3c_model_forward_f32(m, &b, &arena, &acts, &loss, &logits, &err);
    size_t n = (size_t)(B * T * k3c_model_config(m)->vocab_size);
    float *host = rc ? NULL : malloc(sizeof(float) * n + 1);
    if (!rc && !host) rc = k3c_errf(&err, K3C_ENOMEM, "out of memory");
    if (!rc) rc = k3c_model_download_f32(m, host, logits, sizeof(float) * n, &err);
    if (!rc) rc = k3c_write_file_atomic(out, host, sizeof(float) * n, &err);
    free(host);
    if (!rc)
        printf("wrote %s: [%lld, %lld, %lld] float32 logits (mean next-token loss %.6f)\n", out, (long long)B,
               (long long)T, (long long)k3c_model_config(m)->vocab_size, loss);
    k3c_model_arena_free_f32(m, &arena);
    free(ids);
    free(cu);
    k3c_model_close_f32(m);
    cli_device_release(&dev);
    return rc ? cli_fail("logits", &err) : 0;
}

/* Prints the comparison (every gradient with verbose, else only failures); returns the number of failures. */
static int print_golden(const k3c_golden_report *r, int grads_ok, double tol_out, double tol_grad, int verbose) {
    int fails = 0;
    if (r->has_logits) {
        printf("%-64s rel %.3e %s\n", "logits", r->logits_rel, r->logits_rel <= tol_out ? "ok" : "FAIL");
        fails += !(r->logits_rel <= tol_out);
    }
    if (r->has_loss) {
        printf("%-64s rel %.3e %s (k3c %.8f, golden %.8f)\n", "loss", r->loss_rel,
               r->loss_rel <= tol_out ? "ok" : "FAIL", r->loss, r->loss_ref);
        fails += !(r->loss_rel <= tol_out);
    }
    if (!grads_ok) return fails;
    double worst = 0;
    for (int i = 0; i < r->n_rows; i++) {
        const k3c_golden_row *g = &r->rows[i];
        int zero = g->ref_norm == 0;
        int ok = zero ? g->abs_err <= 1e-6 : g->rel_err <= tol_grad;
        if (!zero && g->rel_err > worst) worst = g->rel_err;
        fails += !ok;
        if (verbose || !ok)
            printf("%-64s %s %.3e %s\n", g->name, zero ? "abs" : "rel", zero ? g->abs_err : g->rel_err,
                   ok ? "ok" : "FAIL");
    }
    printf("%d gradients compared, worst relative error %.3e (tolerance %.0e), %d failures\n", r->n_rows, worst,
           tol_grad, fails);
    return fails;
}

/* Forward + backward on the golden's input_ids (k3c_golden_check); prints the errors. Returns the exit code. */
static int golden_check(const char *dir, const char *gpath, int chunk, const cli_device_opts *dopt,
                        double tol_out, double tol_grad, int verbose, k3c_err *err) {
    k3c_model *m;
    cli_device dev = {0};
    if (k3c_model_load_dir_f32(dir, 1, &m, err)) return -1;
    k3c_model_set_kda_chunk(m, chunk);
    k3c_golden_report r = {.rows = calloc(4096, sizeof(k3c_golden_row)), .max_rows = 4096};
    int rc = cli_device_open(dopt, &dev, err);
    if (!rc) rc = cli_device_use(&dev, m, err);
    if (!rc && !r.rows) rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    if (!rc) rc = k3c_golden_check_f32(m, gpath, &r, err);
    int fails = print_golden(&r, !rc, tol_out, tol_grad, verbose);
    free(r.rows);
    k3c_model_close_f32(m);
    cli_device_release(&dev);
    return rc ? -1 : fails ? 1 : 0;
}

int cmd_golden_check(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        printf("usage: k3c golden-check --model DIR --golden FILE [--kda 64|16|recurrent] [--tol-out 1e-4]\n"
               "                        [--tol-grad 1e-3] [--device cpu|cuda] [--gemm fp32|tf32|bf16] [--kernels bf16|fp16|fp32] [--verbose]\n"
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
    if (!cli_kda_chunk(argc, argv, &chunk)) return cli_usage_error("golden-check", "--kda must be 64, 16 or recurrent");
    const cli_device_opts dopt = cli_device_opts_get(argc, argv);
    if (cli_device_check("golden-check", &dopt)) return 2;
    k3c_err err = {0};
    int rc = golden_check(dir, golden, chunk, &dopt, tol_out, tol_grad, cli_flag(argc, argv, "--verbose"), &err);
    if (rc < 0) return cli_fail("golden-check", &err);
    printf("%s\n", rc ? "golden-check: FAILED" : "golden-check: passed");
    return rc;
}

/* Streams each generated id: as text through the stop-string layer (whole characters only, specials not printed,
 * ending at --stop), or as ids. */
typedef struct {
    k3c_stopper stop; /* text mode: stop.tok set */
    int failed;
    k3c_err err;
    double t_first, t_last; /* when the first and the last id came (--timing) */
    int64_t n;              /* ids so far */
} gen_out;

static void print_text(void *ctx, const char *s, size_t n) {
    (void)ctx;
    fwrite(s, 1, n, stdout);
}

static int print_token(void *ctx, const k3c_sampled *t, int64_t i) {
    gen_out *g = ctx;
    int rc = 0;
    g->t_last = k3c_now();
    if (g->n++ == 0) g->t_first = g->t_last;
    if (!g->stop.tok)
        printf("%s%d", i ? " " : "", t->id);
    else if ((rc = k3c_stopper_feed(&g->stop, t->id, &g->err)) < 0)
        g->failed = 1;
    if (t->n_top > 0) { /* --logprobs N: the chosen id's logprob and the top N, one line on stderr */
        fprintf(stderr, "[%lld] id %d logprob %.6f top", (long long)i, t->id, t->logprob);
        for (int j = 0; j < t->n_top; j++) fprintf(stderr, " %d:%.6f", t->top_id[j], t->top_logprob[j]);
        fprintf(stderr, "\n");
    }
    fflush(stdout);
    return rc != 0;
}

/* Encodes --prompt with the directory's tokenizer (echoing it) or reads --ids; seq gets room for n more ids. */
static int generate_prompt(const k3c_serve *s, const char *prompt, const char *ids_path, const char *name, long long n,
                           int32_t **seq, int64_t *len, k3c_err *err) {
    int32_t *ids = NULL;
    int64_t B = 1, T = 0;
    int rc;
    if (prompt) {
        k3c_tok_ids v = {0};
        rc = k3c_tok_encode(s->tok, prompt, strlen(prompt), 0, &v, err);
        if (!rc && v.n == 0) rc = k3c_errf(err, K3C_EINVAL, "the prompt encodes to no tokens");
        ids = v.ids;
        T = (int64_t)v.n;
        if (!rc) printf("%s", prompt);
    } else {
        rc = k3c_st_read_ids(ids_path, name ? name : "prompt_ids", &ids, &B, &T, err);
    }
    *seq = rc ? NULL : malloc(sizeof(int32_t) * (size_t)(B * T + n));
    if (!rc && !*seq) rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    if (!rc) memcpy(*seq, ids, sizeof(int32_t) * (size_t)(B * T));
    *len = B * T; /* a [B, T] file is generated from as one sequence */
    free(ids);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        printf("usage: k3c generate --model DIR (--prompt TEXT | --ids FILE [--name prompt_ids])\n"
               "                    [--max-new N] [--greedy N] [--temperature T] [--top-p P] [--seed S]\n"
               "                    [--top-k K] [--min-p P] [--repetition-penalty R] [--presence-penalty A]\n"
               "                    [--frequency-penalty F] [--logprobs N] [--stop TEXT] [--timing]\n"
               "                    [--pattern cl100k|kimi] [--device cpu|cuda] [--gemm "
               "fp32|tf32|bf16] [--kernels bf16|fp16|fp32]\n"
               "--prompt encodes TEXT with the checkpoint's tokenizer (tiktoken.model) and prints the continuation;\n"
               "--ids reads I32 token ids from a safetensors file and prints the new ids. --greedy N = --max-new N\n"
               "--temperature 0. Sampling: temperature (default 0.8) and nucleus top-p (default 0.95), seeded;\n"
               "--top-k and --min-p cut further (0 = off); --repetition-penalty (Hugging Face, over prompt and\n"
               "output, 1 = off), --presence-penalty / --frequency-penalty (OpenAI, over the output, 0 = off).\n"
               "--logprobs N prints each token's logprob and the N most likely (raw model distribution) on stderr.\n"
               "--stop ends the text before TEXT (prompt mode). --timing prints on stderr the load time, the prompt's\n"
               "time to the first new id and the decode rate of the ids after it.\n"
               "The checkpoint is read as stored (mmap'd: bf16 / float32 matrices, MXFP4 experts, nothing converted).\n"
               "The inference engine keeps the decode state (docs/ENGINE.md: chunked KDA for the prompt on the CPU,\n"
               "the recurrence per new token); --device cuda uploads the weights as stored and runs the same engine on\n"
               "the GPU (state and latent cache in device memory, decode steps replayed as CUDA graphs, sampling on\n"
               "the host).\n");
        return 0;
    }
    const char *dir = cli_opt(argc, argv, "--model"), *ids_path = cli_opt(argc, argv, "--ids");
    const char *prompt = cli_opt(argc, argv, "--prompt"), *name = cli_opt(argc, argv, "--name");
    long long n, greedy, seed, top_k, logprobs;
    double temp, top_p, min_p, rep, pres, freq;
    if (!dir || (!ids_path == !prompt))
        return cli_usage_error("generate", "--model and one of --ids / --prompt are required");
    if (!cli_opt_int(argc, argv, "--max-new", 64, &n) || !cli_opt_int(argc, argv, "--greedy", -1, &greedy) ||
        !cli_opt_int(argc, argv, "--seed", 0, &seed) || !cli_opt_double(argc, argv, "--temperature", 0.8, &temp) ||
        !cli_opt_double(argc, argv, "--top-p", 0.95, &top_p) || !cli_opt_int(argc, argv, "--top-k", 0, &top_k) ||
        !cli_opt_int(argc, argv, "--logprobs", 0, &logprobs) || !cli_opt_double(argc, argv, "--min-p", 0, &min_p) ||
        !cli_opt_double(argc, argv, "--repetition-penalty", 1, &rep) ||
        !cli_opt_double(argc, argv, "--presence-penalty", 0, &pres) ||
        !cli_opt_double(argc, argv, "--frequency-penalty", 0, &freq))
        return 2;
    if (greedy >= 0) {
        n = greedy;
        temp = 0;
    }
    k3c_sampler smp = {.temperature = temp,
                       .top_p = top_p,
                       .seed = (uint64_t)seed,
                       .top_k = top_k,
                       .min_p = min_p,
                       .repetition_penalty = rep,
                       .presence_penalty = pres,
                       .frequency_penalty = freq,
                       .logprobs = (int)logprobs};
    k3c_err serr = {0};
    if (n < 0 || logprobs < 0 || logprobs > K3C_MAX_LOGPROBS)
        return cli_usage_error("generate", "need --max-new ≥ 0 and 0 ≤ --logprobs ≤ %d", K3C_MAX_LOGPROBS);
    if (k3c_sampler_check(&smp, &serr)) return cli_usage_error("generate", "%s", serr.msg);
    const cli_device_opts dopt = cli_device_opts_get(argc, argv);
    if (cli_device_check("generate", &dopt)) return 2;
    k3c_err err = {0};
    k3c_serve sv;
    cli_device dev = {0};
    const double t_open = k3c_now();
    if (k3c_serve_open(dir, prompt != NULL, cli_opt(argc, argv, "--pattern"), &sv, &err))
        return cli_fail("generate", &err);
    int32_t *seq = NULL;
    int64_t len = 0;
    int rc = cli_device_open(&dopt, &dev, &err);
    if (!rc) rc = k3c_serve_use_backend(&sv, dev.backend, &err);
    const double t_loaded = k3c_now();
    if (!rc) rc = generate_prompt(&sv, prompt, ids_path, name, n, &seq, &len, &err);
    gen_out out = {0};
    const char *stop = cli_opt(argc, argv, "--stop");
    if (!rc && sv.tok) rc = k3c_stopper_init(&out.stop, sv.tok, &stop, stop != NULL, 0, print_text, NULL, &err);
    k3c_gen_opts go = {.sampler = smp,
                       .max_new = n,
                       .stop_id = sv.tok ? k3c_tok_special_id(sv.tok, "<|endoftext|>") : -1,
                       .ctx = &out,
                       .on_sampled = print_token};
    const int64_t n_prompt = len;
    const double t_gen = k3c_now();
    if (!rc) rc = k3c_generate(sv.weights, seq, len, &go, &len, &err);
    if (!rc && out.failed) rc = (err = out.err).code;
    if (out.stop.tok) k3c_stopper_finish(&out.stop);
    k3c_stopper_free(&out.stop);
    if (!rc) printf("\n");
    if (!rc && cli_flag(argc, argv, "--timing")) {
        fflush(stdout);
        fprintf(stderr, "generate: load %.3f s", t_loaded - t_open);
        if (dev.backend)
            fprintf(stderr, " (%.1f MiB of weights in device memory, as stored)",
                    (double)k3c_weights_device_bytes(sv.weights) / (1 << 20));
        fprintf(stderr, "\n");
        if (out.n > 0)
            fprintf(stderr, "generate: prompt %lld ids, first new id after %.3f s\n", (long long)n_prompt,
                    out.t_first - t_gen);
        if (out.n > 1)
            fprintf(stderr, "generate: decode %lld ids in %.3f s = %.2f ids/s\n", (long long)(out.n - 1),
                    out.t_last - out.t_first, (double)(out.n - 1) / (out.t_last - out.t_first));
    }
    free(seq);
    k3c_serve_close(&sv);
    cli_device_release(&dev);
    return rc ? cli_fail("generate", &err) : 0;
}
