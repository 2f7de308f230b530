/* cmd_data.c — `k3c data prepare|info|peek`: tokenise text / JSONL corpora into K3CSHARD train / val shards, check a
 * prepared directory, and print its first documents. Spec: docs/TRAINING.md §7.1 (offline corpora), §2 (documents). */
#include "cli.h"

#include "k3c/train.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: k3c data prepare --vocab FILE [--pattern kimi|cl100k] --input PATH... --out DIR [--source NAME]\n"
        "                        [--format auto|text|jsonl] [--doc-split blank|file|line] [--jsonl-field text]\n"
        "                        [--eod SPELLING|none] [--val-fraction 0.01] [--shard-tokens N] [--seed S]\n"
        "                        [--threads N] [--progress] [--invalid-utf8 warn|error]\n"
        "       k3c data info DIR...\n"
        "       k3c data peek DIR [--split train|val] [--docs 3] [--vocab FILE [--pattern P]]\n\n"
        "prepare  reads files (a directory means every file below it, in name order; .gz is decompressed), cuts\n"
        "         them into documents (text: --doc-split blank = paragraphs between blank lines (default), file =\n"
        "         the whole file, line = every non-blank line; JSONL: one document per record, its --jsonl-field\n"
        "         string; --format auto picks JSONL for *.jsonl / *.ndjson), encodes each document and appends the\n"
        "         end-of-document special (--eod, default <|endoftext|> from VOCAB.specials.json), sends each\n"
        "         document to val with probability --val-fraction (deterministic in --seed), and writes\n"
        "         DIR/train-NNNNN.k3cshard, DIR/val-NNNNN.k3cshard (at most --shard-tokens tokens each, default\n"
        "         16M; documents are never split) and DIR/manifest.json. Documents that are not valid UTF-8 are\n"
        "         encoded byte by byte with a warning naming the first place (--invalid-utf8 warn, the default)\n"
        "         or refused (error).\n"
        "info     validates every shard of each DIR (checksums, offsets, token range) and prints the counts.\n"
        "peek     decodes the first documents of a split (with --vocab, else with the manifest's vocabulary).\n");
}

/* The values after every --input (each --input takes the arguments up to the next option). */
static int collect_inputs(int argc, char **argv, const char ***files) {
    int n = 0;
    *files = calloc((size_t)argc + 1, sizeof **files);
    for (int i = 1; *files && i < argc; i++) {
        if (strcmp(argv[i], "--input") != 0) continue;
        while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) (*files)[n++] = argv[++i];
    }
    return n;
}

typedef struct {
    k3c_progress bar;
    int64_t tokens;
} progress_ctx;

static void on_progress(void *ctx, int64_t done, int64_t total, int64_t tokens) {
    progress_ctx *p = ctx;
    p->bar.total = total;
    k3c_progress_update(&p->bar, done, (double)(tokens - p->tokens), NULL);
    p->tokens = tokens;
}

