/* test_tok_parity.c — cl100k ids byte-identical to the npm package gpt-tokenizer 4.0.0 run by node (docs/TRAINING.md §7.4,
 * docs/FORMATS.md §8.4) on > 3 MB of real and hand-written text, plus exact round-trip decoding.
 *
 * gpt-tokenizer is installed on demand into build/npm; missing node/npm is a failure, not a skip. Our cl100k vocabulary is
 * the package's own data/cl100k_base.tiktoken. Texts avoid the three places where gpt-tokenizer (JavaScript regex) and
 * tiktoken (Rust regex, which k3c follows) define the pattern differently: U+0085 (\s in Rust only), U+FEFF (\s in
 * JavaScript only) and "'ſ" (a contraction under Unicode case folding in Rust only). */
#include "test.h"

#include "base/json.h"
#include "tok/tok.h"

#define NPM_PREFIX "build/npm"
#define PKG NPM_PREFIX "/node_modules/gpt-tokenizer"

typedef struct {
    k3c_sbuf text;  /* all documents back to back */
    k3c_sbuf index; /* "start end allow" lines */
    int ndocs;
} corpus;

static void add_doc(corpus *c, const char *s, size_t n, int allow) {
    size_t start = c->text.len;
    k3c_sbuf_append(&c->text, s, n);
    k3c_sbuf_printf(&c->index, "%zu %zu %d\n", start, c->text.len, allow);
    c->ndocs++;
}

/* Splits a text into documents of about `target` bytes at line ends. */
static void add_split(corpus *c, const char *s, size_t n, size_t target) {
    size_t i = 0;
    while (i < n) {
        size_t e = i + target < n ? i + target : n;
        while (e < n && s[e - 1] != '\n') e++;
        add_doc(c, s + i, e - i, 0);
        i = e;
    }
}

/* The decompressed bytes [from, from + max) of a .gz file, cut back to a line end. */
static char *read_gz(const char *path, size_t from, size_t max, size_t *n) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "gzip -dc '%s'", path);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    char *buf = malloc(from + max);
    size_t got = fread(buf, 1, from + max, p);
    char sink[65536];
    while (fread(sink, 1, sizeof sink, p) > 0) {}
    int rc = pclose(p);
    if (got <= from || (rc != 0 && got < from + max)) {
        free(buf);
        return NULL;
    }
    size_t e = got;
    while (e > from && buf[e - 1] != '\n') e--;
    size_t s = from;
    while (s > 0 && s < e && buf[s - 1] != '\n') s++; /* start on a line */
    memmove(buf, buf + s, e - s);
    *n = e - s;
    return buf;
}

