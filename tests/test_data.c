/* test_data.c — the data pipeline (docs/TRAINING.md §2, §7.1): K3CSHARD round trips and every corruption error, `prepare`
 * on text / JSONL / .gz corpora with a tiny trained vocabulary, and the packed loader's invariants, determinism,
 * resume, mixtures and validation order. */
#include "test.h"

#include "train/data.h"

#include <sys/stat.h>

/* scratch paths are short (build/tmp/data.PID/...): snprintf truncation is not a concern here */
#pragma GCC diagnostic ignored "-Wformat-truncation"

/* ---------------------------------------------------------------- helpers */

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        CHECK(0, "cannot write %s", path);
        return;
    }
    if (fwrite(p, 1, n, f) != n) CHECK(0, "short write %s", path);
    fclose(f);
}
static void write_text(const char *path, const char *s) { write_bytes(path, s, strlen(s)); }

static char *slurp(const char *path, size_t *n) {
    char *b = NULL;
    k3c_err err = {0};
    if (k3c_read_file(path, &b, n, &err) != K3C_OK) CHECK(0, "%s", err.msg);
    return b;
}

/* Overwrites bytes at `off` and, when rehash, stores a fresh checksum: the shard then fails only on its contents. */
static void patch(const char *path, size_t off, const void *bytes, size_t n, int rehash) {
    size_t len;
    char *b = slurp(path, &len);
    if (!b) return;
    memcpy(b + off, bytes, n);
    if (rehash) {
        uint64_t h = k3c_fnv1a64(b, len - 8, K3C_FNV1A64_INIT);
        memcpy(b + len - 8, &h, 8);
    }
    write_bytes(path, b, len);
    free(b);
}

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* Synthetic tokens that name themselves: source * 1e6 + doc * 1000 + position (doc < 1000, position < 1000). */
#define SYN_VOCAB 10000000
static int32_t syn_tok(int src, int doc, int pos) { return src * 1000000 + doc * 1000 + pos; }
static int syn_src(int32_t t) { return t / 1000000; }
static int syn_doc(int32_t t) { return t % 1000000 / 1000; }
static int syn_pos(int32_t t) { return t % 1000; }

/* Writes a prepared directory by hand: train docs 0..n-1 (in two shards), val docs 900..900+nval-1. */
static void make_source(const char *dir, const char *name, int src, int n, const int *lens, int nval) {
    mkdir(dir, 0755);
    k3c_err err = {0};
    int64_t cnt[3][2] = {{0}};
    for (int part = 0; part < 3; part++) {
        int d0 = part == 0 ? 0 : part == 1 ? n / 2 : 900, d1 = part == 0 ? n / 2 : part == 1 ? n : 900 + nval;
        int32_t *tok = malloc(sizeof *tok * 1000 * (size_t)(d1 - d0 + 1));
        uint64_t *off = malloc(sizeof *off * (size_t)(d1 - d0 + 1));
        int64_t nt = 0;
        off[0] = 0;
        for (int d = d0; d < d1; d++) {
            int len = d >= 900 ? 1 + (d * 7) % 40 : lens[d];
            for (int p = 0; p < len; p++) tok[nt++] = syn_tok(src, d, p);
            off[d - d0 + 1] = (uint64_t)nt;
        }
        char path[512];
        snprintf(path, sizeof path, "%s/%s.k3cshard", dir, part == 0 ? "t0" : part == 1 ? "t1" : "v0");
        CHECK_OK(k3c_shard_write(path, tok, nt, off, d1 - d0, SYN_VOCAB, &err), &err);
        cnt[part][0] = d1 - d0, cnt[part][1] = nt;
        free(tok);
        free(off);
    }
    char m[2048], val[256] = "", path[512];
    if (nval)
        snprintf(val, sizeof val, "{\"file\": \"v0.k3cshard\", \"docs\": %lld, \"tokens\": %lld}", (long long)cnt[2][0],
                 (long long)cnt[2][1]);
    snprintf(m, sizeof m,
             "{\"format\": \"k3c-shards\", \"version\": 1, \"source\": \"%s\", \"vocab\": \"none\", \"vocab_size\": %d,"
             " \"eod_id\": -1, \"splits\": {\"train\": {\"shards\": [{\"file\": \"t0.k3cshard\", \"docs\": %lld, "
             "\"tokens\": %lld},"
             " {\"file\": \"t1.k3cshard\", \"docs\": %lld, \"tokens\": %lld}]}, \"val\": {\"shards\": [%s]}}}",
             name, SYN_VOCAB, (long long)cnt[0][0], (long long)cnt[0][1], (long long)cnt[1][0], (long long)cnt[1][1],
             val);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    write_text(path, m);
}

/* Packing invariants of one batch; returns the number of violations. */
/* synthetic: tokens from make_source, whose source ids are loader index + src_base */
static int batch_violations(const k3c_batch *b, int64_t S, int synthetic, int src_base) {
    int bad = 0;
    bad += b->cu_seqlens[0] != 0 || b->cu_seqlens[b->n_docs] != b->T || b->n_docs < 1;
    int ends = 0;
    for (int32_t i = 0; i < b->n_docs; i++) {
        int32_t a = b->cu_seqlens[i], e = b->cu_seqlens[i + 1];
        bad += !(e > a) || e - a > S;
        for (int32_t j = a; j < e; j++) {
            bad += j + 1 < e ? b->targets[j] != b->ids[j + 1] : b->targets[j] != -1;
            if (synthetic && j + 1 < e) bad += b->ids[j + 1] != b->ids[j] + 1; /* one document, in order */
            if (synthetic) bad += syn_src(b->ids[j]) - src_base != b->piece_source[i];
        }
    }
    for (int64_t j = 0; j < b->T; j++) ends += b->targets[j] == -1;
    bad += ends != b->n_docs; /* -1 exactly at piece ends */
    return bad;
}

static int batches_equal(const k3c_batch *a, const k3c_batch *b) {
    return a->T == b->T && a->n_docs == b->n_docs && !memcmp(a->ids, b->ids, sizeof *a->ids * (size_t)a->T) &&
           !memcmp(a->targets, b->targets, sizeof *a->targets * (size_t)a->T) &&
           !memcmp(a->cu_seqlens, b->cu_seqlens, sizeof *a->cu_seqlens * (size_t)(a->n_docs + 1));
}

/* ---------------------------------------------------------------- shards */

