/* tok_fixture.h — helpers shared by test_tok.c and test_tok_input.c: the Kimi tokenizer loader, the decode round trip
 * check and Jargon File text. Static functions, each used by both programs; include once, after test.h. */
#ifndef K3C_TOK_FIXTURE_H
#define K3C_TOK_FIXTURE_H

#include "test.h"

#include "tok/tok.h"

static k3c_tok *load_kimi(const char *table) {
    k3c_err err = {0};
    k3c_tok *t = NULL;
    CHECK_OK(k3c_tok_load_kimi(test_shared("golden/kimi_tokenizer/tiktoken.model"),
                               test_shared("golden/kimi_tokenizer/special_tokens.json"), table, &t, &err),
             &err);
    return t;
}

/* Checks decode(ids) == text exactly. */
static void check_round_trip(const k3c_tok *t, const int32_t *ids, size_t n, const char *text, size_t len,
                             const char *what) {
    char *back = NULL;
    size_t bl = 0;
    k3c_err err = {0};
    CHECK_OK(k3c_tok_decode(t, ids, n, &back, &bl, &err), &err);
    CHECK(back && bl == len && memcmp(back, text, len) == 0, "%s: decode(encode(text)) != text", what);
    free(back);
}

/* Real text for speed and training: the first `max` bytes of the Jargon File. */
static char *jargon(size_t max, size_t *n) {
    FILE *p = popen("gzip -dc /usr/share/doc/jargon-text/jargon.txt.gz", "r");
    char *buf = malloc(max + 1);
    *n = p ? fread(buf, 1, max, p) : 0;
    char sink[65536];
    while (p && fread(sink, 1, sizeof sink, p) > 0) {}
    if (p) pclose(p);
    buf[*n] = 0;
    CHECK(*n == max, "cannot read /usr/share/doc/jargon-text/jargon.txt.gz (Debian package jargon-text)");
    return buf;
}

#endif