/* Hand-written stress text: scripts, marks, emoji, supplementary planes, digits, whitespace runs, contractions. */
static const char *const stress[] = {
    "It's Bob's; they're here, we'll see, I'd go, you've won, don't. IT'S I'LL WE'RE THEY'VE I'M YOU'D DON'T",
    "'s 'S 't 'T 're 'RE 'rE 've 'VE 'm 'M 'll 'LL 'lL 'd 'D ''s '''ll x's x'S O'Neil's rock'n'roll 'sbar 'llama 'dd",
    "camelCaseIdentifier XMLHttpRequest getHTTPResponseCode snake_case_var __init__ SCREAMING_CASE iPhone eBay "
    "McDonald",
    "1 12 123 1234 12345 123456 1234567 3.14159 1,000,000 0x7fff 1st 2nd 3rd 12345678901234567890 -42 +7 1e-10",
    "\xd9\xa3\xd9\xa4\xd9\xa5\xd9\xa6 \xe2\x91\xa0\xe2\x91\xa1\xe2\x91\xa2 \xe2\x85\xab\xe2\x85\xa0 \xc2\xb2\xc2\xb3 "
    "\xf0\x9d\x9f\x98\xf0\x9d\x9f\x99\xf0\x9d\x9f\x9a\xf0\x9d\x9f\x9b",
    "a  b   c    d     e      f\t\tg\t \th \t i\n\nj\n\n\nk\r\nl\r\n\r\nm\r\r\n\nn \n o  \n  p\t\n\tq",
    "   leading spaces\n    \n        indented\n\t\ttabs\n \t \t mixed\n\n\n\n\n",
    "trailing spaces   \ntrailing tab\t\ntrailing mixed \t \n   \n\t\n",
    "\xe3\x80\x80\xe3\x80\x80ideographic\xe3\x80\x80space \xc2\xa0nbsp\xc2\xa0\xc2\xa0x \xe2\x80\x83"
    "em\xe2\x80\x83\xe2\x80\x83space "
    "\xe2\x80\xa8line sep\xe2\x80\xa9para sep \xe1\x9a\x80ogham \xe2\x80\xaf\xe2\x81\x9f\x0b\x0c vt ff",
    "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd "
    "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7\xe2\x80\x8d"
    "\xf0\x9f\x91\xa6 \xf0\x9f\x87\xaf\xf0\x9f\x87\xb5 \xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80 "
    "\xe2\x9d\xa4\xef\xb8\x8f "
    "1\xef\xb8\x8f\xe2\x83\xa3 \xf0\x9f\x80\x84 emoji\xf0\x9f\x8e\x89"
    "end \xf0\x9f\x92\xbb\xf0\x9f\x94\xa5!",
    "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xef\xbc\x81 "
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae"
    "\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88\xe3\x80\x82\xe3\x82\xab\xe3\x82\xbf\xe3\x82\xab\xe3\x83\x8a "
    "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xed\x85\x8d\xec\x8a\xa4\xed\x8a\xb8 \xe4\xb8\xad\xe6\x96\x87"
    "English\xe6\xb7\xb7"
    "\xe5\x90\x88"
    "123 \xf0\xa0\x80\x80\xf0\xa0\x80\x81 \xe3\x80\x85\xe3\x80\x87",
    "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xd8\xa8\xd8\xa7\xd9\x84\xd8\xb9\xd8\xa7\xd9\x84\xd9\x85 "
    "\xd8\xa7\xd9\x84\xd8\xb9\xd9\x8e\xd8\xb1\xd9\x8e\xd8\xa8\xd9\x90\xd9\x8a\xd9\x8e\xd9\x91\xd8\xa9 "
    "\xd7\xa9\xd7\x81\xd6\xb8\xd7\x9c\xd7\x95\xd6\xb9\xd7\x9d "
    "\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4"
    "\xe0\xa5\x87 \xe0\xb8\xaa\xe0\xb8\xa7\xe0\xb8\xb1\xe0\xb8\xaa\xe0\xb8\x94\xe0\xb8\xb5",
    "e\xcc\x81 a\xcc\x88\xcc\x84 Z\xcd\x91\xcd\x92\xcd\x93 \xcc\x81start x\xcc\x81\xcc\x82\xcc\x83y "
    "na\xc3\xafve caf\xc3\xa9 r\xc3\xa9sum\xc3\xa9 \xc3\x85ngstr\xc3\xb6m stra\xc3\x9f\xc3\x9f \xef\xac\x81x "
    "\xc7\x85ungla "
    "\xca\xb0\xca\xb0 \xc2\xaa\xc2\xba",
    "\xce\x95\xce\xbb\xce\xbb\xce\xb7\xce\xbd\xce\xb9\xce\xba\xce\xac "
    "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82, "
    "\xd0\xbc\xd0\xb8\xd1\x80! \xce\xa3\xce\x8a\xce\xa3\xce\xa5\xce\xa6\xce\x9f\xce\xa3 "
    "\xf0\x9d\x94\x98\xf0\x9d\x94\xab\xf0\x9d\x94\xa6\xf0\x9d\x94\xa0 \xf0\x93\x80\x80\xf0\x93\x80\x81",
    "for (int i = 0; i < n; i++) {\n\treturn x->y[i] << 2;\n}\n    def f(self):\n        pass  # done\n\n",
    "!!!??? ...\n\n\xe2\x80\x94\xe2\x80\x93- \xc2\xab\xc2\xbb\xe2\x80\x9e\xe2\x80\x9c $$$ "
    "#!/bin/bash\n<|not_a_real_token|> "
    "<|endoftext|> <<|endoftext|>> <|endoftext| \x01\x02\x1c\x1d\x1e\x1f\x7f",
};