static void test_shard_roundtrip(const char *dir) {
    k3c_err err = {0};
    for (int wide = 0; wide < 2; wide++) {
        const int64_t vocab = wide ? 200000 : 1000;
        int32_t tok[500];
        uint64_t off[6] = {0, 100, 100, 250, 499, 500}; /* one empty document */
        for (int i = 0; i < 500; i++) tok[i] = (int32_t)((i * 7919 + 13) % vocab);
        char path[512];
        snprintf(path, sizeof path, "%s/rt%d.k3cshard", dir, wide);
        CHECK_OK(k3c_shard_write(path, tok, 500, off, 5, vocab, &err), &err);
        struct stat st;
        CHECK(stat(path, &st) == 0 && st.st_size == 64 + 8 * 6 + (wide ? 4 : 2) * 500 + 8, "shard size %lld",
              (long long)st.st_size);
        k3c_shard *s = NULL;
        CHECK_OK(k3c_shard_open(path, &s, &err), &err);
        if (!s) continue;
        CHECK(s->token_bytes == (wide ? 4u : 2u) && s->n_docs == 5 && s->n_tokens == 500 && s->vocab_size == vocab,
              "header %u %lld %lld", s->token_bytes, (long long)s->n_docs, (long long)s->n_tokens);
        int same = 1;
        for (int d = 0; d < 5; d++) {
            int32_t got[500];
            CHECK(k3c_shard_doc_len(s, d) == (int64_t)(off[d + 1] - off[d]), "doc %d length", d);
            k3c_shard_copy(s, d, 0, k3c_shard_doc_len(s, d), got);
            same &= !memcmp(got, tok + off[d], sizeof *got * (off[d + 1] - off[d]));
        }
        CHECK(same, "tokens read back differ (width %d)", wide ? 4 : 2);
        k3c_shard_close(s);
    }
    /* an empty shard is valid */
    uint64_t z = 0;
    char path[512];
    snprintf(path, sizeof path, "%s/empty.k3cshard", dir);
    CHECK_OK(k3c_shard_write(path, NULL, 0, &z, 0, 10, &err), &err);
    k3c_shard *s = NULL;
    CHECK_OK(k3c_shard_open(path, &s, &err), &err);
    CHECK(s && s->n_docs == 0 && s->n_tokens == 0, "empty shard");
    k3c_shard_close(s);
    /* the writer refuses what the reader would refuse */
    int32_t t[3] = {1, 2, 10};
    uint64_t o[2] = {0, 3}, ob[3] = {0, 2, 1};
    CHECK(k3c_shard_write(path, t, 3, o, 1, 10, &err) == K3C_EINVAL && contains(err.msg, "vocab size"), "%s", err.msg);
    CHECK(k3c_shard_write(path, t, 3, ob, 2, 100, &err) == K3C_EINVAL && contains(err.msg, "bad offsets"), "%s",
          err.msg);
}

/* Writes a valid 3-document shard of vocab 1000 and returns its path in buf. */
static const char *fresh_shard(const char *dir, const char *name, char *buf, size_t n) {
    int32_t tok[30];
    uint64_t off[4] = {0, 10, 25, 30};
    for (int i = 0; i < 30; i++) tok[i] = i * 30;
    snprintf(buf, n, "%s/%s.k3cshard", dir, name);
    k3c_err err = {0};
    CHECK_OK(k3c_shard_write(buf, tok, 30, off, 3, 1000, &err), &err);
    return buf;
}

static void expect_open_error(const char *path, const char *what, const char *label) {
    k3c_err err = {0};
    k3c_shard *s = NULL;
    int rc = k3c_shard_open(path, &s, &err);
    CHECK(rc == K3C_EFORMAT && s == NULL, "%s: rc %d", label, rc);
    CHECK(contains(err.msg, what) && contains(err.msg, path), "%s: message '%s' lacks '%s' or the path", label, err.msg,
          what);
    if (getenv("K3C_TEST_VERBOSE")) printf("  %s -> %s\n", label, err.msg);
}

static void test_shard_errors(const char *dir) {
    char p[512];
    const size_t tokens_at = 64 + 8 * 4;
    unsigned char x = 0x5a;
    fresh_shard(dir, "flip", p, sizeof p);
    patch(p, tokens_at + 7, &x, 1, 0); /* one flipped data byte */
    expect_open_error(p, "checksum mismatch", "flipped byte");
    fresh_shard(dir, "magic", p, sizeof p);
    patch(p, 0, "K3CSHARE", 8, 1);
    expect_open_error(p, "wrong magic", "wrong magic");
    fresh_shard(dir, "trunc", p, sizeof p);
    CHECK(truncate(p, 64 + 8 * 4 + 30) == 0, "truncate");
    expect_open_error(p, "truncated", "truncated file");
    CHECK(truncate(p, 20) == 0, "truncate");
    expect_open_error(p, "truncated", "truncated header");
    fresh_shard(dir, "long", p, sizeof p);
    {
        FILE *f = fopen(p, "ab");
        fputs("junk", f);
        fclose(f);
    }
    expect_open_error(p, "after the checksum", "trailing bytes");
    uint16_t big = 1000; /* = vocab */
    fresh_shard(dir, "vocab", p, sizeof p);
    patch(p, tokens_at + 2 * 12, &big, 2, 1);
    expect_open_error(p, ">= vocab size", "token >= vocab");
    uint64_t o = 26; /* doc 0 would end at 26, after doc 1's end 25 */
    fresh_shard(dir, "offs", p, sizeof p);
    patch(p, 64 + 8 * 1, &o, 8, 1);
    expect_open_error(p, "bad offsets", "non-monotone offsets");
    o = 29;
    fresh_shard(dir, "offend", p, sizeof p);
    patch(p, 64 + 8 * 3, &o, 8, 1);
    expect_open_error(p, "bad offsets", "last offset != n_tokens");
    uint32_t v = 2;
    fresh_shard(dir, "ver", p, sizeof p);
    patch(p, 8, &v, 4, 1);
    expect_open_error(p, "unsupported shard version", "version");
    uint64_t nd = 4;
    fresh_shard(dir, "ndocs", p, sizeof p);
    patch(p, 24, &nd, 8, 0);
    expect_open_error(p, "truncated", "header count vs file size");
    write_text(p, "");
    expect_open_error(p, "empty", "empty file");
}

/* ---------------------------------------------------------------- prepare */

static const char *const TEXT_A =
    "First paragraph line one.\nline two of the first.\n\n\nSecond paragraph here.\n  \t\n"
    "Third, with unicode: caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x8e\x89.\n";
static const char *const DOCS_A[] = {
    "First paragraph line one.\nline two of the first.", "Second paragraph here.",
    "Third, with unicode: caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x8e\x89."};
static const char *const TEXT_B =
    "{\"text\": \"Record one says hello.\", \"id\": 1}\n\n"
    "{\"id\": 2, \"text\": \"Record two:\\nhas a newline and \\\"quotes\\\" and \\u00e9.\"}\n"
    "{\"text\": \"\"}\n"
    "{\"text\": \"<|endoftext|> spelled inside text\"}\n";
static const char *const DOCS_B[] = {"Record one says hello.",
                                     "Record two:\nhas a newline and \"quotes\" and \xc3\xa9.",
                                     "<|endoftext|> spelled inside text"};

