/* cmd_tokenizer.c — `k3c tokenizer train|encode|decode|info`: learn a byte-level BPE in the tiktoken format, encode text
 * to ids and decode ids to bytes with a tiktoken vocabulary and its special tokens (docs/FORMATS.md §8). */
#include "cli.h"

#include "k3c/tok.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The trainer's default specials: a document separator first (id = vocab size), then K3's named chat/media tokens so
 * XTML (docs/FORMATS.md §9.2) can run on k3c's own models. */
static const char *const DEFAULT_SPECIALS =
    "<|endoftext|>,[BOS],[EOS],<|end_of_msg|>,<|open|>,<|close|>,<|sep|>,<|media_begin|>,<|media_content|>,"
    "<|media_end|>,<|media_pad|>,[UNK],[PAD]";

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: k3c tokenizer train --input FILE... --vocab-size N --out FILE [--pattern kimi|cl100k]\n"
        "                           [--specials a,b,...]\n"
        "       k3c tokenizer encode --vocab FILE [--pattern kimi|cl100k] [--specials-json FILE [--table NAME]]\n"
        "                           [--allow-special] [--chunking] [--invalid-utf8 warn|error|replace]\n"
        "                           (--text STR | --input FILE)\n"
        "       k3c tokenizer decode --vocab FILE [--specials-json FILE [--table NAME]] (--ids \"1 2 3\" | --input "
        "FILE)\n"
        "       k3c tokenizer info --vocab FILE [--specials-json FILE [--table NAME]]\n\n"
        "train   learns N ranks (the 256 bytes + N-256 merges) from the pre-tokenised corpus and writes FILE in the\n"
        "        tiktoken format (`base64(bytes) rank` per line) plus FILE.specials.json (spelling -> id); the\n"
        "        specials get ids N, N+1, ... (default: %s).\n"
        "encode  prints the ids, space-separated. Special-token spellings are plain text unless --allow-special.\n"
        "        Specials come from --specials-json (an object: \"id\": \"spelling\", \"id\": {\"content\": ...} or\n"
        "        \"spelling\": id; --table picks a nested object, e.g. kimi_k3), else from VOCAB.specials.json.\n"
        "        --chunking applies the Kimi release's 400k-character windows / 25k-character runs.\n"
        "        Text that is not valid UTF-8 is encoded byte by byte with a warning naming the first bad byte's\n"
        "        offset (--invalid-utf8 warn, the default), refused (error), or has each bad byte replaced by\n"
        "        U+FFFD first (replace).\n"
        "decode  writes the exact bytes of the ids (separated by spaces, commas or newlines) to stdout.\n"
        "--pattern defaults to kimi (K2/K3 pre-tokenisation); use cl100k for GPT-4's.\n",
        DEFAULT_SPECIALS);
}

/* The values after every --input (each --input takes the arguments up to the next option). */
static int collect_inputs(int argc, char **argv, const char ***files) {
    int n = 0;
    *files = calloc((size_t)argc, sizeof **files);
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--input=", 8) == 0) (*files)[n++] = argv[i] + 8;
        if (strcmp(argv[i], "--input") != 0) continue;
        while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) (*files)[n++] = argv[++i];
    }
    return n;
}

static int parse_pattern(int argc, char **argv, k3c_tok_pattern *pat) {
    const char *p = cli_opt(argc, argv, "--pattern");
    *pat = K3C_TOK_PATTERN_KIMI;
    return !p || k3c_tok_pattern_parse(p, pat) == K3C_OK;
}

static void on_progress(void *ctx, int32_t done, int32_t total) {
    k3c_progress_update(ctx, done, done, NULL);
    (void)total;
}