/* Atoms whose ordered triples probe every boundary between character classes, each triple its own document. */
static const char *const atoms[] = {
    "a",
    "Ab",
    "1",
    "12345",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "'s",
    "'LL",
    "!",
    "\xe3\x80\x82",
    "\xe4\xbd\xa0",
    "\xc3\xa9",
    "\xcc\x81",
    "\xf0\x9f\x98\x80",
    "\xc2\xa0",
    "\xe3\x80\x80",
    "-",
    "_",
};

static void build_corpus(corpus *c, size_t *real_bytes) {
    size_t n;
    char *py = read_gz("/usr/share/info/python3.11.info.gz", 5u << 20, 1536u << 10, &n);
    CHECK(py != NULL, "cannot read /usr/share/info/python3.11.info.gz (Debian package python3.11-doc)");
    if (py) {
        add_split(c, py, n, 48 << 10);
        *real_bytes += n;
    }
    free(py);
    char *jargon = read_gz("/usr/share/doc/jargon-text/jargon.txt.gz", 0, 4u << 20, &n);
    CHECK(jargon != NULL, "cannot read /usr/share/doc/jargon-text/jargon.txt.gz (Debian package jargon-text)");
    if (jargon) {
        add_split(c, jargon, n, 48 << 10);
        *real_bytes += n;
    }
    free(jargon);
    k3c_sbuf all;
    k3c_sbuf_init(&all);
    for (size_t i = 0; i < sizeof stress / sizeof *stress; i++) {
        add_doc(c, stress[i], strlen(stress[i]), 0);
        k3c_sbuf_append(&all, stress[i], strlen(stress[i]));
        k3c_sbuf_append(&all, i % 3 ? "\n" : " \n\n", i % 3 ? 1 : 3);
    }
    add_doc(c, all.buf, all.len, 0); /* all of it at once, so whitespace meets other scripts */
    k3c_sbuf_free(&all);
    char spaces[3000];
    memset(spaces, ' ', sizeof spaces);
    for (size_t k = 1; k <= sizeof spaces; k = k * 3 + 1) {
        add_doc(c, spaces, k, 0);
        k3c_sbuf_init(&all);
        k3c_sbuf_printf(&all, "x%.*sy\n%.*s", (int)k, spaces, (int)k, spaces);
        add_doc(c, all.buf, all.len, 0);
        k3c_sbuf_free(&all);
    }
    size_t na = sizeof atoms / sizeof *atoms;
    for (size_t i = 0; i < na; i++)
        for (size_t j = 0; j < na; j++)
            for (size_t k = 0; k < na; k++) {
                char d[64];
                int l = snprintf(d, sizeof d, "%s%s%s", atoms[i], atoms[j], atoms[k]);
                add_doc(c, d, (size_t)l, 0);
            }
    static const char *const with_specials[] = {
        "Hello<|endoftext|>world<|im_start|>user<|im_sep|>hi there<|im_end|>\n",
        "<|endoftext|><|endoftext|> <|endoftext|> x<|endoftext|>y <|fim_prefix|>a<|fim_middle|>b<|fim_suffix|>",
        "<|not_a_real_token|> <|endoftext| <<|endoftext|>> <|endofprompt|>  \n<|endoftext|>\n\n",
    };
    for (size_t i = 0; i < 3; i++) add_doc(c, with_specials[i], strlen(with_specials[i]), 1);
}