static int prep(const char *vocab, const char *const *inputs, int n, const char *out, int split, double val,
                uint64_t seed, int64_t shard_tokens, k3c_prepare_result *res, k3c_err *err) {
    k3c_prepare_opts o = {.vocab_path = vocab,
                          .pattern = K3C_TOK_PATTERN_KIMI,
                          .inputs = inputs,
                          .n_inputs = n,
                          .out_dir = out,
                          .doc_split = split,
                          .val_fraction = val,
                          .seed = seed,
                          .shard_tokens = shard_tokens};
    return k3c_data_prepare(&o, res, err);
}

/* Decodes document d of a split into a malloc'd string. */
static char *decode_doc(const k3c_shard_set *s, const k3c_tok *t, int64_t d, int32_t *last, int *n_eod, int32_t eod) {
    const k3c_shard *sh;
    int64_t local, len = k3c_shard_set_doc_len(s, d);
    k3c_shard_set_locate(s, d, &sh, &local);
    int32_t *ids = malloc(sizeof *ids * (size_t)(len + 1));
    k3c_shard_copy(sh, local, 0, len, ids);
    *last = len ? ids[len - 1] : -1;
    *n_eod = 0;
    for (int64_t i = 0; i < len; i++) *n_eod += ids[i] == eod;
    char *bytes = NULL;
    size_t n;
    k3c_err err = {0};
    CHECK_OK(k3c_tok_decode(t, ids, (size_t)len, &bytes, &n, &err), &err);
    free(ids);
    return bytes;
}

static k3c_tok *make_vocab(const char *dir, char *vocab, size_t n) {
    static const char *const specials[] = {"<|endoftext|>", "[PAD]"};
    char corpus[4096];
    snprintf(corpus, sizeof corpus, "%s%s%s the quick brown fox jumps over the lazy dog paragraph record", TEXT_A,
             TEXT_A, TEXT_B);
    const char *texts[] = {corpus};
    size_t lens[] = {strlen(corpus)};
    k3c_tok_train_opts o = {.vocab_size = 300, .pattern = K3C_TOK_PATTERN_KIMI, .specials = specials, .n_specials = 2};
    k3c_tok *t = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_tok_train(texts, lens, 1, &o, &t, &err), &err);
    snprintf(vocab, n, "%s/v300.tiktoken", dir);
    if (t) CHECK_OK(k3c_tok_save(t, vocab, &err), &err);
    k3c_tok_free(t);
    t = NULL;
    CHECK_OK(k3c_tok_load_with_specials(vocab, K3C_TOK_PATTERN_KIMI, 0, &t, &err), &err);
    return t;
}

/* Every document of the train split decodes to the expected text followed by the end-of-document spelling. */
static void check_docs(const char *out, const k3c_tok *t, const char *const *want, int n, const char *label) {
    k3c_err err = {0};
    k3c_shard_set *s = NULL;
    CHECK_OK(k3c_shard_set_open(out, "train", &s, &err), &err);
    if (!s) return;
    int32_t eod = k3c_tok_special_id(t, "<|endoftext|>");
    CHECK(s->n_docs == n && s->eod_id == eod && s->vocab_size == k3c_tok_n_vocab(t),
          "%s: %lld docs (want %d), eod %lld", label, (long long)s->n_docs, n, (long long)s->eod_id);
    for (int64_t d = 0; d < s->n_docs && d < n; d++) {
        int32_t last;
        int n_eod;
        char *got = decode_doc(s, t, d, &last, &n_eod, eod), expect[512];
        snprintf(expect, sizeof expect, "%s<|endoftext|>", want[d]);
        CHECK(got && strcmp(got, expect) == 0, "%s: doc %lld = '%s', want '%s'", label, (long long)d, got ? got : "",
              expect);
        CHECK(last == eod && n_eod == 1, "%s: doc %lld: end token %d, %d end tokens", label, (long long)d, last, n_eod);
        free(got);
    }
    k3c_shard_set_close(s);
}

static int files_equal(const char *a, const char *b) {
    size_t na, nb;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    int eq = x && y && na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return eq;
}