static int train(int argc, char **argv) {
    const char **files;
    int nf = collect_inputs(argc, argv, &files);
    const char *out = cli_opt(argc, argv, "--out");
    long long vs;
    k3c_tok_pattern pat;
    if (!cli_opt_int(argc, argv, "--vocab-size", 0, &vs)) {
        free(files);
        return 2;
    }
    if (nf == 0 || !out || vs <= 0) {
        free(files);
        return cli_usage_error("tokenizer train", "needs --input, --vocab-size and --out");
    }
    if (!parse_pattern(argc, argv, &pat)) {
        free(files);
        return cli_usage_error("tokenizer train", "unknown --pattern");
    }
    const char *sp = cli_opt(argc, argv, "--specials");
    char *splist = strdup(sp ? sp : DEFAULT_SPECIALS);
    const char *specials[1024];
    int nsp = 0;
    for (char *save = NULL, *tokn = strtok_r(splist, ",", &save); tokn && nsp < 1024; tokn = strtok_r(NULL, ",", &save))
        specials[nsp++] = tokn;
    char **texts = calloc((size_t)nf, sizeof *texts);
    size_t *lens = calloc((size_t)nf, sizeof *lens), total = 0;
    k3c_err err = {0};
    int rc = K3C_OK;
    for (int i = 0; i < nf && rc == K3C_OK; i++) {
        rc = k3c_read_file(files[i], &texts[i], &lens[i], &err);
        total += lens[i];
    }
    k3c_tok *t = NULL;
    double t0 = k3c_now();
    if (rc == K3C_OK) {
        k3c_progress prog;
        k3c_progress_init(&prog, "bpe merges", vs - 256, "merges", stderr, 0);
        k3c_tok_train_opts o = {.vocab_size = (int32_t)vs,
                                .pattern = pat,
                                .specials = specials,
                                .n_specials = nsp,
                                .progress = on_progress,
                                .progress_ctx = &prog};
        rc = k3c_tok_train((const char *const *)texts, lens, nf, &o, &t, &err);
        k3c_progress_finish(&prog, NULL);
    }
    if (rc == K3C_OK) rc = k3c_tok_save(t, out, &err);
    if (rc == K3C_OK) {
        printf("learned %d ranks (%d merges) from %zu bytes in %.1f s; pattern %s; wrote %s", k3c_tok_n_ranks(t),
               k3c_tok_n_ranks(t) - 256, total, k3c_now() - t0, k3c_tok_pattern_name(pat), out);
        if (nsp)
            printf(" and %s.specials.json (%s = %d ... vocab %d)", out, specials[0], k3c_tok_special_id(t, specials[0]),
                   k3c_tok_n_vocab(t));
        printf("\n");
        if (k3c_tok_n_ranks(t) < vs)
            fprintf(stderr, "k3c tokenizer train: warning: the corpus supports only %d ranks (no pair occurs twice)\n",
                    k3c_tok_n_ranks(t));
    }
    for (int i = 0; i < nf; i++) free(texts[i]);
    free(texts);
    free(lens);
    free(files);
    free(splist);
    k3c_tok_free(t);
    return rc == K3C_OK ? 0 : cli_fail("tokenizer train", &err);
}

/* Loads --vocab with --pattern and the special table (--specials-json, else VOCAB.specials.json when present). */
static int open_vocab(int argc, char **argv, const char *cmd, k3c_tok **t, k3c_err *err) {
    const char *vocab = cli_opt(argc, argv, "--vocab"), *sj = cli_opt(argc, argv, "--specials-json");
    k3c_tok_pattern pat;
    *t = NULL;
    if (!vocab) return cli_usage_error(cmd, "needs --vocab FILE");
    if (!parse_pattern(argc, argv, &pat)) return cli_usage_error(cmd, "unknown --pattern");
    int flags = cli_flag(argc, argv, "--allow-gaps") ? K3C_TOK_LOAD_ALLOW_GAPS : 0;
    int rc = sj ? k3c_tok_load(vocab, pat, flags, t, err) : k3c_tok_load_with_specials(vocab, pat, flags, t, err);
    if (rc == K3C_OK && sj) rc = k3c_tok_load_specials_json(*t, sj, cli_opt(argc, argv, "--table"), err);
    if (rc == K3C_OK) k3c_tok_set_release_chunking(*t, cli_flag(argc, argv, "--chunking"));
    if (rc != K3C_OK) {
        k3c_tok_free(*t);
        *t = NULL;
        return cli_fail(cmd, err);
    }
    return 0;
}