/* Runs npm install when the package is missing; 0 when gpt-tokenizer 4.0.0 is usable. */
static int ensure_npm(void) {
    if (system("command -v node >/dev/null 2>&1") != 0 || system("command -v npm >/dev/null 2>&1") != 0) {
        printf("FAIL: node and npm are required for the cl100k parity test (Debian: apt-get install nodejs npm; "
               "or run `make setup`)\n");
        return -1;
    }
    char *pkg = NULL;
    size_t n;
    k3c_read_file(PKG "/package.json", &pkg, &n, NULL);
    int have = pkg && strstr(pkg, "\"version\": \"4.0.0\"") && access(PKG "/data/cl100k_base.tiktoken", R_OK) == 0;
    free(pkg);
    if (have) return 0;
    printf("installing gpt-tokenizer@4.0.0 into " NPM_PREFIX " ...\n");
    if (system("npm install --prefix " NPM_PREFIX " gpt-tokenizer@4.0.0 --no-audit --no-fund --loglevel=error "
               ">build/npm-install.log 2>&1") != 0) {
        printf("FAIL: npm install --prefix " NPM_PREFIX " gpt-tokenizer@4.0.0 failed (see build/npm-install.log)\n");
        return -1;
    }
    return 0;
}

static k3c_tok *load_cl100k(void) {
    k3c_err err = {0};
    k3c_tok *t = NULL;
    CHECK_OK(k3c_tok_load(PKG "/data/cl100k_base.tiktoken", K3C_TOK_PATTERN_CL100K, 0, &t, &err), &err);
    static const struct {
        const char *s;
        int32_t id;
    } sp[] = {
        {"<|endoftext|>", 100257}, {"<|fim_prefix|>", 100258}, {"<|fim_middle|>", 100259}, {"<|fim_suffix|>", 100260},
        {"<|im_start|>", 100264},  {"<|im_end|>", 100265},     {"<|im_sep|>", 100266},     {"<|endofprompt|>", 100276},
    };
    for (size_t i = 0; t && i < sizeof sp / sizeof *sp; i++)
        CHECK_OK(k3c_tok_add_special(t, sp[i].s, strlen(sp[i].s), sp[i].id, &err), &err);
    if (t) CHECK(k3c_tok_n_ranks(t) == 100256, "cl100k has %d ranks, want 100256", k3c_tok_n_ranks(t));
    return t;
}

/* Prints where two id lists part, with the text around it. */
static void show_mismatch(const k3c_tok *t, const char *text, const int32_t *got, size_t ng, const uint32_t *want,
                          size_t nw) {
    size_t i = 0, off = 0;
    while (i < ng && i < nw && (uint32_t)got[i] == want[i]) {
        const unsigned char *b;
        size_t l;
        k3c_tok_token_bytes(t, got[i], &b, &l, NULL);
        off += l;
        i++;
    }
    printf("  first difference at id %zu (byte %zu), text there: \"%.40s\"\n  ours:", i, off, text + off);
    for (size_t k = i; k < ng && k < i + 8; k++) printf(" %d", got[k]);
    printf("\n  gpt-tokenizer:");
    for (size_t k = i; k < nw && k < i + 8; k++) printf(" %u", want[k]);
    printf("\n");
}