static void test_prepare_roundtrip(const char *dir, const char *vocab, const k3c_tok *t) {
    char a[512], b[512], gz[512], out[512], cmd[2048];
    snprintf(a, sizeof a, "%s/corpus/a.txt", dir);
    snprintf(b, sizeof b, "%s/corpus/b.jsonl", dir);
    snprintf(gz, sizeof gz, "%s/a2.txt.gz", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/corpus", dir);
    CHECK(system(cmd) == 0, "mkdir");
    write_text(a, TEXT_A);
    write_text(b, TEXT_B);
    snprintf(cmd, sizeof cmd, "gzip -c %s > %s", a, gz);
    CHECK(system(cmd) == 0, "gzip");
    k3c_err err = {0};
    k3c_prepare_result r;
    const char *both[] = {a, b};
    snprintf(out, sizeof out, "%s/p_ab", dir);
    CHECK_OK(prep(vocab, both, 2, out, K3C_DOC_SPLIT_BLANK, 0, 0, 0, &r, &err), &err);
    CHECK(r.docs[0] == 6 && r.docs[1] == 0 && r.shards[0] == 1 && r.n_files == 2, "prepare counts %lld %lld",
          (long long)r.docs[0], (long long)r.docs[1]);
    const char *all[] = {DOCS_A[0], DOCS_A[1], DOCS_A[2], DOCS_B[0], DOCS_B[1], DOCS_B[2]};
    check_docs(out, t, all, 6, "text + jsonl");
    /* the ids are exactly the tokenizer's encoding of the document, then the end token */
    k3c_tok_ids ids = {0};
    CHECK_OK(k3c_tok_encode(t, DOCS_A[2], strlen(DOCS_A[2]), 0, &ids, &err), &err);
    k3c_shard_set *s = NULL;
    CHECK_OK(k3c_shard_set_open(out, "train", &s, &err), &err);
    if (s) {
        int32_t got[512];
        int64_t len = k3c_shard_set_doc_len(s, 2);
        k3c_shard_copy(s->shards[0], 2, 0, len, got);
        CHECK(len == (int64_t)ids.n + 1 && !memcmp(got, ids.ids, ids.n * sizeof *got), "doc 2 ids differ from encode");
        k3c_shard_set_close(s);
    }
    k3c_tok_ids_free(&ids);
    /* a directory input = its files in name order; .gz = the same text */
    char cdir[512], out2[512], s1[600], s2[600];
    snprintf(cdir, sizeof cdir, "%s/corpus", dir);
    const char *d1[] = {cdir};
    snprintf(out2, sizeof out2, "%s/p_dir", dir);
    CHECK_OK(prep(vocab, d1, 1, out2, K3C_DOC_SPLIT_BLANK, 0, 0, 0, &r, &err), &err);
    snprintf(s1, sizeof s1, "%s/train-00000.k3cshard", out);
    snprintf(s2, sizeof s2, "%s/train-00000.k3cshard", out2);
    CHECK(files_equal(s1, s2), "directory input differs from the explicit file list");
    CHECK_OK(prep(vocab, d1, 1, out2, K3C_DOC_SPLIT_BLANK, 0, 0, 10, &r, &err), &err);
    CHECK(r.shards[0] > 2, "10-token shards: %d", r.shards[0]);
    const char *g1[] = {gz};
    CHECK_OK(prep(vocab, g1, 1, out2, K3C_DOC_SPLIT_BLANK, 0, 0, 0, &r, &err), &err);
    check_docs(out2, t, DOCS_A, 3, ".gz input");
    snprintf(s2, sizeof s2, "%s/train-00001.k3cshard", out2);
    CHECK(access(s2, F_OK) != 0, "stale shard of the earlier run not removed");
    /* other document splits */
    const char *a1[] = {a};
    CHECK_OK(prep(vocab, a1, 1, out2, K3C_DOC_SPLIT_LINE, 0, 0, 0, &r, &err), &err);
    static const char *const lines[] = {
        "First paragraph line one.", "line two of the first.", "Second paragraph here.",
        "Third, with unicode: caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x8e\x89."};
    check_docs(out2, t, lines, 4, "doc-split line");
    CHECK_OK(prep(vocab, a1, 1, out2, K3C_DOC_SPLIT_FILE, 0, 0, 0, &r, &err), &err);
    const char *whole[] = {TEXT_A};
    check_docs(out2, t, whole, 1, "doc-split file");
}

/* Bit k set = "paragraph number k" is in the val split. */
static uint64_t val_set(const char *out, const k3c_tok *t) {
    k3c_err err = {0};
    k3c_shard_set *s = NULL;
    uint64_t m = 0;
    CHECK_OK(k3c_shard_set_open(out, "val", &s, &err), &err);
    for (int64_t d = 0; s && d < s->n_docs; d++) {
        int32_t last;
        int ne, k = -1;
        char *txt = decode_doc(s, t, d, &last, &ne, -1);
        if (txt && sscanf(txt, "paragraph number %d", &k) == 1 && k >= 0 && k < 64) m |= 1ull << k;
        free(txt);
    }
    k3c_shard_set_close(s);
    return m;
}

static void test_prepare_split(const char *dir, const char *vocab, const k3c_tok *t) {
    char big[512], text[8192] = "";
    snprintf(big, sizeof big, "%s/paras.txt", dir);
    for (int i = 0; i < 60; i++)
        snprintf(text + strlen(text), sizeof text - strlen(text), "paragraph number %d of the corpus\n\n", i);
    write_text(big, text);
    const char *in[] = {big};
    char o1[512], o2[512], o3[512], f1[700], f2[700];
    snprintf(o1, sizeof o1, "%s/s1", dir);
    snprintf(o2, sizeof o2, "%s/s2", dir);
    snprintf(o3, sizeof o3, "%s/s3", dir);
    k3c_err err = {0};
    k3c_prepare_result r1, r2, r3;
    CHECK_OK(prep(vocab, in, 1, o1, K3C_DOC_SPLIT_BLANK, 0.25, 7, 40, &r1, &err), &err);
    CHECK_OK(prep(vocab, in, 1, o2, K3C_DOC_SPLIT_BLANK, 0.25, 7, 40, &r2, &err), &err);
    CHECK_OK(prep(vocab, in, 1, o3, K3C_DOC_SPLIT_BLANK, 0.25, 8, 40, &r3, &err), &err);
    CHECK(r1.docs[0] + r1.docs[1] == 60 && r1.docs[1] >= 5 && r1.docs[1] <= 30, "split %lld / %lld",
          (long long)r1.docs[0], (long long)r1.docs[1]);
    CHECK(r1.shards[0] > 3, "shard_tokens 40 should give several train shards, got %d", r1.shards[0]);
    snprintf(f1, sizeof f1, "%s/train-00003.k3cshard", o1);
    snprintf(f2, sizeof f2, "%s/train-00003.k3cshard", o2);
    uint64_t v1 = val_set(o1, t), v2 = val_set(o2, t), v3 = val_set(o3, t);
    CHECK(files_equal(f1, f2) && r1.docs[1] == r2.docs[1] && v1 == v2, "same seed, different split");
    CHECK(v1 != v3 && v3 != 0, "different seed, same val split");
    /* the shards do not depend on the thread count */
    int threads = k3c_num_threads();
    k3c_set_num_threads(1);
    CHECK_OK(prep(vocab, in, 1, o2, K3C_DOC_SPLIT_BLANK, 0.25, 7, 40, &r2, &err), &err);
    k3c_set_num_threads(threads);
    CHECK(files_equal(f1, f2) && val_set(o2, t) == v1, "1 thread vs %d threads: different shards", threads);
    /* every paragraph exactly once across train and val, in corpus order within each split; no shard past 40 tokens */
    int seen[60] = {0}, order_ok = 1, small = 1;
    int32_t eod = k3c_tok_special_id(t, "<|endoftext|>");
    for (int v = 0; v < 2; v++) {
        k3c_shard_set *s = NULL;
        CHECK_OK(k3c_shard_set_open(o1, v ? "val" : "train", &s, &err), &err);
        if (!s) continue;
        int prev = -1;
        for (int i = 0; i < s->n_shards; i++) small &= s->shards[i]->n_tokens <= 40 || s->shards[i]->n_docs == 1;
        for (int64_t d = 0; d < s->n_docs; d++) {
            int32_t last;
            int ne, k = -1;
            char *txt = decode_doc(s, t, d, &last, &ne, eod);
            if (txt && sscanf(txt, "paragraph number %d", &k) == 1 && k >= 0 && k < 60) seen[k]++;
            order_ok &= k > prev;
            prev = k;
            free(txt);
        }
        k3c_shard_set_close(s);
    }
    int once = 1;
    for (int i = 0; i < 60; i++) once &= seen[i] == 1;
    CHECK(once && order_ok && small, "split: each document once %d, in order %d, shards <= 40 tokens %d", once,
          order_ok, small);
    /* one document but val wanted: nothing to move, no val */
    char one[512];
    snprintf(one, sizeof one, "%s/one.txt", dir);
    write_text(one, "only one document");
    const char *i1[] = {one};
    CHECK_OK(prep(vocab, i1, 1, o3, K3C_DOC_SPLIT_BLANK, 0.5, 1, 0, &r3, &err), &err);
    CHECK(r3.docs[0] + r3.docs[1] == 1, "one document");
    /* two documents and a tiny fraction: the last document is moved to val */
    write_text(one, "first\n\nsecond");
    CHECK_OK(prep(vocab, i1, 1, o3, K3C_DOC_SPLIT_BLANK, 1e-9, 1, 0, &r3, &err), &err);
    CHECK(r3.docs[0] == 1 && r3.docs[1] == 1, "val guaranteed: %lld / %lld", (long long)r3.docs[0],
          (long long)r3.docs[1]);
}

/* Invalid UTF-8 is counted with its place (file offset for text, line and text offset for JSONL) or refused. */
static void test_prepare_utf8(const char *dir, const char *vocab) {
    char f[512], out[512];
    snprintf(out, sizeof out, "%s/putf8", dir);
    k3c_err err = {0};
    k3c_prepare_result r;
    const char *in[] = {f};
    snprintf(f, sizeof f, "%s/latin1.txt", dir);
    write_text(f, "fine text\n\ncaf\xe9 au lait\n\nmore \xff\xfe\n");
    CHECK_OK(prep(vocab, in, 1, out, 0, 0, 0, 0, &r, &err), &err);
    CHECK(r.invalid_utf8_docs == 2 && contains(r.invalid_utf8_first, "latin1.txt: byte 14"), "%lld docs, first at %s",
          (long long)r.invalid_utf8_docs, r.invalid_utf8_first);
    k3c_prepare_opts o = {
        .vocab_path = vocab, .inputs = in, .n_inputs = 1, .out_dir = out, .eod = "", .strict_utf8 = 1};
    CHECK(k3c_data_prepare(&o, &r, &err) == K3C_EFORMAT && contains(err.msg, "latin1.txt: byte 14"), "strict: %s",
          err.msg);
    snprintf(f, sizeof f, "%s/ok.jsonl", dir);
    write_text(f, "{\"text\": \"caf\\u00e9\"}\n");
    o.strict_utf8 = 1;
    CHECK_OK(k3c_data_prepare(&o, &r, &err), &err);
    CHECK(r.invalid_utf8_docs == 0, "valid JSONL counted as invalid");
}

static void test_prepare_errors(const char *dir, const char *vocab, const k3c_tok *t) {
    char f[512], out[512];
    snprintf(out, sizeof out, "%s/perr", dir);
    k3c_err err = {0};
    k3c_prepare_result r;
    const char *in[] = {f};
    snprintf(f, sizeof f, "%s/nofield.jsonl", dir);
    write_text(f, "{\"body\": \"x\"}\n");
    CHECK(prep(vocab, in, 1, out, 0, 0, 0, 0, &r, &err) == K3C_EFORMAT && contains(err.msg, "nofield.jsonl:1") &&
              contains(err.msg, "\"text\""),
          "%s", err.msg);
    snprintf(f, sizeof f, "%s/badjson.jsonl", dir);
    write_text(f, "{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n");
    CHECK(prep(vocab, in, 1, out, 0, 0, 0, 0, &r, &err) == K3C_EFORMAT && contains(err.msg, "badjson.jsonl:2"), "%s",
          err.msg);
    snprintf(f, sizeof f, "%s/bad.gz", dir);
    write_bytes(f, "\x1f\x8b\x08\x00garbage-not-deflate", 24);
    CHECK(prep(vocab, in, 1, out, 0, 0, 0, 0, &r, &err) != K3C_OK && contains(err.msg, "gzip") &&
              contains(err.msg, "bad.gz"),
          "%s", err.msg);
    snprintf(f, sizeof f, "%s/missing.txt", dir);
    CHECK(prep(vocab, in, 1, out, 0, 0, 0, 0, &r, &err) == K3C_EIO && contains(err.msg, "missing.txt"), "%s", err.msg);
    snprintf(f, sizeof f, "%s/blank.txt", dir);
    write_text(f, "\n  \n\n");
    CHECK(prep(vocab, in, 1, out, 0, 0, 0, 0, &r, &err) == K3C_ENOTFOUND, "no documents: %s", err.msg);
    write_text(f, "text");
    k3c_prepare_opts o = {.vocab_path = vocab, .inputs = in, .n_inputs = 1, .out_dir = out, .eod = "<|nope|>"};
    CHECK(k3c_data_prepare(&o, &r, &err) == K3C_ENOTFOUND && contains(err.msg, "<|nope|>"), "%s", err.msg);
    o.eod = "";
    CHECK_OK(k3c_data_prepare(&o, &r, &err), &err);
    k3c_tok_ids ids = {0};
    CHECK_OK(k3c_tok_encode(t, "text", 4, 0, &ids, &err), &err);
    CHECK(r.eod_id == -1 && r.tokens[0] == (int64_t)ids.n, "--eod none: %lld tokens for 'text'",
          (long long)r.tokens[0]);
    k3c_tok_ids_free(&ids);
}

/* ---------------------------------------------------------------- loader */

static int lens_a[200], lens_b[20], lens_small[400];

static void make_sources(const char *dir) {
    char p[512];
    for (int i = 0; i < 200; i++) lens_a[i] = 1 + (i * 37 + 11) % 300;
    for (int i = 0; i < 20; i++) lens_b[i] = 5 + (i * 13) % 50;
    for (int i = 0; i < 400; i++) lens_small[i] = 1 + i % 4;
    snprintf(p, sizeof p, "%s/srcA", dir);
    make_source(p, "A", 1, 200, lens_a, 30);
    snprintf(p, sizeof p, "%s/srcB", dir);
    make_source(p, "B", 2, 20, lens_b, 5);
    snprintf(p, sizeof p, "%s/srcC", dir);
    make_source(p, "C", 3, 400, lens_small, 0);
    snprintf(p, sizeof p, "%s/srcD", dir);
    make_source(p, "D", 4, 400, lens_small, 0);
}

static k3c_loader *open_loader(const char *dir, const char *names, const double *w, uint64_t seed) {
    k3c_data_source src[4];
    static char paths[4][512];
    int n = 0;
    for (const char *c = names; *c; c++, n++) {
        snprintf(paths[n], sizeof paths[n], "%s/src%c", dir, *c);
        src[n] = (k3c_data_source){NULL, paths[n]};
    }
    k3c_loader *ld = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_loader_open(src, n, w, seed, &ld, &err), &err);
    return ld;
}