static int parse_prepare(int argc, char **argv, k3c_prepare_opts *o) {
    const char *cmd = "data prepare", *v;
    long long shard, seed, threads;
    k3c_err err = {0};
    o->vocab_path = cli_opt(argc, argv, "--vocab");
    o->out_dir = cli_opt(argc, argv, "--out");
    o->source = cli_opt(argc, argv, "--source");
    o->jsonl_field = cli_opt(argc, argv, "--jsonl-field");
    o->eod = cli_opt(argc, argv, "--eod");
    if (o->eod && strcmp(o->eod, "none") == 0) o->eod = "";
    if (!o->vocab_path || !o->out_dir || o->n_inputs == 0)
        return cli_usage_error(cmd, "needs --vocab, --input and --out");
    if ((v = cli_opt(argc, argv, "--pattern")) && k3c_tok_pattern_parse(v, &o->pattern) != K3C_OK)
        return cli_usage_error(cmd, "unknown --pattern '%s' (kimi, cl100k)", v);
    if ((v = cli_opt(argc, argv, "--format")) && k3c_data_format_parse(v, &o->format, &err) != K3C_OK)
        return cli_usage_error(cmd, "%s", err.msg);
    if ((v = cli_opt(argc, argv, "--doc-split")) && k3c_doc_split_parse(v, &o->doc_split, &err) != K3C_OK)
        return cli_usage_error(cmd, "%s", err.msg);
    if (!cli_opt_double(argc, argv, "--val-fraction", 0.01, &o->val_fraction) ||
        !cli_opt_int(argc, argv, "--shard-tokens", 16ll << 20, &shard) ||
        !cli_opt_int(argc, argv, "--seed", 0, &seed) || !cli_opt_int(argc, argv, "--threads", 0, &threads))
        return 2;
    if (!(o->val_fraction >= 0 && o->val_fraction <= 1))
        return cli_usage_error(cmd, "--val-fraction must be in [0, 1]");
    if (shard <= 0) return cli_usage_error(cmd, "--shard-tokens must be positive");
    if ((v = cli_opt(argc, argv, "--invalid-utf8")) && strcmp(v, "warn") != 0 && strcmp(v, "error") != 0)
        return cli_usage_error(cmd, "--invalid-utf8 takes warn or error");
    o->strict_utf8 = v && strcmp(v, "error") == 0;
    o->shard_tokens = shard;
    o->seed = (uint64_t)seed;
    if (threads > 0) k3c_set_num_threads((int)threads);
    return 0;
}

static int prepare(int argc, char **argv) {
    k3c_prepare_opts o = {.pattern = K3C_TOK_PATTERN_KIMI};
    const char **files;
    o.n_inputs = collect_inputs(argc, argv, &files);
    o.inputs = files;
    int ec = parse_prepare(argc, argv, &o);
    if (ec) {
        free(files);
        return ec;
    }
    progress_ctx pc = {0};
    k3c_progress_init(&pc.bar, "prepare", 1, "tok", stderr, cli_flag(argc, argv, "--progress"));
    o.progress = on_progress, o.progress_ctx = &pc;
    k3c_prepare_result r;
    k3c_err err = {0};
    int rc = k3c_data_prepare(&o, &r, &err);
    k3c_progress_finish(&pc.bar, NULL);
    free(files);
    if (rc) return cli_fail("data prepare", &err);
    printf("%d files, %.2f MB of text -> %lld documents, %lld tokens (%.2f bytes/token) in %.1f s (%.2f MB/s, %d "
           "threads)\n",
           r.n_files, (double)r.bytes / 1e6, (long long)(r.docs[0] + r.docs[1]), (long long)(r.tokens[0] + r.tokens[1]),
           (double)r.bytes / (double)(r.tokens[0] + r.tokens[1]), r.seconds,
           (double)r.bytes / 1e6 / (r.seconds > 0 ? r.seconds : 1e-9), k3c_num_threads());
    printf("train: %lld docs, %lld tokens, %d shards\nval:   %lld docs, %lld tokens, %d shards\n", (long long)r.docs[0],
           (long long)r.tokens[0], r.shards[0], (long long)r.docs[1], (long long)r.tokens[1], r.shards[1]);
    printf("vocab size %lld, end-of-document id %lld; wrote %s/manifest.json\n", (long long)r.vocab_size,
           (long long)r.eod_id, o.out_dir);
    if (r.invalid_utf8_docs)
        fprintf(stderr,
                "k3c data prepare: warning: %lld document%s not valid UTF-8 (encoded byte by byte), first at %s\n",
                (long long)r.invalid_utf8_docs, r.invalid_utf8_docs == 1 ? " is" : "s are", r.invalid_utf8_first);
    if (o.val_fraction > 0 && r.docs[1] == 0)
        fprintf(stderr, "k3c data prepare: warning: no validation documents (only one document in the corpus?)\n");
    return 0;
}

