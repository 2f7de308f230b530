/* cmd_eval.c — `k3c eval`: a checkpoint's MQAR recall, needle-in-a-haystack accuracy and held-out loss by position on
 * the test split of the synthetic tasks, and `k3c eval data`, the byte-level training corpus of the tasks
 * (k3c/exp.h; docs/EXPERIMENTS.md "Evaluations"). */
#include "cli.h"

#include "k3c/exp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LIST 16

/* "--name a,b,c" → up to MAX_LIST numbers (def when absent); 0 on a bad list (printed). */
static int num_list(int argc, char **argv, const char *name, const char *def, double *out, int *n) {
    const char *v = cli_opt(argc, argv, name);
    char buf[512];
    snprintf(buf, sizeof buf, "%s", v ? v : def);
    *n = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *end;
        double x = strtod(tok, &end);
        if (*end || end == tok || *n == MAX_LIST || !isfinite(x)) {
            cli_usage_error("eval", "%s: '%s' is not a list of up to %d numbers", name, v ? v : def, MAX_LIST);
            return 0;
        }
        out[(*n)++] = x;
    }
    return *n > 0 || (cli_usage_error("eval", "%s: empty list", name), 0);
}

static void free_docs(k3c_task_doc *d, int64_t n) {
    for (int64_t i = 0; d && i < n; i++) k3c_task_doc_free(&d[i]);
    free(d);
}

/* kind 0 MQAR (a = pairs), 1 needle (a = length, depth), 2 filler (a = length): n documents of the test split. */
static k3c_task_doc *docs_of(int kind, int64_t a, double depth, uint64_t seed, int64_t n, k3c_err *err) {
    k3c_task_doc *d = calloc((size_t)(n > 0 ? n : 1), sizeof *d);
    int e = d ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "out of memory");
    for (int64_t i = 0; !e && i < n; i++)
        e = kind == 0   ? k3c_task_mqar((int)a, a / 2 > 0 ? (int)(a / 2) : 1, seed, K3C_SPLIT_TEST, i, &d[i], err)
            : kind == 1 ? k3c_task_needle(a, depth, seed, K3C_SPLIT_TEST, i, &d[i], err)
                        : k3c_task_filler(a, seed, K3C_SPLIT_TEST, i, &d[i], err);
    if (e) free_docs(d, n), d = NULL;
    return d;
}

static int eval_data(int argc, char **argv) {
    const char *out = cli_opt(argc, argv, "--out");
    if (!out) return cli_usage_error("eval", "data: --out DIR is required");
    long long docs, seed, pmin, pmax, nmin, nmax;
    double share, val;
    if (!cli_opt_int(argc, argv, "--docs", 20000, &docs) || !cli_opt_int(argc, argv, "--seed", 1, &seed) ||
        !cli_opt_int(argc, argv, "--pairs-min", 4, &pmin) || !cli_opt_int(argc, argv, "--pairs-max", 16, &pmax) ||
        !cli_opt_int(argc, argv, "--needle-min", 32, &nmin) || !cli_opt_int(argc, argv, "--needle-max", 128, &nmax) ||
        !cli_opt_double(argc, argv, "--mqar-share", 0.5, &share) || !cli_opt_double(argc, argv, "--val", 0.02, &val))
        return 2;
    k3c_task_data_opts o = {docs, (uint64_t)seed, (int)pmin, (int)pmax, nmin, nmax, share, val};
    k3c_err err = {0};
    if (k3c_task_write_data(out, &o, &err)) return cli_fail("eval", &err);
    printf("task corpus: %lld documents (%.0f%% MQAR) in %s/data, tokenizer %s/tok.tiktoken\n", docs, 100 * share, out,
           out);
    return 0;
}