static void test_loader_packing(const char *dir) {
    k3c_loader *ld = open_loader(dir, "A", NULL, 42);
    if (!ld) return;
    k3c_err err = {0};
    k3c_batch b;
    const int64_t T = 256, S = 64;
    CHECK_OK(k3c_batch_alloc(&b, T, &err), &err);
    int64_t total = k3c_loader_split(ld, 0, 0)->n_tokens, got = 0;
    int32_t *stream = malloc(sizeof *stream * (size_t)(total + T));
    int bad = 0, steps = 0, maximal = 1;
    while (got < total + 3 * T) { /* one epoch and a bit of the next */
        CHECK_OK(k3c_loader_next(ld, S, &b, &err), &err);
        bad += batch_violations(&b, S, 1, 1);
        for (int32_t i = 0; i < b.n_docs; i++) { /* a piece ends at its document's end, at S, or at the step's end */
            int32_t e = b.cu_seqlens[i + 1], last = b.ids[e - 1];
            maximal &= syn_pos(last) == lens_a[syn_doc(last)] - 1 || e - b.cu_seqlens[i] == S || i == b.n_docs - 1;
        }
        for (int64_t i = 0; i < T && got < total; i++) stream[got++] = b.ids[i];
        if (got >= total) got += T; /* count past the epoch without storing */
        steps++;
    }
    CHECK(bad == 0, "%d packing violations over %d steps", bad, steps);
    CHECK(maximal, "a piece ended early");
    /* the first epoch: every (doc, position) once, documents whole and in one shuffled order */
    unsigned char *seen = calloc(200 * 1000, 1);
    int once = 1, whole = 1, shuffled = 0, prev_doc = -1;
    for (int64_t i = 0; i < total; i++) {
        int d = syn_doc(stream[i]), p = syn_pos(stream[i]);
        once &= seen[d * 1000 + p]++ == 0;
        if (p != 0)
            whole &= i > 0 && stream[i] == stream[i - 1] + 1;
        else {
            whole &= i == 0 || syn_pos(stream[i - 1]) == lens_a[syn_doc(stream[i - 1])] - 1;
            shuffled |= prev_doc >= 0 && d != prev_doc + 1;
            prev_doc = d;
        }
    }
    for (int d = 0; d < 200; d++)
        for (int p = 0; p < lens_a[d]; p++) once &= seen[d * 1000 + p] == 1;
    CHECK(once && whole && shuffled, "epoch: every token once %d, documents whole %d, shuffled %d", once, whole,
          shuffled);
    k3c_loader_state st;
    k3c_loader_get_state(ld, &st);
    CHECK(st.cursor[0].epoch == 1 && st.steps == steps && st.tokens == steps * T, "epoch %lld steps %lld",
          (long long)st.cursor[0].epoch, (long long)st.steps);
    /* S = 1: every token its own piece; T = 1 works */
    k3c_batch b1;
    CHECK_OK(k3c_batch_alloc(&b1, 1, &err), &err);
    CHECK_OK(k3c_loader_next(ld, 1, &b1, &err), &err);
    CHECK(b1.n_docs == 1 && b1.targets[0] == -1, "T = 1");
    CHECK_OK(k3c_loader_next(ld, 1, &b, &err), &err);
    CHECK(b.n_docs == T && batch_violations(&b, 1, 1, 1) == 0, "S = 1: %d pieces", b.n_docs);
    CHECK(k3c_loader_next(ld, 0, &b, &err) == K3C_EINVAL, "S = 0 accepted");
    k3c_batch_free(&b1);
    CHECK(k3c_batch_alloc(&b1, 0, &err) == K3C_EINVAL, "T = 0 accepted");
    free(seen);
    free(stream);
    k3c_batch_free(&b);
    k3c_loader_close(ld);
}