static int info(int argc, char **argv) {
    int n = 0;
    for (const char *dir; (dir = cli_positional(argc, argv, n, NULL)); n++) {
        k3c_err err = {0};
        k3c_shard_set *s[2] = {NULL, NULL};
        int rc = k3c_shard_set_open(dir, "train", &s[0], &err);
        if (!rc) rc = k3c_shard_set_open(dir, "val", &s[1], &err);
        if (!rc) {
            printf("%s: source %s, vocab %s (size %lld, eod %lld)\n", dir, s[0]->source, s[0]->vocab,
                   (long long)s[0]->vocab_size, (long long)s[0]->eod_id);
            for (int k = 0; k < 2; k++) {
                int64_t longest = 0;
                for (int64_t d = 0; d < s[k]->n_docs; d++) {
                    int64_t l = k3c_shard_set_doc_len(s[k], d);
                    longest = l > longest ? l : longest;
                }
                printf("  %-5s %d shards, %lld docs, %lld tokens, mean doc %.1f, longest %lld (all checksums ok)\n",
                       k ? "val" : "train", s[k]->n_shards, (long long)s[k]->n_docs, (long long)s[k]->n_tokens,
                       s[k]->n_docs ? (double)s[k]->n_tokens / (double)s[k]->n_docs : 0.0, (long long)longest);
            }
        }
        k3c_shard_set_close(s[0]);
        k3c_shard_set_close(s[1]);
        if (rc) return cli_fail("data info", &err);
    }
    return n ? 0 : cli_usage_error("data info", "needs a prepared directory");
}

static int peek_docs(const k3c_shard_set *s, const k3c_tok *t, long long ndocs, k3c_err *err) {
    int rc = K3C_OK;
    for (int64_t d = 0; d < s->n_docs && d < ndocs && !rc; d++) {
        int64_t len = k3c_shard_set_doc_len(s, d), local;
        const k3c_shard *sh;
        k3c_shard_set_locate(s, d, &sh, &local);
        int32_t *ids = malloc((size_t)(len + 1) * sizeof *ids);
        char *bytes = NULL;
        size_t n = 0;
        if (!ids) return k3c_errf(err, K3C_ENOMEM, "out of memory");
        k3c_shard_copy(sh, local, 0, len, ids);
        rc = k3c_tok_decode(t, ids, (size_t)len, &bytes, &n, err);
        if (!rc) printf("---- doc %lld: %lld tokens\n%.*s\n", (long long)d, (long long)len, (int)n, bytes);
        free(bytes);
        free(ids);
    }
    return rc;
}

static int peek(int argc, char **argv) {
    static const char *const vopts[] = {"--split", "--docs", "--vocab", "--pattern", NULL};
    const char *dir = cli_positional(argc, argv, 0, vopts), *split = cli_opt(argc, argv, "--split");
    const char *vocab = cli_opt(argc, argv, "--vocab"), *pat = cli_opt(argc, argv, "--pattern");
    long long ndocs;
    if (!dir) return cli_usage_error("data peek", "needs a prepared directory");
    if (!cli_opt_int(argc, argv, "--docs", 3, &ndocs)) return 2;
    k3c_err err = {0};
    k3c_shard_set *s = NULL;
    k3c_tok *t = NULL;
    k3c_tok_pattern p = K3C_TOK_PATTERN_KIMI;
    int rc = k3c_shard_set_open(dir, split ? split : "train", &s, &err);
    if (!rc && pat && k3c_tok_pattern_parse(pat, &p) != K3C_OK)
        rc = k3c_errf(&err, K3C_EINVAL, "unknown --pattern '%s'", pat);
    if (!rc) rc = k3c_tok_load_with_specials(vocab ? vocab : s->vocab, p, 0, &t, &err);
    if (!rc) rc = peek_docs(s, t, ndocs, &err);
    k3c_tok_free(t);
    k3c_shard_set_close(s);
    return rc ? cli_fail("data peek", &err) : 0;
}

int cmd_data(int argc, char **argv) {
    const char *sub = argc > 1 ? argv[1] : NULL;
    if (!sub || strcmp(sub, "-h") == 0 || strcmp(sub, "--help") == 0 || cli_wants_help(argc, argv)) {
        usage(stdout);
        return sub ? 0 : 2;
    }
    if (strcmp(sub, "prepare") == 0) return prepare(argc - 1, argv + 1);
    if (strcmp(sub, "info") == 0) return info(argc - 1, argv + 1);
    if (strcmp(sub, "peek") == 0) return peek(argc - 1, argv + 1);
    return cli_usage_error("data", "unknown subcommand '%s' (prepare, info, peek)", sub);
}