static int eval_model(const char *task, int argc, char **argv) {
    const char *dir = cli_opt(argc, argv, "--model");
    if (!dir) return cli_usage_error("eval", "%s: --model CHECKPOINT is required", task);
    long long docs, seed, max_tokens, train_len;
    int chunk;
    if (!cli_opt_int(argc, argv, "--docs", 16, &docs) || !cli_opt_int(argc, argv, "--seed", 7, &seed) ||
        !cli_opt_int(argc, argv, "--max-tokens", 8192, &max_tokens) ||
        !cli_opt_int(argc, argv, "--train-len", 128, &train_len) || docs < 1 || train_len < 1)
        return 2;
    if (!cli_kda_chunk(argc, argv, &chunk)) return cli_usage_error("eval", "--kda must be 64, 16 or recurrent");
    double a[MAX_LIST], b[MAX_LIST];
    int na = 0, nb = 1;
    b[0] = 0;
    int ok = !strcmp(task, "mqar")     ? num_list(argc, argv, "--pairs", "4,8,16", a, &na)
             : !strcmp(task, "needle") ? num_list(argc, argv, "--lengths", "64,128,256", a, &na) &&
                                             num_list(argc, argv, "--depths", "0,0.25,0.5,0.75,1", b, &nb)
                                       : num_list(argc, argv, "--factors", "1,2,4,8,16", a, &na);
    if (!ok) return 2;
    k3c_err err = {0};
    k3c_model *m;
    if (k3c_model_load_dir_f32(dir, 0, &m, &err)) return cli_fail("eval", &err);
    k3c_model_set_kda_chunk(m, chunk);
    int rc = 0;
    if (!strcmp(task, "position")) {
        int64_t edge[MAX_LIST + 1] = {0};
        double loss[MAX_LIST];
        for (int i = 0; i < na && !rc; i++) {
            edge[i + 1] = (int64_t)a[i] * train_len;
            if (edge[i + 1] <= edge[i]) rc = cli_usage_error("eval", "--factors must be ascending and >= 1");
        }
        k3c_task_doc *d = rc ? NULL : docs_of(2, edge[na] + 1, 0, (uint64_t)seed, docs, &err);
        if (!rc && (!d || k3c_eval_position_loss(m, d, docs, edge, na, max_tokens, loss, &err)))
            rc = cli_fail("eval", &err);
        for (int i = 0; !rc && i < na; i++)
            printf("position: [%lld, %lld) (%gL): loss %.4f nats/token\n", (long long)edge[i], (long long)edge[i + 1],
                   a[i], loss[i]);
        free_docs(d, docs);
    }
    int64_t all_c = 0, all_t = 0;
    for (int i = 0; strcmp(task, "position") && i < na && !rc; i++)
        for (int j = 0; j < nb && !rc; j++) {
            const int mqar = !strcmp(task, "mqar");
            int64_t c, t;
            k3c_task_doc *d = docs_of(mqar ? 0 : 1, (int64_t)a[i], b[j], (uint64_t)seed, docs, &err);
            if (!d || k3c_eval_tasks(m, d, docs, max_tokens, &c, &t, &err))
                rc = cli_fail("eval", &err);
            else if (mqar)
                printf("mqar: %g pairs: recall %.4f (%lld of %lld queries)\n", a[i], (double)c / (double)t,
                       (long long)c, (long long)t);
            else
                printf("needle: length %g depth %g: accuracy %.4f (%lld of %lld)\n", a[i], b[j], (double)c / (double)t,
                       (long long)c, (long long)t);
            if (!rc) all_c += c, all_t += t;
            free_docs(d, docs);
        }
    if (!rc && all_t)
        printf("%s: overall %.4f (%lld of %lld)\n", task, (double)all_c / (double)all_t, (long long)all_c,
               (long long)all_t);
    k3c_model_close_f32(m);
    return rc;
}

int cmd_eval(int argc, char **argv) {
    const char *task = argc > 1 ? argv[1] : NULL;
    if (!task || cli_wants_help(argc, argv)) {
        printf("usage: k3c eval mqar     --model CKPT [--pairs 4,8,16] [--docs N] [--seed S]\n"
               "       k3c eval needle   --model CKPT [--lengths 64,128,256] [--depths 0,0.25,0.5,0.75,1] [--docs N]\n"
               "       k3c eval position --model CKPT --train-len L [--factors 1,2,4,8,16] [--docs N]\n"
               "       k3c eval data     --out DIR [--docs N] [--seed S] [--pairs-min 4] [--pairs-max 16]\n"
               "                         [--needle-min 32] [--needle-max 128] [--mqar-share 0.5] [--val 0.02]\n\n"
               "Evaluates a checkpoint on the test split of the synthetic tasks (documents generated by seed,\n"
               "disjoint from the train split; docs/EXPERIMENTS.md): multi-query associative recall (MQAR, Zoology)\n"
               "by number of key-value pairs, needle-in-a-haystack accuracy by length and depth, and the next-token\n"
               "loss by position on filler text in buckets [0, L), [L, 2L), ... (train at L, evaluate at 2L-16L).\n"
               "`eval data` writes the train split as a corpus: DIR/tok.tiktoken (bytes + <|endoftext|>) and the\n"
               "shards DIR/data for `k3c train`.\n"
               "  --kda 64|16|recurrent   the KDA algorithm (default 64);  --max-tokens N  tokens per batch (8192)\n");
        return task ? 0 : 2;
    }
    if (!strcmp(task, "data")) return eval_data(argc - 1, argv + 1);
    if (!strcmp(task, "mqar") || !strcmp(task, "needle") || !strcmp(task, "position"))
        return eval_model(task, argc - 1, argv + 1);
    return cli_usage_error("eval", "unknown task '%s' (mqar, needle, position, data)", task);
}