/* Runs n steps and returns the batches (n allocated batches). */
static k3c_batch *run_steps(k3c_loader *ld, int n, int64_t T, int64_t S) {
    k3c_batch *bs = calloc((size_t)n, sizeof *bs);
    k3c_err err = {0};
    for (int i = 0; i < n; i++) {
        CHECK_OK(k3c_batch_alloc(&bs[i], T, &err), &err);
        CHECK_OK(k3c_loader_next(ld, S, &bs[i], &err), &err);
    }
    return bs;
}

static int same_runs(const k3c_batch *a, const k3c_batch *b, int n) {
    int eq = 1;
    for (int i = 0; i < n; i++) eq &= batches_equal(&a[i], &b[i]);
    return eq;
}

static void free_runs(k3c_batch *bs, int n) {
    for (int i = 0; i < n; i++) k3c_batch_free(&bs[i]);
    free(bs);
}

static void test_loader_resume(const char *dir) {
    const double w[2] = {0.5, 0.5};
    const int64_t T = 100, S = 32;
    enum { N = 80 };
    k3c_loader *l1 = open_loader(dir, "AB", w, 5), *l2 = open_loader(dir, "AB", w, 5),
               *l3 = open_loader(dir, "AB", w, 6);
    if (!l1 || !l2 || !l3) return;
    k3c_batch *r1 = run_steps(l1, N, T, S), *r2 = run_steps(l2, N, T, S), *r3 = run_steps(l3, 3, T, S);
    CHECK(same_runs(r1, r2, N), "same seed, different batches");
    CHECK(!same_runs(r1, r3, 3), "different seed, same batches");
    free_runs(r2, N);
    free_runs(r3, 3);
    k3c_loader_close(l1);
    k3c_loader_close(l2);
    k3c_loader_close(l3);
    /* interrupt after k steps, in the middle of a document */
    k3c_loader *a = open_loader(dir, "AB", w, 5);
    k3c_err err = {0};
    k3c_loader_state st;
    k3c_batch b;
    CHECK_OK(k3c_batch_alloc(&b, T, &err), &err);
    int k = 0;
    do {
        CHECK_OK(k3c_loader_next(a, S, &b, &err), &err);
        k3c_loader_get_state(a, &st);
        k++;
    } while (st.cur_source < 0 && k < 20);
    CHECK(st.cur_source >= 0 && st.cursor[st.cur_source].offset > 0, "no mid-document state within 20 steps");
    char *json = NULL;
    CHECK_OK(k3c_loader_state_to_json(a, &json, &err), &err);
    if (getenv("K3C_TEST_VERBOSE")) printf("  state after %d steps: %s\n", k, json ? json : "");
    unsigned char bytes[sizeof st];
    memcpy(bytes, &st, sizeof st);
    k3c_loader *fb = open_loader(dir, "AB", w, 999), *fj = open_loader(dir, "AB", NULL, 5); /* state wins over both */
    k3c_loader_state st2;
    memcpy(&st2, bytes, sizeof st2);
    CHECK_OK(k3c_loader_set_state(fb, &st2, &err), &err);
    CHECK_OK(k3c_loader_set_weights(fj, w, &err), &err);
    CHECK_OK(k3c_loader_state_from_json(fj, json, strlen(json), &err), &err);
    k3c_batch *rb = run_steps(fb, N - k, T, S), *rj = run_steps(fj, N - k, T, S);
    CHECK(same_runs(r1 + k, rb, N - k), "resume from bytes after %d steps differs", k);
    CHECK(same_runs(r1 + k, rj, N - k), "resume from JSON after %d steps differs", k);
    k3c_loader_get_state(fb, &st2);
    CHECK(st2.cursor[1].epoch >= 1 && st2.steps == N, "source B should have wrapped (epoch %lld)",
          (long long)st2.cursor[1].epoch);
    free_runs(rb, N - k);
    free_runs(rj, N - k);
    /* restores that must fail */
    k3c_loader *other = open_loader(dir, "BA", w, 5);
    CHECK(k3c_loader_set_state(other, &st, &err) == K3C_EINVAL && contains(err.msg, "other data sources"), "%s",
          err.msg);
    k3c_loader_state bad = st;
    bad.magic ^= 1;
    CHECK(k3c_loader_set_state(fb, &bad, &err) == K3C_EFORMAT, "bad magic accepted");
    bad = st;
    bad.cursor[0].pos = 5000;
    CHECK(k3c_loader_set_state(fb, &bad, &err) == K3C_EINVAL && contains(err.msg, "outside"), "%s", err.msg);
    bad = st;
    bad.cursor[bad.cur_source].offset = 100000;
    CHECK(k3c_loader_set_state(fb, &bad, &err) == K3C_EINVAL && contains(err.msg, "past"), "%s", err.msg);
    const char *bj =
        "{\"version\": 1, \"seed\": \"5\", \"counter\": 0, \"steps\": 0, \"tokens\": 0, \"current\": null, "
        "\"sources\": [{\"name\": \"A\", \"epoch\": 0, \"pos\": 0, \"offset\": 0}, "
        "{\"name\": \"Z\", \"epoch\": 0, \"pos\": 0, \"offset\": 0}]}";
    CHECK(k3c_loader_state_from_json(fb, bj, strlen(bj), &err) == K3C_EINVAL && contains(err.msg, "not a source"), "%s",
          err.msg);
    /* after a failed restore the loader still continues where it was */
    k3c_batch *after = run_steps(fb, 1, T, S);
    k3c_loader *ref = open_loader(dir, "AB", w, 5);
    k3c_batch *rr = run_steps(ref, N + 1, T, S);
    CHECK(batches_equal(&after[0], &rr[N]), "a failed restore changed the loader");
    free_runs(after, 1);
    free_runs(rr, N + 1);
    k3c_loader_close(ref);
    /* a new stage: new weights, same cursors; the document in progress is finished first */
    const double only_b[2] = {0, 1};
    k3c_loader_get_state(a, &st);
    CHECK_OK(k3c_loader_set_weights(a, only_b, &err), &err);
    CHECK_OK(k3c_loader_next(a, S, &b, &err), &err);
    const int cs = st.cur_source;
    CHECK(cs >= 0 && b.piece_source[0] == cs && syn_pos(b.ids[0]) == st.cursor[cs].offset,
          "the document in progress (source %d, offset %lld) should be finished first", cs,
          (long long)st.cursor[cs].offset);
    int rest_b = 1;
    for (int32_t i = 1; i < b.n_docs; i++) rest_b &= b.piece_source[i] == 1;
    CHECK(rest_b && b.n_docs > 1, "after the weights change only source B may follow");
    const double neg[2] = {-1, 1};
    CHECK(k3c_loader_set_weights(a, neg, &err) == K3C_EINVAL, "negative weight accepted");
    free(json);
    k3c_batch_free(&b);
    free_runs(r1, N);
    k3c_loader_close(a);
    k3c_loader_close(fb);
    k3c_loader_close(fj);
    k3c_loader_close(other);
}