static int encode(int argc, char **argv) {
    k3c_err err = {0};
    k3c_tok *t;
    int ec = open_vocab(argc, argv, "tokenizer encode", &t, &err);
    if (ec) return ec;
    const char *text = cli_opt(argc, argv, "--text"), *in = cli_opt(argc, argv, "--input");
    char *data = NULL;
    size_t n = 0;
    int rc = K3C_OK;
    if (text)
        n = strlen(text);
    else if (in)
        rc = k3c_read_file(in, &data, &n, &err);
    else {
        k3c_tok_free(t);
        return cli_usage_error("tokenizer encode", "needs --text STR or --input FILE");
    }
    const char *mode = cli_opt(argc, argv, "--invalid-utf8");
    if (!mode) mode = "warn";
    if (strcmp(mode, "warn") != 0 && strcmp(mode, "error") != 0 && strcmp(mode, "replace") != 0) {
        free(data);
        k3c_tok_free(t);
        return cli_usage_error("tokenizer encode", "--invalid-utf8 takes warn, error or replace");
    }
    const char *src = text ? text : data;
    size_t bad = rc == K3C_OK ? k3c_utf8_check(src, n) : n;
    if (bad < n && strcmp(mode, "warn") == 0) {
        size_t count = 0;
        for (size_t i = bad; i < n; i = i + 1 + k3c_utf8_check(src + i + 1, n - i - 1)) count++;
        fprintf(stderr, "k3c tokenizer encode: warning: invalid UTF-8 at byte %zu (%zu invalid byte%s in all)\n", bad,
                count, count == 1 ? "" : "s");
    }
    char *fixed = NULL;
    if (bad < n && strcmp(mode, "replace") == 0 && (rc = k3c_utf8_replace(src, n, &fixed, &n, NULL, &err)) == K3C_OK)
        src = fixed;
    int flags = (cli_flag(argc, argv, "--allow-special") ? K3C_TOK_ALLOW_SPECIAL : 0) |
                (strcmp(mode, "error") == 0 ? K3C_TOK_STRICT_UTF8 : 0);
    k3c_tok_ids ids = {0};
    if (rc == K3C_OK) rc = k3c_tok_encode(t, src, n, flags, &ids, &err);
    free(fixed);
    for (size_t i = 0; rc == K3C_OK && i < ids.n; i++) printf(i ? " %d" : "%d", ids.ids[i]);
    if (rc == K3C_OK) printf("\n");
    k3c_tok_ids_free(&ids);
    free(data);
    k3c_tok_free(t);
    return rc == K3C_OK ? 0 : cli_fail("tokenizer encode", &err);
}

static int parse_ids(const char *s, k3c_tok_ids *ids, k3c_err *err) {
    while (*s) {
        if (strchr(" \t\r\n,[]", *s)) {
            s++;
            continue;
        }
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX) return k3c_errf(err, K3C_EINVAL, "bad token id near '%.20s'", s);
        if (k3c_tok_ids_push(ids, (int32_t)v) != K3C_OK) return k3c_errf(err, K3C_ENOMEM, "out of memory");
        s = end;
    }
    return K3C_OK;
}

static int decode(int argc, char **argv) {
    k3c_err err = {0};
    k3c_tok *t;
    int ec = open_vocab(argc, argv, "tokenizer decode", &t, &err);
    if (ec) return ec;
    const char *list = cli_opt(argc, argv, "--ids"), *in = cli_opt(argc, argv, "--input");
    char *data = NULL, *bytes = NULL;
    size_t n = 0;
    int rc = K3C_OK;
    if (!list && in)
        rc = k3c_read_file(in, &data, &n, &err);
    else if (!list) {
        k3c_tok_free(t);
        return cli_usage_error("tokenizer decode", "needs --ids LIST or --input FILE");
    }
    k3c_tok_ids ids = {0};
    if (rc == K3C_OK) rc = parse_ids(list ? list : data, &ids, &err);
    if (rc == K3C_OK) rc = k3c_tok_decode(t, ids.ids, ids.n, &bytes, &n, &err);
    if (rc == K3C_OK && fwrite(bytes, 1, n, stdout) != n) rc = k3c_errf(&err, K3C_EIO, "stdout: write failed");
    free(bytes);
    free(data);
    k3c_tok_ids_free(&ids);
    k3c_tok_free(t);
    return rc == K3C_OK ? 0 : cli_fail("tokenizer decode", &err);
}

static int info(int argc, char **argv) {
    k3c_err err = {0};
    k3c_tok *t;
    int ec = open_vocab(argc, argv, "tokenizer info", &t, &err);
    if (ec) return ec;
    printf("pattern %s\nranks %d\nspecials %d\nvocab size %d\n", k3c_tok_pattern_name(k3c_tok_get_pattern(t)),
           k3c_tok_n_ranks(t), k3c_tok_n_specials(t), k3c_tok_n_vocab(t));
    for (int i = 0; i < k3c_tok_n_specials(t); i++) {
        const char *s;
        size_t l;
        int32_t id;
        k3c_tok_special_at(t, i, &s, &l, &id);
        printf("  %d %.*s\n", id, (int)l, s);
    }
    k3c_tok_free(t);
    return 0;
}

int cmd_tokenizer(int argc, char **argv) {
    const char *sub = argc > 1 ? argv[1] : NULL;
    if (!sub || strcmp(sub, "-h") == 0 || strcmp(sub, "--help") == 0 || cli_wants_help(argc, argv)) {
        usage(stdout);
        return sub ? 0 : 2;
    }
    if (strcmp(sub, "train") == 0) return train(argc - 1, argv + 1);
    if (strcmp(sub, "encode") == 0) return encode(argc - 1, argv + 1);
    if (strcmp(sub, "decode") == 0) return decode(argc - 1, argv + 1);
    if (strcmp(sub, "info") == 0) return info(argc - 1, argv + 1);
    return cli_usage_error("tokenizer", "unknown subcommand '%s' (train, encode, decode, info)", sub);
}