static void compare(const k3c_tok *t, const corpus *c, const uint32_t *want, size_t nwant) {
    size_t pos = 0, total = 0, bad_docs = 0, bad_trips = 0;
    const char *line = c->index.buf;
    double enc_s = 0;
    k3c_tok_ids v = {0};
    for (int d = 0; d < c->ndocs; d++) {
        size_t s, e;
        int allow, used;
        if (sscanf(line, "%zu %zu %d%n", &s, &e, &allow, &used) != 3) {
            CHECK(0, "bad index line");
            break;
        }
        line += used + 1;
        if (pos >= nwant || pos + 1 + want[pos] > nwant) {
            CHECK(0, "node output truncated at document %d", d);
            break;
        }
        size_t nw = want[pos];
        v.n = 0;
        double t0 = k3c_now();
        k3c_err err = {0};
        CHECK_OK(k3c_tok_encode(t, c->text.buf + s, e - s, allow ? K3C_TOK_ALLOW_SPECIAL : 0, &v, &err), &err);
        enc_s += k3c_now() - t0;
        int same = v.n == nw && (nw == 0 || memcmp(v.ids, want + pos + 1, nw * sizeof *want) == 0);
        if (!same && bad_docs++ < 3) {
            printf("FAIL document %d (%zu bytes, allow_special %d): %zu ids vs gpt-tokenizer's %zu\n", d, e - s, allow,
                   v.n, nw);
            show_mismatch(t, c->text.buf + s, v.ids, v.n, want + pos + 1, nw);
        }
        char *back = NULL;
        size_t bl = 0;
        k3c_tok_decode(t, v.ids, v.n, &back, &bl, NULL);
        if (!back || bl != e - s || memcmp(back, c->text.buf + s, bl) != 0) bad_trips++;
        free(back);
        total += nw;
        pos += 1 + nw;
    }
    k3c_tok_ids_free(&v);
    CHECK(bad_docs == 0, "%zu of %d documents differ from gpt-tokenizer", bad_docs, c->ndocs);
    CHECK(bad_trips == 0, "%zu documents do not round-trip through decode", bad_trips);
    CHECK(pos == nwant, "node wrote %zu words, %zu compared", nwant, pos);
    double mbps = (double)c->text.len / 1e6 / (enc_s > 0 ? enc_s : 1e-9);
    CHECK(mbps >= 1.0, "cl100k encode speed %.2f MB/s < 1 MB/s", mbps);
    printf("parity: %d documents, %zu bytes, %zu ids identical; encode %.1f MB/s on one core\n", c->ndocs, c->text.len,
           total, mbps);
}

int main(void) {
    if (ensure_npm() != 0) {
        test_failed_++;
        return test_summary();
    }
    corpus c = {.ndocs = 0};
    k3c_sbuf_init(&c.text);
    k3c_sbuf_init(&c.index);
    size_t real = 0;
    build_corpus(&c, &real);
    CHECK(real >= (1u << 20), "only %zu bytes of real text", real);
    const char *dir = test_tmpdir("tok_parity");
    char docs[4200], idx[4200], out[4200], cmd[17000];
    snprintf(docs, sizeof docs, "%s/docs.bin", dir);
    snprintf(idx, sizeof idx, "%s/docs.idx", dir);
    snprintf(out, sizeof out, "%s/expected.bin", dir);
    k3c_err err = {0};
    CHECK_OK(k3c_write_file_atomic(docs, c.text.buf, c.text.len, &err), &err);
    CHECK_OK(k3c_write_file_atomic(idx, c.index.buf, c.index.len, &err), &err);
    snprintf(cmd, sizeof cmd, "node tools/tok_parity.mjs " NPM_PREFIX " '%s' '%s' '%s'", docs, idx, out);
    double t0 = k3c_now();
    fflush(stdout);
    int rc = system(cmd);
    CHECK(rc == 0, "node tools/tok_parity.mjs failed (exit %d)", rc);
    printf("node: %.1f s\n", k3c_now() - t0);
    char *want = NULL;
    size_t nw = 0;
    k3c_tok *t = load_cl100k();
    if (rc == 0 && t) {
        CHECK_OK(k3c_read_file(out, &want, &nw, &err), &err);
        if (want) compare(t, &c, (const uint32_t *)want, nw / 4);
    }
    free(want);
    k3c_tok_free(t);
    k3c_sbuf_free(&c.text);
    k3c_sbuf_free(&c.index);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (test_failed_ == 0 && system(cmd) != 0) printf("warning: cannot remove %s\n", dir);
    return test_summary();
}