static void test_loader_mixture(const char *dir) {
    const double w[2] = {3, 1};
    k3c_loader *ld = open_loader(dir, "CD", w, 11);
    if (!ld) return;
    k3c_err err = {0};
    k3c_batch b;
    CHECK_OK(k3c_batch_alloc(&b, 4096, &err), &err);
    int64_t docs[2] = {0, 0};
    int bad = 0;
    while (docs[0] + docs[1] < 20000) {
        CHECK_OK(k3c_loader_next(ld, 4096, &b, &err), &err);
        bad += batch_violations(&b, 4096, 1, 3);
        for (int32_t i = 0; i < b.n_docs; i++)
            if (syn_pos(b.ids[b.cu_seqlens[i]]) == 0) docs[b.piece_source[i]]++;
    }
    double frac = (double)docs[0] / (double)(docs[0] + docs[1]);
    CHECK(bad == 0, "%d packing violations", bad);
    /* binomial sd at 20000 draws is 0.003: 0.015 is 5 sd */
    CHECK(fabs(frac - 0.75) < 0.015, "source C got %.4f of the documents, weight 0.75", frac);
    if (getenv("K3C_TEST_VERBOSE"))
        printf("  mixture 3:1 -> %.4f over %lld documents\n", frac, (long long)(docs[0] + docs[1]));
    /* a weighted source without training data is refused; all-zero weights mean uniform */
    k3c_data_source src[2] = {{"x", NULL}, {"y", NULL}};
    char p1[512], p2[512], p3[512];
    snprintf(p1, sizeof p1, "%s/srcC", dir);
    snprintf(p2, sizeof p2, "%s/empty", dir);
    snprintf(p3, sizeof p3, "%s/srcC", dir);
    mkdir(p2, 0755);
    char mp[600];
    snprintf(mp, sizeof mp, "%s/manifest.json", p2);
    write_text(
        mp,
        "{\"format\": \"k3c-shards\", \"version\": 1, \"source\": \"E\", \"vocab_size\": 10000000, \"splits\": {}}");
    src[0].dir = p1, src[1].dir = p2;
    const double w01[2] = {0.5, 0.5}, w00[2] = {0, 0};
    k3c_loader *e = NULL;
    CHECK(k3c_loader_open(src, 2, w01, 1, &e, &err) == K3C_EINVAL && contains(err.msg, "no training tokens") &&
              contains(err.msg, p2),
          "the error should name the empty source's directory: %s", err.msg);
    CHECK_OK(k3c_loader_open(src, 2, w00, 1, &e, &err), &err);
    k3c_loader_close(e);
    /* only empty sources: every batch would be empty; the error names their directories */
    src[0].dir = p2, src[0].name = "E1", src[1].name = "E2";
    CHECK(k3c_loader_open(src, 2, w00, 1, &e, &err) == K3C_EINVAL && contains(err.msg, "no source has training") &&
              contains(err.msg, p2) && contains(err.msg, "E2"),
          "the error should name the empty sources: %s", err.msg);
    src[0].dir = p1, src[0].name = "x", src[1].name = "y";
    src[1].dir = p3;
    src[1].name = "x";
    CHECK(k3c_loader_open(src, 2, NULL, 1, &e, &err) == K3C_EINVAL && contains(err.msg, "twice"), "%s", err.msg);
    k3c_batch_free(&b);
    k3c_loader_close(ld);
}

