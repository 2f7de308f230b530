/* test_tok.c — the tokenizer (docs/FORMATS.md §8, §9.2): base64, loader errors, cl100k/Kimi pre-tokeniser edge cases,
 * Kimi golden cases and long-input hashes, heap vs linear BPE, specials, chunking, the trainer and the CLI. */
#include "test.h"
#include "tok_fixture.h"

#include "base/json.h"
#include "tok/tok.h"

/* ---------------------------------------------------------------- helpers */
static unsigned char *hex_bytes(const char *hex, size_t *n) {
    size_t h = strlen(hex);
    unsigned char *b = malloc(h / 2 + 1);
    for (size_t i = 0; i < h / 2; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        b[i] = (unsigned char)v;
    }
    *n = h / 2;
    return b;
}

/* SHA-256 (FIPS 180-4), for the golden long cases' ids hashes. */
typedef struct {
    uint32_t h[8];
    unsigned char buf[64];
    size_t nbuf;
    uint64_t total;
} sha256;

static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) ((x) >> (n) | (x) << (32 - (n)))
static void sha_block(sha256 *s, const unsigned char *p) {
    uint32_t w[64], a[8];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | p[4 * i + 1] << 16 | p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(a, s->h, sizeof a);
    for (int i = 0; i < 64; i++) {
        uint32_t t1 =
            a[7] + (ROR(a[4], 6) ^ ROR(a[4], 11) ^ ROR(a[4], 25)) + ((a[4] & a[5]) ^ (~a[4] & a[6])) + sha_k[i] + w[i];
        uint32_t t2 = (ROR(a[0], 2) ^ ROR(a[0], 13) ^ ROR(a[0], 22)) + ((a[0] & a[1]) ^ (a[0] & a[2]) ^ (a[1] & a[2]));
        memmove(a + 1, a, 7 * sizeof *a);
        a[4] += t1;
        a[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++) s->h[i] += a[i];
}

static void sha_init(sha256 *s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->nbuf = 0;
    s->total = 0;
}

static void sha_update(sha256 *s, const void *data, size_t n) {
    const unsigned char *p = data;
    s->total += n;
    while (n) {
        size_t k = 64 - s->nbuf < n ? 64 - s->nbuf : n;
        memcpy(s->buf + s->nbuf, p, k);
        s->nbuf += k;
        p += k;
        n -= k;
        if (s->nbuf == 64) {
            sha_block(s, s->buf);
            s->nbuf = 0;
        }
    }
}

static void sha_hex(sha256 *s, char out[65]) {
    uint64_t bits = s->total * 8;
    unsigned char pad = 0x80, zero = 0, len[8];
    sha_update(s, &pad, 1);
    while (s->nbuf != 56) sha_update(s, &zero, 1);
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(bits >> (56 - 8 * i));
    sha_update(s, len, 8);
    for (int i = 0; i < 8; i++) sprintf(out + 8 * i, "%08x", s->h[i]);
}

static uint64_t fnv1a(uint64_t h, uint32_t v) {
    for (int k = 0; k < 4; k++) h = (h ^ ((v >> (8 * k)) & 0xFF)) * 0x100000001b3ull;
    return h;
}
#define FNV_OFFSET 0xcbf29ce484222325ull

/* Encodes and returns a malloc'd copy of the ids (count in *n); NULL on failure. */
static int32_t *encode(const k3c_tok *t, const char *s, size_t len, int flags, size_t *n) {
    k3c_tok_ids v = {0};
    k3c_err err = {0};
    int rc = k3c_tok_encode(t, s, len, flags, &v, &err);
    CHECK_OK(rc, &err);
    *n = v.n;
    return v.ids;
}

static int ids_equal_json(const int32_t *ids, size_t n, const k3c_json *arr) {
    if (!arr || arr->type != K3C_JSON_ARRAY || arr->n != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (arr->items[i].integer != ids[i]) return 0;
    return 1;
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    printf("  %s (%zu):", what, n);
    for (size_t i = 0; i < n && i < 40; i++) printf(" %d", ids[i]);
    printf("\n");
}
/* ---------------------------------------------------------------- base64 and the loader */
static void test_base64(void) {
    unsigned char out[64];
    size_t n = 99;
    CHECK(k3c_base64_decode("SGVsbG8=", 8, out, &n) == K3C_OK && n == 5 && memcmp(out, "Hello", 5) == 0, "Hello");
    CHECK(k3c_base64_decode("", 0, out, &n) == K3C_OK && n == 0, "empty");
    CHECK(k3c_base64_decode("QQ==", 4, out, &n) == K3C_OK && n == 1 && out[0] == 'A', "one byte");
    CHECK(k3c_base64_decode("QUI=", 4, out, &n) == K3C_OK && n == 2 && memcmp(out, "AB", 2) == 0, "two bytes");
    CHECK(k3c_base64_decode("+/+/", 4, out, &n) == K3C_OK && n == 3 && out[0] == 0xfb && out[1] == 0xff, "+ and /");
    static const char *const bad[] = {"QQ=", "Q===", "QQ=A", "QR==", "QUJD!A==", "QUJ-", "QQ==QUJD", "Q", "=QQQ"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(k3c_base64_decode(bad[i], strlen(bad[i]), out, &n) == K3C_EFORMAT, "'%s' must be rejected", bad[i]);
    unsigned char in[40];
    char enc[64];
    int ok = 1;
    for (size_t len = 0; len <= sizeof in; len++) {
        for (size_t i = 0; i < len; i++) in[i] = (unsigned char)(i * 97 + len * 31 + 7);
        size_t el = k3c_base64_encode(in, len, enc);
        ok &= el == (len + 2) / 3 * 4 && k3c_base64_decode(enc, el, out, &n) == K3C_OK && n == len &&
              memcmp(in, out, len) == 0;
    }
    CHECK(ok, "encode/decode round trip for lengths 0..40");
}

/* A minimal valid vocabulary: the 256 bytes at ranks 0..255, then `extra`. */
static char *mini_vocab(const char *extra, int skip_byte) {
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    for (int b = 0; b < 256; b++) {
        if (b == skip_byte) continue;
        unsigned char c = (unsigned char)b;
        char e[8];
        size_t l = k3c_base64_encode(&c, 1, e);
        k3c_sbuf_append(&s, e, l);
        k3c_sbuf_printf(&s, " %d\n", b);
    }
    k3c_sbuf_append(&s, extra, strlen(extra));
    k3c_sbuf_append(&s, "", 1);
    return s.buf;
}

/* Parses mini_vocab(extra) and expects failure with both `line` and `what` in the message. */
static void expect_load_error(const char *extra, int flags, int skip_byte, const char *line, const char *what) {
    char *text = mini_vocab(extra, skip_byte);
    k3c_tok *t = NULL;
    k3c_err err = {0};
    int rc = k3c_tok_parse(text, strlen(text), "mini.tiktoken", K3C_TOK_PATTERN_KIMI, flags, &t, &err);
    CHECK(rc == K3C_EFORMAT && t == NULL, "'%s' should fail to load", what);
    CHECK(strstr(err.msg, line) && strstr(err.msg, what), "message '%s' should name '%s' and say '%s'", err.msg, line,
          what);
    k3c_tok_free(t);
    free(text);
}

static void test_loader(void) {
    expect_load_error("QUE=\n", 0, -1, "mini.tiktoken:257:", "without a space");
    expect_load_error("QU!= 256\n", 0, -1, "mini.tiktoken:257:", "bad base64");
    expect_load_error("QUE= \n", 0, -1, "mini.tiktoken:257:", "missing rank");
    expect_load_error("QUE= 25x\n", 0, -1, "mini.tiktoken:257:", "bad rank");
    expect_load_error("QUE= -1\n", 0, -1, "mini.tiktoken:257:", "bad rank");
    expect_load_error(" 256\n", 0, -1, "mini.tiktoken:257:", "empty token");
    expect_load_error("QUE= 256\nQQ== 257\n", 0, -1, "mini.tiktoken:258:", "duplicate token");
    expect_load_error("QUE= 300\n", 0, -1, "mini.tiktoken:257:", "out of order");
    expect_load_error("QUE= 256\nQUI= 256\n", K3C_TOK_LOAD_ALLOW_GAPS, -1, "mini.tiktoken:258:", "duplicate rank");
    expect_load_error("", K3C_TOK_LOAD_ALLOW_GAPS, 0, "mini.tiktoken", "0x00 has no rank");
    /* fuzz_tiktoken: one gapped rank near 2^30 made the loader allocate 8 GB for its rank table */
    expect_load_error("QUE= 685266685\n", K3C_TOK_LOAD_ALLOW_GAPS, -1,
                      "mini.tiktoken:257:", "past the file's line count");
    k3c_err err = {0};
    k3c_tok *t = NULL;
    CHECK(k3c_tok_load("build/no/such/vocab.tiktoken", K3C_TOK_PATTERN_KIMI, 0, &t, &err) == K3C_EIO && !t,
          "missing file is an i/o error");

    /* gaps (when allowed), CRLF and blank lines */
    char *text = mini_vocab("QUE= 300\r\n\nQUI= 280\n", -1);
    CHECK_OK(k3c_tok_parse(text, strlen(text), "gaps", K3C_TOK_PATTERN_KIMI, K3C_TOK_LOAD_ALLOW_GAPS, &t, &err), &err);
    free(text);
    if (!t) return;
    CHECK(k3c_tok_n_ranks(t) == 301 && k3c_tok_rank_of(t, "AA", 2) == 300 && k3c_tok_rank_of(t, "AB", 2) == 280,
          "gapped ranks");
    const unsigned char *b;
    size_t bl;
    CHECK(k3c_tok_token_bytes(t, 290, &b, &bl, &err) == K3C_EINVAL, "a gap has no bytes");
    int32_t ids[] = {65, 290};
    char *dec = NULL;
    CHECK(k3c_tok_decode(t, ids, 2, &dec, &bl, &err) == K3C_EINVAL && strstr(err.msg, "position 1"),
          "decoding a gap fails naming the position: %s", err.msg);

    /* special-token table errors */
    CHECK(k3c_tok_add_special(t, "<s>", 3, 65, &err) == K3C_EINVAL, "special on a rank id");
    CHECK_OK(k3c_tok_add_special(t, "<s>", 3, 400, &err), &err);
    CHECK(k3c_tok_add_special(t, "<s>", 3, 401, &err) == K3C_EINVAL, "duplicate spelling");
    CHECK(k3c_tok_add_special(t, "<t>", 3, 400, &err) == K3C_EINVAL, "duplicate id");
    CHECK(k3c_tok_add_special(t, "", 0, 402, &err) == K3C_EINVAL, "empty spelling");
    CHECK(k3c_tok_n_vocab(t) == 401 && k3c_tok_special_id(t, "<s>") == 400, "vocab counts the special");

    /* the three JSON shapes, and a bad one */
    const char *dir = test_tmpdir("tok_specials");
    char path[4200];
    snprintf(path, sizeof path, "%s/sp.json", dir);
    const char *js = "{\"t\": {\"500\": \"<a>\", \"501\": {\"content\": \"<b>\", \"special\": true}, \"<c>\": 502}}";
    CHECK_OK(k3c_write_file_atomic(path, js, strlen(js), &err), &err);
    CHECK_OK(k3c_tok_load_specials_json(t, path, "t", &err), &err);
    CHECK(k3c_tok_special_id(t, "<a>") == 500 && k3c_tok_special_id(t, "<b>") == 501 &&
              k3c_tok_special_id(t, "<c>") == 502,
          "specials from JSON");
    js = "{\"<d>\": \"x\"}";
    CHECK_OK(k3c_write_file_atomic(path, js, strlen(js), &err), &err);
    CHECK(k3c_tok_load_specials_json(t, path, NULL, &err) == K3C_EFORMAT && strstr(err.msg, "sp.json"),
          "bad specials entry names the file: %s", err.msg);
    CHECK(k3c_tok_load_specials_json(t, path, "missing", &err) == K3C_EFORMAT, "missing table");
    k3c_tok_free(t);
}

/* ---------------------------------------------------------------- pre-tokenisers */
#define PK K3C_TOK_PATTERN_KIMI
#define PC K3C_TOK_PATTERN_CL100K
/* Expected pieces: Python `regex` (V1 mode, which has class intersection) on the Kimi pat_str and tiktoken's cl100k
 * pattern, checked by hand against the semantics in golden/kimi_tokenizer/README.md. */
// One case per line reads best:
// clang-format off
static const struct {
    k3c_tok_pattern pat;
    const char *name, *text;
    const char *pieces[26];
} edges[] = {
    {PK, "han run and punctuation", "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xef\xbc\x81\xe6\x88\x91\xe6\x98\xafKimi\xe3\x80\x82",
     {"\xe4\xbd\xa0\xe5\xa5\xbd", "\xef\xbc\x8c", "\xe4\xb8\x96\xe7\x95\x8c", "\xef\xbc\x81", "\xe6\x88\x91\xe6\x98\xaf", "Kimi", "\xe3\x80\x82", NULL}},
    {PK, "han next to latin and digits", "\xe4\xb8\xad\xe6\x96\x87" "English\xe6\xb7\xb7\xe5\x90\x88" "123\xe6\xb1\x89\xe5\xad\x97" "4567",
     {"\xe4\xb8\xad\xe6\x96\x87", "English", "\xe6\xb7\xb7\xe5\x90\x88", "123", "\xe6\xb1\x89\xe5\xad\x97", "456", "7", NULL}},
    {PK, "han iteration mark and numeral", "\xe4\xba\xba\xe3\x80\x85\xe3\x80\x87\xe4\xb8\x80\xe4\xba\x8c\xe4\xb8\x89 \xe3\x80\x85x",
     {"\xe4\xba\xba\xe3\x80\x85\xe3\x80\x87\xe4\xb8\x80\xe4\xba\x8c\xe4\xb8\x89", " ", "\xe3\x80\x85", "x", NULL}},
    {PK, "han extension B (supplementary)", "\xf0\xa0\x80\x80\xf0\xa0\x80\x81" "a\xf0\xa0\x80\x82",
     {"\xf0\xa0\x80\x80\xf0\xa0\x80\x81", "a", "\xf0\xa0\x80\x82", NULL}},
    {PK, "cjk radical is han but not a letter", "!\xe2\xba\x80\xe2\xba\x81 x",
     {"!\xe2\xba\x80\xe2\xba\x81", " x", NULL}},
    {PK, "kana and hangul (lo) before capitals give the capitals back", "\xe3\x82\xab\xe3\x82\xbf\xe3\x82\xab\xe3\x83\x8a" "ABC def \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4" "ABC \xc2\xaa" "B \xca\xb0" "A x\xca\xb0" "B",
     {"\xe3\x82\xab\xe3\x82\xbf\xe3\x82\xab\xe3\x83\x8a", "ABC", " def", " \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4", "ABC", " \xc2\xaa", "B", " \xca\xb0", "A", " x\xca\xb0", "B", NULL}},
    {PC, "kana and hangul before capitals", "\xe3\x82\xab\xe3\x82\xbf\xe3\x82\xab\xe3\x83\x8a" "ABC def \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4" "ABC",
     {"\xe3\x82\xab\xe3\x82\xbf\xe3\x82\xab\xe3\x83\x8a" "ABC", " def", " \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4" "ABC", NULL}},
    {PK, "mixed-case identifiers", "camelCaseIdentifier XMLHttpRequest getHTTPResponseCode __init__ iOS",
     {"camel", "Case", "Identifier", " XMLHttp", "Request", " get", "HTTPResponse", "Code", " __", "init", "__", " i", "OS", NULL}},
    {PC, "mixed-case identifiers", "camelCaseIdentifier XMLHttpRequest getHTTPResponseCode __init__ iOS",
     {"camelCaseIdentifier", " XMLHttpRequest", " getHTTPResponseCode", " __", "init", "__", " iOS", NULL}},
    {PK, "contractions, any case", "It's THEY'RE we'Ll I'D you've 'm don't",
     {"It's", " THEY'RE", " we'Ll", " I'D", " you've", " '", "m", " don't", NULL}},
    {PC, "contractions, any case", "It's THEY'RE we'Ll I'D you've 'm don't",
     {"It", "'s", " THEY", "'RE", " we", "'Ll", " I", "'D", " you", "'ve", " '", "m", " don", "'t", NULL}},
    {PK, "long s folds to s", "Bob\xc5\xbf Bob'\xc5\xbf '\xc5\xbfx",
     {"Bob\xc5\xbf", " Bob'\xc5\xbf", " '", "\xc5\xbfx", NULL}},
    {PC, "long s folds to s", "Bob'\xc5\xbf '\xc5\xbfx",
     {"Bob", "'\xc5\xbf", " '", "\xc5\xbfx", NULL}},
    {PC, "bare contractions", "'s'll'LL'x ''s",
     {"'s", "'ll", "'LL", "'x", " ''", "s", NULL}},
    {PK, "bare contractions", "'s'll'LL'x ''s",
     {"'s'll", "'LL", "'x", " ''", "s", NULL}},
    {PK, "digit runs of 1-3", "1 12 123 1234 1234567 3.14159 \xd9\xa1\xd9\xa2\xd9\xa3\xd9\xa4 \xe2\x85\xab\xe2\x85\xa0 \xc2\xb2\xc2\xb3",
     {"1", " ", "12", " ", "123", " ", "123", "4", " ", "123", "456", "7", " ", "3", ".", "141", "59", " ", "\xd9\xa1\xd9\xa2\xd9\xa3", "\xd9\xa4", " ", "\xe2\x85\xab\xe2\x85\xa0", " ", "\xc2\xb2\xc2\xb3", NULL}},
    {PC, "digit runs of 1-3", "1 12 123 1234 1234567 3.14159 \xd9\xa1\xd9\xa2\xd9\xa3\xd9\xa4 \xe2\x85\xab\xe2\x85\xa0 \xc2\xb2\xc2\xb3",
     {"1", " ", "12", " ", "123", " ", "123", "4", " ", "123", "456", "7", " ", "3", ".", "141", "59", " ", "\xd9\xa1\xd9\xa2\xd9\xa3", "\xd9\xa4", " ", "\xe2\x85\xab\xe2\x85\xa0", " ", "\xc2\xb2\xc2\xb3", NULL}},
    {PK, "cr/lf runs", "a\r\n\r\nb\n\n\nc \n d\r\r\n\ne  \n\t",
     {"a", "\r\n\r\n", "b", "\n\n\n", "c", " \n", " d", "\r\r\n\n", "e", "  \n", "\t", NULL}},
    {PC, "cr/lf runs", "a\r\n\r\nb\n\n\nc \n d\r\r\n\ne  \n\t",
     {"a", "\r\n\r\n", "b", "\n\n\n", "c", " \n", " d", "\r\r\n\n", "e", "  \n", "\t", NULL}},
    {PK, "punctuation keeps its newlines", "end.\n\nNext!?\r\n x",
     {"end", ".\n\n", "Next", "!?\r\n", " x", NULL}},
    {PK, "long whitespace before a word", "a          b\t\t\tc  \xe3\x80\x80" "d\xc2\xa0 e",
     {"a", "         ", " b", "\t\t", "\tc", "  ", "\xe3\x80\x80" "d", "\xc2\xa0", " e", NULL}},
    {PC, "long whitespace before a word", "a          b\t\t\tc  \xe3\x80\x80" "d\xc2\xa0 e",
     {"a", "         ", " b", "\t\t", "\tc", "  ", "\xe3\x80\x80" "d", "\xc2\xa0", " e", NULL}},
    {PK, "trailing whitespace", "end   ",
     {"end", "   ", NULL}},
    {PC, "trailing whitespace", "x \t ",
     {"x", " \t ", NULL}},
    {PK, "single space before punctuation", "a !b  !c",
     {"a", " !", "b", " ", " !", "c", NULL}},
    {PK, "emoji and zwj sequences", "hi\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 \xf0\x9f\x87\xaf\xf0\x9f\x87\xb5!",
     {"hi", "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd", " \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7", " \xf0\x9f\x87\xaf\xf0\x9f\x87\xb5!", NULL}},
    {PC, "emoji and zwj sequences", "hi\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 \xf0\x9f\x87\xaf\xf0\x9f\x87\xb5!",
     {"hi", "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd", " \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7", " \xf0\x9f\x87\xaf\xf0\x9f\x87\xb5!", NULL}},
    {PK, "supplementary letters", "\xf0\x9d\x94\x98\xf0\x9d\x94\xab\xf0\x9d\x94\xa6 \xf0\x93\x80\x80\xf0\x93\x80\x81 \xf0\x9d\x9f\x98\xf0\x9d\x9f\x99\xf0\x9d\x9f\x9a\xf0\x9d\x9f\x9b",
     {"\xf0\x9d\x94\x98\xf0\x9d\x94\xab\xf0\x9d\x94\xa6", " \xf0\x93\x80\x80\xf0\x93\x80\x81", " ", "\xf0\x9d\x9f\x98\xf0\x9d\x9f\x99\xf0\x9d\x9f\x9a", "\xf0\x9d\x9f\x9b", NULL}},
    {PK, "arabic (lo) backtracks a* into b+", "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xd8\xa8\xd8\xa7\xd9\x84\xd8\xb9\xd8\xa7\xd9\x84\xd9\x85",
     {"\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7", " \xd8\xa8\xd8\xa7\xd9\x84\xd8\xb9\xd8\xa7\xd9\x84\xd9\x85", NULL}},
    {PK, "combining marks", "e\xcc\x81 \xcc\x81start a\xcc\x88\xcc\x84" "b NA\xc3\x8fVE",
     {"e\xcc\x81", " \xcc\x81start", " a\xcc\x88\xcc\x84" "b", " NA\xc3\x8fVE", NULL}},
    {PC, "combining marks", "e\xcc\x81 \xcc\x81start a\xcc\x88\xcc\x84" "b",
     {"e", "\xcc\x81", " \xcc\x81", "start", " a", "\xcc\x88\xcc\x84", "b", NULL}},
    {PK, "titlecase and modifier letters", "\xc7\x85ungla \xca\xb0\xca\xb0 \xc2\xaa\xc2\xba D\xc5\xbd" "EMAL",
     {"\xc7\x85ungla", " \xca\xb0\xca\xb0", " \xc2\xaa\xc2\xba", " D\xc5\xbd" "EMAL", NULL}},
    {PK, "controls are not whitespace", "a\x1c" "b\x1f c\x7f\x01" "d",
     {"a", "\x1c" "b", "\x1f", " c", "\x7f\x01", "d", NULL}},
    {PK, "nel is whitespace", "a\xc2\x85" "b\xc2\x85\xc2\x85" "c",
     {"a", "\xc2\x85" "b", "\xc2\x85", "\xc2\x85" "c", NULL}},
    {PC, "nel is whitespace", "a\xc2\x85" "b\xc2\x85\xc2\x85" "c",
     {"a", "\xc2\x85" "b", "\xc2\x85", "\xc2\x85" "c", NULL}},
    {PK, "special-like text is plain", "<|not_a_real_token|> <|endoftext|>x",
     {"<|", "not", "_a", "_real", "_token", "|>", " <|", "endoftext", "|>", "x", NULL}},
};
// clang-format on

static void test_pretok(void) {
    for (size_t c = 0; c < sizeof edges / sizeof *edges; c++) {
        const char *s = edges[c].text;
        size_t n = strlen(s), k = 0;
        int ok = 1;
        for (size_t i = 0; i < n && ok; k++) {
            size_t e = k3c_tok_pretok_next(edges[c].pat, (const unsigned char *)s, n, i);
            const char *want = edges[c].pieces[k];
            ok = e > i && want && strlen(want) == e - i && memcmp(want, s + i, e - i) == 0;
            if (!ok)
                printf("  %s/%s: piece %zu is \"%.*s\"\n", k3c_tok_pattern_name(edges[c].pat), edges[c].name, k,
                       (int)(e > i ? e - i : 0), s + i);
            i = e;
        }
        CHECK(ok && edges[c].pieces[k] == NULL, "%s pre-tokeniser: %s", k3c_tok_pattern_name(edges[c].pat),
              edges[c].name);
    }
    /* invalid UTF-8 is split, never dropped */
    const unsigned char bad[] = {'a', 0xff, 0xc3, ' ', 0xe2, 0x82, 'b', 0xed, 0xa0, 0x80};
    size_t total = 0, n = sizeof bad;
    for (size_t i = 0; i < n;) {
        size_t e = k3c_tok_pretok_next(PK, bad, n, i);
        CHECK(e > i && e <= n, "progress on invalid UTF-8");
        if (e <= i) break;
        total += e - i;
        i = e;
    }
    CHECK(total == n, "invalid UTF-8 pieces tile the input");
}

/* ---------------------------------------------------------------- Kimi goldens */
static void check_golden_pieces(const k3c_json *c, const char *id, const unsigned char *text, size_t len) {
    const k3c_json *pieces = k3c_json_get(c, "pieces");
    if (!pieces) return;
    size_t i = 0, k = 0;
    int ok = 1;
    while (i < len && ok) {
        size_t e = k3c_tok_pretok_next(K3C_TOK_PATTERN_KIMI, text, len, i);
        ok = k < pieces->n && pieces->items[k].len == e - i && memcmp(pieces->items[k].string, text + i, e - i) == 0;
        if (!ok) printf("  %s: piece %zu is \"%.*s\"\n", id, k, (int)(e - i), text + i);
        i = e;
        k++;
    }
    CHECK(ok && k == pieces->n, "%s: pre-tokenisation differs from the golden pieces", id);
}

static void check_golden_segments(const k3c_tok *t, const k3c_json *c, const char *id, const char *text, size_t len) {
    const k3c_json *segs = k3c_json_get(c, "segments"), *want = k3c_json_get(c, "ids");
    k3c_tok_segment *sv = calloc(segs->n, sizeof *sv);
    size_t *ends = calloc(segs->n, sizeof *ends);
    for (size_t i = 0; i < segs->n; i++) {
        sv[i].text = segs->items[i].items[0].string;
        sv[i].len = segs->items[i].items[0].len;
        sv[i].allow_special = segs->items[i].items[1].boolean;
    }
    k3c_tok_ids v = {0};
    k3c_err err = {0};
    CHECK_OK(k3c_tok_encode_segments(t, sv, segs->n, &v, ends, &err), &err);
    CHECK(ids_equal_json(v.ids, v.n, want), "%s: segment-wise ids differ", id);
    if (!ids_equal_json(v.ids, v.n, want)) print_ids("got", v.ids, v.n);
    /* a special segment is exactly one id; seg_end is monotone and ends at the total */
    int ends_ok = ends[segs->n - 1] == v.n;
    for (size_t i = 0; i < segs->n; i++) {
        size_t from = i ? ends[i - 1] : 0;
        if (sv[i].allow_special && (ends[i] - from != 1 || !k3c_tok_is_special(t, v.ids[from]))) ends_ok = 0;
    }
    CHECK(ends_ok, "%s: per-segment id spans wrong", id);
    check_round_trip(t, v.ids, v.n, text, len, id);
    const k3c_json *whole = k3c_json_get(c, "whole_text_encode_matches");
    if (whole) {
        size_t n;
        int32_t *ids = encode(t, text, len, K3C_TOK_ALLOW_SPECIAL, &n);
        CHECK(ids_equal_json(ids, n, want) == whole->boolean, "%s: whole-text encode %s the segment-wise ids", id,
              whole->boolean ? "should equal" : "should differ from");
        free(ids);
    }
    k3c_tok_ids_free(&v);
    free(sv);
    free(ends);
}

static void test_kimi_cases(const k3c_tok *k3, const k3c_tok *k2) {
    char *data;
    size_t n;
    k3c_err err = {0};
    CHECK_OK(k3c_read_file(test_shared("golden/kimi_tokenizer/cases.jsonl"), &data, &n, &err), &err);
    if (!data) return;
    int cases = 0, bad = 0;
    for (char *line = data, *nl; line < data + n; line = nl + 1) {
        nl = memchr(line, '\n', (size_t)(data + n - line));
        if (!nl) nl = data + n;
        if (nl == line) continue;
        k3c_json *c;
        CHECK_OK(k3c_json_parse(line, (size_t)(nl - line), "cases.jsonl", &c, &err), &err);
        if (!c) continue;
        const char *id = k3c_json_get(c, "id")->string;
        const k3c_json *sp = k3c_json_get(c, "specials");
        const k3c_tok *t = sp && strcmp(sp->string, "kimi_k2") == 0 ? k2 : k3;
        size_t len;
        unsigned char *text = hex_bytes(k3c_json_get(c, "text_utf8_hex")->string, &len);
        CHECK(len == k3c_json_get(c, "text")->len && memcmp(text, k3c_json_get(c, "text")->string, len) == 0,
              "%s: text and text_utf8_hex disagree", id);
        int before = test_failed_;
        if (strcmp(k3c_json_get(c, "mode")->string, "segments") == 0) {
            check_golden_segments(t, c, id, (const char *)text, len);
        } else {
            int allow = k3c_json_get(c, "allow_special")->boolean;
            size_t m;
            int32_t *ids = encode(t, (const char *)text, len, allow ? K3C_TOK_ALLOW_SPECIAL : 0, &m);
            int ok = ids_equal_json(ids, m, k3c_json_get(c, "ids"));
            CHECK(ok, "%s: ids differ", id);
            if (!ok) print_ids("got", ids, m);
            check_round_trip(t, ids, m, (const char *)text, len, id);
            free(ids);
            if (!allow) check_golden_pieces(c, id, text, len);
        }
        bad += test_failed_ > before;
        cases++;
        free(text);
        k3c_json_free(c);
    }
    free(data);
    CHECK(cases >= 94, "only %d golden cases read", cases);
    if (getenv("K3C_TEST_VERBOSE")) printf("  kimi golden cases: %d, failing %d\n", cases, bad);
}

/* The ids hash of a long case as the README defines it. */
static int check_long_hash(const k3c_json *c, const int32_t *ids, size_t n, const char *id) {
    const char *check = k3c_json_get(c, "check")->string;
    if (strcmp(check, "sha256") == 0) {
        sha256 s;
        sha_init(&s);
        char num[16], hex[65];
        sha_update(&s, "[", 1);
        for (size_t i = 0; i < n; i++) {
            int l = snprintf(num, sizeof num, i ? ",%d" : "%d", ids[i]);
            sha_update(&s, num, (size_t)l);
        }
        sha_update(&s, "]", 1);
        sha_hex(&s, hex);
        return strcmp(hex, k3c_json_get(c, "ids_sha256")->string) == 0;
    }
    if (strcmp(check, "fnv1a64_u32le") == 0) {
        uint64_t h = FNV_OFFSET;
        for (size_t i = 0; i < n; i++) h = fnv1a(h, (uint32_t)ids[i]);
        return h == strtoull(k3c_json_get(c, "fnv1a64")->string, NULL, 16);
    }
    printf("  %s: unknown check '%s'\n", id, check);
    return 0;
}

/* deltafin's combinatorial case: every ordered triple of fragments, FNV-1a over (len, ids...) per text. */
static void check_combinatorial(const k3c_tok *t, const k3c_json *c, const char *id) {
    const k3c_json *fr = k3c_json_get(c, "fragments");
    const k3c_json *allow = k3c_json_get(c, "allow_special");
    int flags = allow && allow->boolean ? K3C_TOK_ALLOW_SPECIAL : 0;
    uint64_t h = FNV_OFFSET;
    int64_t total = 0;
    char buf[4096];
    k3c_tok_ids v = {0};
    for (size_t l = 0; l < fr->n; l++)
        for (size_t m = 0; m < fr->n; m++)
            for (size_t r = 0; r < fr->n; r++) {
                size_t len = 0;
                const k3c_json *parts[3] = {&fr->items[l], &fr->items[m], &fr->items[r]};
                for (int k = 0; k < 3; k++) {
                    if (len + parts[k]->len > sizeof buf) {
                        CHECK(0, "%s: fragment too long", id);
                        return;
                    }
                    memcpy(buf + len, parts[k]->string, parts[k]->len);
                    len += parts[k]->len;
                }
                v.n = 0;
                k3c_tok_encode(t, buf, len, flags, &v, NULL);
                h = fnv1a(h, (uint32_t)v.n);
                for (size_t i = 0; i < v.n; i++) h = fnv1a(h, (uint32_t)v.ids[i]);
                total += (int64_t)v.n;
            }
    k3c_tok_ids_free(&v);
    const k3c_json *want_total = k3c_json_get(c, "total_ids"), *want_hash = k3c_json_get(c, "fnv1a64");
    for (size_t i = 0; !want_hash && i < c->n; i++) /* the hash under another name: any "0x…" field naming fnv/hash */
        if ((strstr(c->keys[i], "fnv") || strstr(c->keys[i], "hash")) && c->items[i].type == K3C_JSON_STRING &&
            strncmp(c->items[i].string, "0x", 2) == 0)
            want_hash = &c->items[i];
    CHECK(want_total || want_hash, "%s: nothing to compare", id);
    if (want_total)
        CHECK(total == want_total->integer, "%s: %lld ids, want %lld", id, (long long)total,
              (long long)want_total->integer);
    if (want_hash)
        CHECK(h == strtoull(want_hash->string, NULL, 16), "%s: hash %016llx differs", id, (unsigned long long)h);
}

static void test_kimi_long(const k3c_tok *k3) {
    char *data;
    size_t n;
    k3c_err err = {0};
    CHECK_OK(k3c_read_file(test_shared("golden/kimi_tokenizer/long_cases.jsonl"), &data, &n, &err), &err);
    if (!data) return;
    int cases = 0;
    for (char *line = data, *nl; line < data + n; line = nl + 1) {
        nl = memchr(line, '\n', (size_t)(data + n - line));
        if (!nl) nl = data + n;
        if (nl == line) continue;
        k3c_json *c;
        CHECK_OK(k3c_json_parse(line, (size_t)(nl - line), "long_cases.jsonl", &c, &err), &err);
        if (!c) continue;
        const char *id = k3c_json_get(c, "id")->string, *mode = k3c_json_get(c, "mode")->string;
        cases++;
        if (strcmp(mode, "combinatorial") == 0) {
            check_combinatorial(k3, c, id);
        } else if (strcmp(mode, "release_encode") == 0) {
            const k3c_json *unit = k3c_json_get(c, "unit"), *suffix = k3c_json_get(c, "suffix");
            size_t count = (size_t)k3c_json_get(c, "count")->integer;
            size_t len = unit->len * count + suffix->len;
            char *text = malloc(len + 1);
            for (size_t i = 0; i < count; i++) memcpy(text + i * unit->len, unit->string, unit->len);
            memcpy(text + unit->len * count, suffix->string, suffix->len);
            int allow = k3c_json_get(c, "allow_special")->boolean;
            size_t m;
            int32_t *ids = encode(k3, text, len, allow ? K3C_TOK_ALLOW_SPECIAL : 0, &m);
            int64_t want_n = k3c_json_get(c, "num_ids")->integer;
            CHECK((int64_t)m == want_n, "%s: %zu ids, want %lld", id, m, (long long)want_n);
            CHECK(check_long_hash(c, ids, m, id), "%s: ids hash differs", id);
            check_round_trip(k3, ids, m, text, len, id);
            free(ids);
            free(text);
        } else {
            CHECK(0, "%s: unknown mode %s", id, mode);
        }
        k3c_json_free(c);
    }
    free(data);
    CHECK(cases >= 7, "only %d long cases", cases);
}

/* ---------------------------------------------------------------- BPE, specials, chunking, speed */
static void check_encode(const k3c_tok *t, const char *s, int flags, const int32_t *want, size_t nwant,
                         const char *what) {
    size_t n;
    int32_t *ids = encode(t, s, strlen(s), flags, &n);
    int ok = n == nwant && memcmp(ids, want, n * sizeof *ids) == 0;
    CHECK(ok, "%s", what);
    if (!ok) print_ids("got", ids, n);
    free(ids);
}

/* ids of s encoded alone without specials, appended to v */
static void append_plain(const k3c_tok *t, const char *s, k3c_tok_ids *v) {
    k3c_tok_encode(t, s, strlen(s), 0, v, NULL);
}

static void test_bpe_algorithms(const k3c_tok *t) {
    /* linear rescans (tiktoken's loop) and the heap give the same ids on random bytes and on text */
    uint64_t x = 12345;
    unsigned char buf[300] = {0};
    int same = 1;
    k3c_err err = {0};
    for (int trial = 0; trial < 400 && same; trial++) {
        size_t n = 2 + (size_t)(trial % 255);
        for (size_t i = 0; i < n; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            /* mostly letters and spaces so that long merges happen, some arbitrary bytes */
            unsigned r = (unsigned)(x >> 33);
            buf[i] = r % 8 == 0 ? (unsigned char)(r >> 8) : (unsigned char)("etaoin shrdlu"[(r >> 8) % 13]);
        }
        k3c_tok_ids a = {0}, b = {0};
        CHECK_OK(k3c_tok_encode_piece(t, buf, n, 1, &a, &err), &err);
        CHECK_OK(k3c_tok_encode_piece(t, buf, n, 2, &b, &err), &err);
        same = a.n == b.n && memcmp(a.ids, b.ids, a.n * sizeof *a.ids) == 0;
        char *back = NULL;
        size_t bl = 0;
        k3c_tok_decode(t, a.ids, a.n, &back, &bl, NULL);
        same &= bl == n && memcmp(back, buf, n) == 0;
        free(back);
        k3c_tok_ids_free(&a);
        k3c_tok_ids_free(&b);
    }
    CHECK(same, "linear and heap BPE disagree");
    /* a piece that is itself a token is emitted whole */
    k3c_tok_ids v = {0};
    CHECK_OK(k3c_tok_encode_piece(t, " the", 4, 2, &v, &err), &err);
    CHECK(v.n == 1 && v.ids[0] == k3c_tok_rank_of(t, " the", 4), "whole-piece token");
    k3c_tok_ids_free(&v);
    CHECK(k3c_tok_encode_piece(t, buf, 257, 1, &v, &err) == K3C_EINVAL, "linear merging is limited to 256 bytes");
    /* tiktoken emits a piece that is a token even when no chain of merges reaches it: "abc" without "ab" or "bc" */
    char *text = mini_vocab("YWJj 256\n", -1);
    k3c_tok *m = NULL;
    CHECK_OK(k3c_tok_parse(text, strlen(text), "abc", PK, 0, &m, &err), &err);
    free(text);
    if (!m) return;
    const int32_t abc[] = {256}, abcd[] = {'a', 'b', 'c', 'd'};
    check_encode(m, "abc", 0, abc, 1, "unreachable whole-piece token");
    check_encode(m, "abcd", 0, abcd, 4, "no merge path inside a longer piece");
    for (int algo = 1; algo <= 2; algo++) {
        v.n = 0;
        CHECK_OK(k3c_tok_encode_piece(m, "abc", 3, algo, &v, &err), &err);
        CHECK(v.n == 1 && v.ids[0] == 256, "encode_piece algo %d: whole piece first", algo);
    }
    k3c_tok_ids_free(&v);
    k3c_tok_free(m);
}

static void test_specials(const k3c_tok *k3) {
    int32_t open = k3c_tok_special_id(k3, "<|open|>"), sep = k3c_tok_special_id(k3, "<|sep|>");
    CHECK(open == 163587 && sep == 163589 && k3c_tok_special_id(k3, "<|end_of_msg|>") == 163586 &&
              k3c_tok_special_id(k3, "[PAD]") == 163839 && k3c_tok_special_id(k3, "<|im_end|>") == -1,
          "K3 special ids");
    /* adjacent to text on both sides: the text runs are encoded on their own */
    k3c_tok_ids want = {0};
    append_plain(k3, "x", &want);
    k3c_tok_ids_push(&want, open);
    append_plain(k3, "message role", &want);
    k3c_tok_ids_push(&want, sep);
    k3c_tok_ids_push(&want, sep);
    append_plain(k3, "y z", &want);
    check_encode(k3, "x<|open|>message role<|sep|><|sep|>y z", K3C_TOK_ALLOW_SPECIAL, want.ids, want.n,
                 "specials adjacent to text");
    /* not a special: plain text even when specials are allowed; and specials are plain text when not allowed */
    want.n = 0;
    append_plain(k3, "<|not_a_real_token|>", &want);
    check_encode(k3, "<|not_a_real_token|>", K3C_TOK_ALLOW_SPECIAL, want.ids, want.n, "<|not_a_real_token|> is text");
    size_t n;
    int32_t *ids = encode(k3, "<|open|>", 8, 0, &n);
    CHECK(n > 1 && ids[0] != open, "disallowed specials are text");
    free(ids);
    /* an unfinished spelling followed by a real one */
    want.n = 0;
    append_plain(k3, "<|open|", &want);
    k3c_tok_ids_push(&want, sep);
    check_encode(k3, "<|open|<|sep|>", K3C_TOK_ALLOW_SPECIAL, want.ids, want.n, "partial spelling then a special");
    k3c_tok_ids_free(&want);
    /* every special decodes to its spelling */
    int ok = 1;
    for (int i = 0; i < k3c_tok_n_specials(k3); i++) {
        const char *s;
        size_t l;
        int32_t id;
        k3c_tok_special_at(k3, i, &s, &l, &id);
        ids = encode(k3, s, l, K3C_TOK_ALLOW_SPECIAL, &n);
        ok &= n == 1 && ids[0] == id;
        free(ids);
    }
    CHECK(ok, "each of the 256 specials encodes to its id");
}

static void test_chunking(k3c_tok *k3) {
    /* README: plain tiktoken gives 119 ids for 30,000 spaces + "end", the release's chunked encode 121 */
    size_t n = 30003;
    char *s = malloc(n + 1);
    memset(s, ' ', 30000);
    memcpy(s + 30000, "end", 4);
    size_t a, b;
    int32_t *x = encode(k3, s, n, K3C_TOK_ALLOW_SPECIAL, &a);
    int32_t *y = encode(k3, s, n, K3C_TOK_ALLOW_SPECIAL | K3C_TOK_NO_CHUNKING, &b);
    CHECK(a == 121 && b == 119, "chunked %zu (want 121), plain %zu (want 119)", a, b);
    free(x);
    free(y);
    free(s);
}

/* ---------------------------------------------------------------- trainer */
/* Reference BPE training, recounting every pair from scratch at each step (slow, obviously right): the same pieces, the
 * most frequent pair first, ties to the smaller (left, right), merged left to right; bytes that are already a token
 * reuse its id. Returns the learned ranks as a tokenizer built through the tiktoken text format. */
typedef struct {
    int32_t *sym;
    size_t n;
    int64_t count;
} ref_word;

static int cmp_piece(const void *a, const void *b) {
    const ref_word *x = a, *y = b;
    size_t n = x->n < y->n ? x->n : y->n;
    for (size_t i = 0; i < n; i++)
        if (x->sym[i] != y->sym[i]) return x->sym[i] < y->sym[i] ? -1 : 1;
    return x->n < y->n ? -1 : x->n > y->n;
}

static k3c_tok *reference_train(const char *text, size_t len, int32_t vocab) {
    size_t nw = 0;
    ref_word *w = malloc((len + 1) * sizeof *w);
    for (size_t i = 0; i < len;) {
        size_t e = k3c_tok_pretok_next(PK, (const unsigned char *)text, len, i);
        w[nw].sym = malloc((e - i) * sizeof *w[nw].sym);
        w[nw].n = e - i;
        w[nw].count = 1;
        for (size_t k = i; k < e; k++) w[nw].sym[k - i] = (unsigned char)text[k];
        nw++;
        i = e;
    }
    qsort(w, nw, sizeof *w, cmp_piece);
    size_t u = 0;
    for (size_t i = 0; i < nw; i++) {
        if (u && cmp_piece(&w[u - 1], &w[i]) == 0) {
            w[u - 1].count++;
            free(w[i].sym);
            continue;
        }
        w[u++] = w[i];
    }
    nw = u;
    char **tok = calloc((size_t)vocab, sizeof *tok);
    size_t *tl = calloc((size_t)vocab, sizeof *tl);
    int32_t nt = 256;
    for (int b = 0; b < 256; b++) {
        tok[b] = malloc(1);
        tok[b][0] = (char)b;
        tl[b] = 1;
    }
    size_t cap = 1 << 16;
    uint64_t *keys = malloc(cap * sizeof *keys);
    int64_t *cnt = malloc(cap * sizeof *cnt);
    while (nt < vocab) {
        memset(keys, 0xff, cap * sizeof *keys);
        uint64_t best = UINT64_MAX;
        int64_t bc = 0;
        for (size_t i = 0; i < nw; i++)
            for (size_t k = 0; k + 1 < w[i].n; k++) {
                uint64_t key = (uint64_t)w[i].sym[k] << 32 | (uint32_t)w[i].sym[k + 1];
                size_t h = (size_t)(key * 0x9E3779B97F4A7C15ull >> 40) & (cap - 1);
                while (keys[h] != key && keys[h] != UINT64_MAX) h = (h + 1) & (cap - 1);
                if (keys[h] == UINT64_MAX) {
                    keys[h] = key;
                    cnt[h] = 0;
                }
                cnt[h] += w[i].count;
                if (cnt[h] > bc || (cnt[h] == bc && key < best)) {
                    bc = cnt[h];
                    best = key;
                }
            }
        if (bc < 2) break;
        int32_t a = (int32_t)(best >> 32), b = (int32_t)(uint32_t)best, z = -1;
        char *cat = malloc(tl[a] + tl[b]);
        memcpy(cat, tok[a], tl[a]);
        memcpy(cat + tl[a], tok[b], tl[b]);
        for (int32_t r = 0; r < nt && z < 0; r++)
            if (tl[r] == tl[a] + tl[b] && memcmp(tok[r], cat, tl[r]) == 0) z = r;
        if (z < 0) {
            z = nt++;
            tok[z] = cat;
            tl[z] = tl[a] + tl[b];
        } else
            free(cat);
        for (size_t i = 0; i < nw; i++) {
            size_t o = 0;
            for (size_t k = 0; k < w[i].n; k++) {
                if (k + 1 < w[i].n && w[i].sym[k] == a && w[i].sym[k + 1] == b) {
                    w[i].sym[o++] = z;
                    k++;
                } else
                    w[i].sym[o++] = w[i].sym[k];
            }
            w[i].n = o;
        }
    }
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    char e[4096];
    for (int32_t r = 0; r < nt; r++) {
        size_t el = k3c_base64_encode((const unsigned char *)tok[r], tl[r], e);
        k3c_sbuf_append(&s, e, el);
        k3c_sbuf_printf(&s, " %d\n", r);
        free(tok[r]);
    }
    k3c_tok *t = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_tok_parse(s.buf, s.len, "reference", PK, 0, &t, &err), &err);
    k3c_sbuf_free(&s);
    for (size_t i = 0; i < nw; i++) free(w[i].sym);
    free(w);
    free(tok);
    free(tl);
    free(keys);
    free(cnt);
    return t;
}

static k3c_tok *train(const char *text, size_t n, int32_t vocab, const char *const *sp, int nsp) {
    k3c_tok_train_opts o = {.vocab_size = vocab, .pattern = PK, .specials = sp, .n_specials = nsp};
    k3c_tok *t = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_tok_train(&text, &n, 1, &o, &t, &err), &err);
    return t;
}

static int same_ranks(const k3c_tok *a, const k3c_tok *b) {
    if (k3c_tok_n_ranks(a) != k3c_tok_n_ranks(b)) return 0;
    for (int32_t r = 0; r < k3c_tok_n_ranks(a); r++) {
        const unsigned char *x, *y;
        size_t lx, ly;
        if (k3c_tok_token_bytes(a, r, &x, &lx, NULL) || k3c_tok_token_bytes(b, r, &y, &ly, NULL) || lx != ly ||
            memcmp(x, y, lx) != 0) {
            printf("  rank %d differs: \"%.*s\" vs \"%.*s\"\n", r, (int)lx, x, (int)ly, y);
            return 0;
        }
    }
    return 1;
}

static size_t count_ids(const k3c_tok *t, const char *text, size_t n) {
    size_t m;
    free(encode(t, text, n, 0, &m));
    return m;
}

/* k3c_tok_load_dir: a model directory's tiktoken.model + sidecar, the pattern k3c_tokenizer.json names (cl100k when
 * it is absent), an override, and a malformed k3c_tokenizer.json reported by name. */
static void test_load_dir(const k3c_tok *t, const char *dir) {
    char p[4300];
    k3c_err err = {0};
    k3c_tok *d = NULL;
    snprintf(p, sizeof p, "%s/" K3C_TOK_DIR_VOCAB, dir);
    CHECK_OK(k3c_tok_save(t, p, &err), &err);
    CHECK_OK(k3c_tok_load_dir(dir, NULL, &d, &err), &err);
    CHECK(d && k3c_tok_get_pattern(d) == K3C_TOK_PATTERN_CL100K && k3c_tok_n_vocab(d) == k3c_tok_n_vocab(t),
          "directory without k3c_tokenizer.json: cl100k with the specials");
    k3c_tok_free(d);
    snprintf(p, sizeof p, "%s/" K3C_TOK_DIR_SPEC, dir);
    const char *kimi = "{\"vocab\": \"tiktoken.model\", \"pattern\": \"kimi\"}\n", *bad = "{\"pattern\": 3}\n";
    CHECK_OK(k3c_write_file_atomic(p, kimi, strlen(kimi), &err), &err);
    CHECK_OK(k3c_tok_load_dir(dir, NULL, &d, &err), &err);
    CHECK(d && k3c_tok_get_pattern(d) == K3C_TOK_PATTERN_KIMI, "k3c_tokenizer.json names the pattern");
    k3c_tok_free(d);
    CHECK_OK(k3c_tok_load_dir(dir, "cl100k", &d, &err), &err);
    CHECK(d && k3c_tok_get_pattern(d) == K3C_TOK_PATTERN_CL100K, "an explicit pattern overrides the file");
    k3c_tok_free(d);
    CHECK_OK(k3c_write_file_atomic(p, bad, strlen(bad), &err), &err);
    CHECK(k3c_tok_load_dir(dir, NULL, &d, &err) == K3C_ECONFIG && !d && strstr(err.msg, K3C_TOK_DIR_SPEC) &&
              strstr(err.msg, "pattern"),
          "malformed k3c_tokenizer.json: '%s'", err.msg);
    CHECK(k3c_tok_load_dir(dir, "nope", &d, &err) == K3C_EINVAL && !d, "unknown pattern");
}

static void test_trainer(const char *text, size_t n) {
    /* against the from-scratch reference on 40 KB */
    k3c_tok *ref = reference_train(text, 40000, 700), *t = train(text, 40000, 700, NULL, 0);
    if (ref && t) CHECK(same_ranks(t, ref), "trained ranks differ from the reference trainer");
    k3c_tok_free(ref);
    k3c_tok_free(t);

    /* more merges, fewer tokens; every encoding round-trips */
    static const char *const sp[] = {"<|endoftext|>", "<|open|>"};
    size_t prev = n + 1;
    const int32_t sizes[] = {256, 400, 1000, 2000};
    for (int k = 0; k < 4; k++) {
        t = train(text, n, sizes[k], sp, 2);
        if (!t) return;
        size_t m = count_ids(t, text, n);
        CHECK(m < prev, "vocab %d: %zu ids, not fewer than %zu", sizes[k], m, prev);
        if (sizes[k] == 256) CHECK(m == n, "bytes only: one id per byte");
        if (getenv("K3C_TEST_VERBOSE")) printf("  trained vocab %d: %zu bytes -> %zu ids\n", sizes[k], n, m);
        prev = m;
        k3c_tok_free(t);
    }

    /* specials: cut out of the corpus, ids right above the ranks; determinism; the written files load back */
    k3c_sbuf c;
    k3c_sbuf_init(&c);
    for (int d = 0; d < 40; d++) {
        k3c_sbuf_append(&c, text + d * 2000, 2000);
        k3c_sbuf_append(&c, "<|endoftext|>", 13);
    }
    t = train(c.buf, c.len, 1000, sp, 2);
    k3c_tok *t2 = train(c.buf, c.len, 1000, sp, 2);
    if (!t || !t2) return;
    CHECK(k3c_tok_n_ranks(t) == 1000 && k3c_tok_special_id(t, "<|endoftext|>") == 1000 &&
              k3c_tok_special_id(t, "<|open|>") == 1001 && k3c_tok_n_vocab(t) == 1002,
          "trained sizes and special ids");
    CHECK(k3c_tok_rank_of(t, "<|", 2) < 0 && k3c_tok_rank_of(t, "endoftext", 9) < 0,
          "special spellings are not learned");
    const char *dir = test_tmpdir("tok_train");
    char p1[4200], p2[4200];
    snprintf(p1, sizeof p1, "%s/a.tiktoken", dir);
    snprintf(p2, sizeof p2, "%s/b.tiktoken", dir);
    k3c_err err = {0};
    CHECK_OK(k3c_tok_save(t, p1, &err), &err);
    CHECK_OK(k3c_tok_save(t2, p2, &err), &err);
    char *f1 = NULL, *f2 = NULL;
    size_t n1 = 0, n2 = 1;
    k3c_read_file(p1, &f1, &n1, NULL);
    k3c_read_file(p2, &f2, &n2, NULL);
    CHECK(f1 && f2 && n1 == n2 && memcmp(f1, f2, n1) == 0, "training is deterministic (identical files)");
    free(f1);
    free(f2);
    k3c_tok *back = NULL;
    CHECK_OK(k3c_tok_load_with_specials(p1, PK, 0, &back, &err), &err);
    test_load_dir(t, dir);
    if (back) {
        CHECK(same_ranks(back, t) && k3c_tok_special_id(back, "<|endoftext|>") == 1000 && k3c_tok_n_vocab(back) == 1002,
              "the saved vocabulary loads back equal");
        const char *probe = "Hello<|endoftext|>w\xc3\xb6rld \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 it's 12345\r\n";
        size_t a, b;
        int32_t *x = encode(t, probe, strlen(probe), K3C_TOK_ALLOW_SPECIAL, &a);
        int32_t *y = encode(back, probe, strlen(probe), K3C_TOK_ALLOW_SPECIAL, &b);
        CHECK(a == b && memcmp(x, y, a * sizeof *x) == 0, "loaded vocabulary encodes identically");
        size_t h = count_ids(t, "Hello", 5);
        CHECK(a > h && x[h] == 1000, "<|endoftext|> encodes to its id");
        check_round_trip(back, x, a, probe, strlen(probe), "trained vocabulary, unseen text");
        free(x);
        free(y);
    }
    k3c_tok_free(back);
    k3c_tok_free(t);
    k3c_tok_free(t2);
    k3c_sbuf_free(&c);
    k3c_tok_train_opts o = {.vocab_size = 100, .pattern = PK};
    CHECK(k3c_tok_train(&text, &n, 1, &o, &t, &err) == K3C_EINVAL, "vocab size below 256 is rejected");
}

/* `k3c tokenizer train / encode / decode` end to end. */
static void test_cli(const char *text, size_t n) {
    const char *dir = test_tmpdir("tok_cli");
    char corpus[4200], vocab[4200], out[4200], cmd[20000];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    snprintf(vocab, sizeof vocab, "%s/v.tiktoken", dir);
    snprintf(out, sizeof out, "%s/out.txt", dir);
    k3c_err err = {0};
    CHECK_OK(k3c_write_file_atomic(corpus, text, n, &err), &err);
    if (access(test_k3c_bin(), X_OK) != 0) {
        CHECK(0, "CLI binary %s not found (build it first)", test_k3c_bin());
        return;
    }
    snprintf(cmd, sizeof cmd, "%s tokenizer train --input %s %s --vocab-size 600 --out %s >%s 2>&1", test_k3c_bin(),
             corpus, corpus, vocab, out);
    CHECK(system(cmd) == 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "%s tokenizer encode --vocab %s --allow-special --text 'Hi<|endoftext|>there' >%s",
             test_k3c_bin(), vocab, out);
    CHECK(system(cmd) == 0, "%s", cmd);
    char *ids = NULL;
    size_t l;
    k3c_read_file(out, &ids, &l, NULL);
    CHECK(ids && strstr(ids, " 600 "), "encode output '%s' should hold the <|endoftext|> id 600", ids ? ids : "");
    if (ids && l) ids[l - 1] = 0;
    snprintf(cmd, sizeof cmd, "%s tokenizer decode --vocab %s --ids '%s' >%s", test_k3c_bin(), vocab, ids ? ids : "",
             out);
    free(ids);
    CHECK(system(cmd) == 0, "%s", cmd);
    char *dec = NULL;
    k3c_read_file(out, &dec, &l, NULL);
    CHECK(dec && l == 20 && memcmp(dec, "Hi<|endoftext|>there", 20) == 0, "CLI decode gives the text back");
    free(dec);
    snprintf(cmd, sizeof cmd, "%s tokenizer encode --vocab %s/missing --text x 2>%s", test_k3c_bin(), dir, out);
    CHECK(system(cmd) != 0, "a missing vocabulary fails");
}

int main(void) {
    test_base64();
    test_loader();
    test_pretok();
    k3c_tok *k3 = load_kimi("kimi_k3"), *k2 = load_kimi("kimi_k2");
    if (k3 && k2) {
        CHECK(k3c_tok_n_ranks(k3) == 163584 && k3c_tok_n_vocab(k3) == 163840 && k3c_tok_n_specials(k3) == 256,
              "kimi sizes: %d ranks, %d vocab, %d specials", k3c_tok_n_ranks(k3), k3c_tok_n_vocab(k3),
              k3c_tok_n_specials(k3));
        test_kimi_cases(k3, k2);
        test_kimi_long(k3);
        test_bpe_algorithms(k3);
        test_specials(k3);
        test_chunking(k3);
    }
    size_t n;
    char *text = jargon(400000, &n);
    test_trainer(text, 200000);
    test_cli(text, 100000);
    free(text);
    k3c_tok_free(k3);
    k3c_tok_free(k2);
    return test_summary();
}