static void test_loader_val(const char *dir) {
    k3c_loader *ld = open_loader(dir, "ABC", NULL, 3);
    if (!ld) return;
    k3c_err err = {0};
    const int64_t T = 128, S = 50;
    k3c_batch a, b;
    CHECK_OK(k3c_batch_alloc(&a, T, &err), &err);
    CHECK_OK(k3c_batch_alloc(&b, T, &err), &err);
    k3c_val_iter i1, i2;
    k3c_loader_val_begin(ld, -1, &i1);
    int same = 1, bad = 0, order = 1;
    int64_t vt = k3c_loader_val_tokens(ld, -1), seen = 0;
    int32_t prev = -1;
    for (int step = 0; step < 20; step++) {
        CHECK_OK(k3c_loader_val_next(ld, &i1, S, &a, &err), &err);
        bad += batch_violations(&a, S, 1, 1);
        if (step == 0) k3c_loader_val_begin(ld, -1, &i2);
        for (int64_t j = 0; j < T; j++, seen++) { /* A's val docs 900.., then B's, then A's again */
            int32_t t = a.ids[j];
            int expect_first = seen % vt == 0;
            if (expect_first)
                order &= t == syn_tok(1, 900, 0);
            else if (syn_pos(t) != 0)
                order &= t == prev + 1;
            else {
                const int vlen = 1 + (syn_doc(prev) * 7) % 40; /* make_source's val lengths */
                order &= syn_pos(prev) == vlen - 1;
                order &= (syn_src(t) == syn_src(prev) && syn_doc(t) == syn_doc(prev) + 1) ||
                         (syn_src(prev) == 1 && t == syn_tok(2, 900, 0));
            }
            prev = t;
        }
    }
    for (int step = 0; step < 20; step++) { /* a second pass yields the same batches */
        k3c_batch c;
        CHECK_OK(k3c_batch_alloc(&c, T, &err), &err);
        CHECK_OK(k3c_loader_val_next(ld, &i2, S, &c, &err), &err);
        if (step == 0) {
            k3c_val_iter i3;
            k3c_loader_val_begin(ld, -1, &i3);
            CHECK_OK(k3c_loader_val_next(ld, &i3, S, &b, &err), &err);
            same &= batches_equal(&b, &c);
        }
        k3c_batch_free(&c);
    }
    CHECK(bad == 0 && order && same, "val: violations %d, fixed order %d, repeatable %d", bad, order, same);
    CHECK(vt > 0 && seen > vt, "val should wrap (val tokens %lld)", (long long)vt);
    k3c_loader_val_begin(ld, 2, &i1);
    CHECK(k3c_loader_val_next(ld, &i1, S, &a, &err) == K3C_ENOTFOUND && contains(err.msg, "C"), "%s", err.msg);
    k3c_loader_val_begin(ld, 1, &i1);
    CHECK_OK(k3c_loader_val_next(ld, &i1, S, &a, &err), &err);
    CHECK(syn_src(a.ids[0]) == 2 && syn_src(a.ids[T - 1]) == 2, "val of source B only");
    k3c_batch_free(&a);
    k3c_batch_free(&b);
    k3c_loader_close(ld);
}

/* prepare → loader: real tokens, pieces end with the end-of-document token when the document ends */
static void test_prepare_loader(const char *dir, const char *vocab, const k3c_tok *t) {
    char in[512], out[512];
    snprintf(in, sizeof in, "%s/paras.txt", dir);
    snprintf(out, sizeof out, "%s/pl", dir);
    const char *inputs[] = {in};
    k3c_err err = {0};
    k3c_prepare_result r;
    CHECK_OK(prep(vocab, inputs, 1, out, K3C_DOC_SPLIT_BLANK, 0.1, 3, 0, &r, &err), &err);
    k3c_data_source src = {NULL, out};
    k3c_loader *ld = NULL;
    CHECK_OK(k3c_loader_open(&src, 1, NULL, 1, &ld, &err), &err);
    if (!ld) return;
    CHECK(strcmp(k3c_loader_source_name(ld, 0), "pl") == 0 && k3c_loader_vocab_size(ld) == k3c_tok_n_vocab(t),
          "source info");
    k3c_batch b;
    CHECK_OK(k3c_batch_alloc(&b, 64, &err), &err);
    int32_t eod = k3c_tok_special_id(t, "<|endoftext|>");
    int bad = 0, eods = 0, range = 1;
    for (int s = 0; s < 20; s++) {
        CHECK_OK(k3c_loader_next(ld, 16, &b, &err), &err);
        bad += batch_violations(&b, 16, 0, 0);
        for (int64_t j = 0; j < b.T; j++) {
            range &= b.ids[j] >= 0 && b.ids[j] < k3c_tok_n_vocab(t);
            if (b.ids[j] == eod) eods++, bad += b.targets[j] != -1; /* the end token closes its piece */
        }
    }
    CHECK(bad == 0 && range && eods > 10, "prepared data through the loader: %d violations, %d end tokens", bad, eods);
    k3c_batch_free(&b);
    k3c_loader_close(ld);
}

/* ---------------------------------------------------------------- CLI */

static int run_cli(const char *args, const char *outfile) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>&1", test_k3c_bin(), args, outfile);
    return system(cmd);
}

static void test_cli(const char *dir, const char *vocab) {
    if (access(test_k3c_bin(), X_OK) != 0) {
        CHECK(0, "CLI binary %s not found (build it first)", test_k3c_bin());
        return;
    }
    char args[4096], log[512], shard[600];
    snprintf(log, sizeof log, "%s/cli.log", dir);
    snprintf(args, sizeof args,
             "data prepare --vocab %s --input %s/corpus/a.txt %s/corpus/b.jsonl --out %s/cli --val-fraction 0", vocab,
             dir, dir, dir);
    CHECK(run_cli(args, log) == 0, "data prepare failed");
    size_t n;
    char *txt = slurp(log, &n);
    CHECK(txt && contains(txt, "6 documents"), "prepare output: %s", txt ? txt : "");
    free(txt);
    snprintf(args, sizeof args, "data info %s/cli", dir);
    CHECK(run_cli(args, log) == 0, "data info failed");
    snprintf(shard, sizeof shard, "%s/cli/train-00000.k3cshard", dir);
    unsigned char x = 0xff;
    patch(shard, 70, &x, 1, 0);
    CHECK(run_cli(args, log) != 0, "data info accepted a corrupt shard");
    txt = slurp(log, &n);
    CHECK(txt && contains(txt, "checksum mismatch") && contains(txt, "train-00000.k3cshard"), "info output: %s",
          txt ? txt : "");
    free(txt);
    snprintf(args, sizeof args, "data prepare --vocab %s --input %s/corpus/a.txt --out %s/cli2 --format xml", vocab,
             dir, dir);
    CHECK(run_cli(args, log) == 2 << 8, "bad --format should be a usage error");
}

int main(void) {
    const char *tmp = test_tmpdir("data");
    char dir[512], vocab[600];
    snprintf(dir, sizeof dir, "%s", tmp);
    double t0 = k3c_now();
    test_shard_roundtrip(dir);
    test_shard_errors(dir);
    k3c_tok *t = make_vocab(dir, vocab, sizeof vocab);
    if (t) {
        test_prepare_roundtrip(dir, vocab, t);
        test_prepare_split(dir, vocab, t);
        test_prepare_errors(dir, vocab, t);
        test_prepare_utf8(dir, vocab);
        test_prepare_loader(dir, vocab, t);
    }
    make_sources(dir);
    test_loader_packing(dir);
    test_loader_resume(dir);
    test_loader_mixture(dir);
    test_loader_val(dir);
    if (t) test_cli(dir, vocab);
    k3c_tok_free(t);
    if (getenv("K3C_TEST_VERBOSE")) printf("  test_data: %.2f s\n", k3c_now() - t0);
    return test_summary();
}
