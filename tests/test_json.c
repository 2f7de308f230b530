/* test_json.c — the strict JSON reader and sbuf writer (src/base/json.c): valid documents, every rejection case with
 * its line:column message, exact int64 integers, \u escapes and surrogate pairs, and number / string round trips. */
#include "test.h"

#include "base/json.h"

static k3c_json *parse_ok(const char *text) {
    k3c_json *v = NULL;
    k3c_err err = {0};
    int rc = k3c_json_parse(text, strlen(text), "t.json", &v, &err);
    CHECK(rc == K3C_OK && v, "parse of %s failed: %s", text, err.msg);
    return v;
}

/* Expects rejection with a message "t.json:line:col: ..." containing `why`. */
static void reject(const char *text, size_t n, const char *where, const char *why) {
    k3c_json *v = (k3c_json *)1;
    k3c_err err = {0};
    int rc = k3c_json_parse(text, n, "t.json", &v, &err);
    CHECK(rc == K3C_EFORMAT && v == NULL, "accepted invalid JSON %.60s (rc %d)", text, rc);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "t.json:%s: ", where);
    CHECK(strncmp(err.msg, prefix, strlen(prefix)) == 0, "%.60s: message '%s' lacks position '%s'", text, err.msg,
          prefix);
    CHECK(strstr(err.msg, why) != NULL, "%.60s: message '%s' lacks '%s'", text, err.msg, why);
}
#define REJECT(text, where, why) reject(text, strlen(text), where, why)

static void test_valid(void) {
    const char *doc =
        "{\n  \"a\": [1, -2.5e3, true, false, null, \"x\"],\n  \"b\": {\"c\": {}}, \"d\": [], \"e\": 0.125\n}";
    k3c_json *v = parse_ok(doc);
    if (!v) return;
    CHECK(v->type == K3C_JSON_OBJECT && v->n == 4, "object of 4");
    CHECK(strcmp(v->keys[0], "a") == 0 && strcmp(v->keys[3], "e") == 0, "keys in document order");
    const k3c_json *a = k3c_json_get(v, "a");
    CHECK(a && a->type == K3C_JSON_ARRAY && a->n == 6, "array of 6");
    if (a && a->n == 6) {
        CHECK(a->items[0].type == K3C_JSON_NUMBER && a->items[0].is_integer && a->items[0].integer == 1, "1");
        CHECK(a->items[1].number == -2500.0 && !a->items[1].is_integer, "-2.5e3");
        CHECK(a->items[2].type == K3C_JSON_BOOL && a->items[2].boolean == 1, "true");
        CHECK(a->items[3].type == K3C_JSON_BOOL && a->items[3].boolean == 0, "false");
        CHECK(a->items[4].type == K3C_JSON_NULL, "null");
        CHECK(a->items[5].type == K3C_JSON_STRING && strcmp(a->items[5].string, "x") == 0 && a->items[5].len == 1, "x");
    }
    const k3c_json *b = k3c_json_get(v, "b");
    CHECK(b && k3c_json_get(b, "c") && k3c_json_get(b, "c")->type == K3C_JSON_OBJECT && k3c_json_get(b, "c")->n == 0,
          "{}");
    CHECK(k3c_json_get(v, "zz") == NULL && k3c_json_get(a, "a") == NULL, "absent key / not an object");
    CHECK(k3c_json_get(v, "e")->number == 0.125, "0.125");
    k3c_json_free(v);

    /* Any value may be the top level (RFC 8259), with surrounding whitespace. */
    v = parse_ok(" \t\r\n42 \n");
    CHECK(v && v->is_integer && v->integer == 42, "top-level number");
    k3c_json_free(v);
    v = parse_ok("\"s\"");
    CHECK(v && v->type == K3C_JSON_STRING, "top-level string");
    k3c_json_free(v);
    /* A document need not be NUL-terminated: parse a prefix of a buffer. */
    k3c_json *w = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_json_parse("[7]xyz", 3, "t.json", &w, &err), &err);
    CHECK(w && w->n == 1 && w->items[0].integer == 7, "bounded by n");
    k3c_json_free(w);
}

static void test_integers(void) {
    k3c_json *v =
        parse_ok("[9223372036854775807, -9223372036854775808, 9223372036854775808, 123456789012345678, -0, 1e2, 1.0]");
    if (!v) return;
    CHECK(v->items[0].is_integer && v->items[0].integer == INT64_MAX, "INT64_MAX exact");
    CHECK(v->items[1].is_integer && v->items[1].integer == INT64_MIN, "INT64_MIN exact");
    CHECK(!v->items[2].is_integer && v->items[2].number == 9223372036854775808.0, "2^63 is a double only");
    CHECK(v->items[3].is_integer && v->items[3].integer == 123456789012345678LL, "beyond 2^53 exact");
    CHECK(v->items[4].is_integer && v->items[4].integer == 0 && signbit(v->items[4].number), "-0");
    CHECK(!v->items[5].is_integer && v->items[5].number == 100.0, "1e2 has an exponent: not an integer literal");
    CHECK(!v->items[6].is_integer && v->items[6].number == 1.0, "1.0 has a fraction");
    k3c_json_free(v);
    v = parse_ok("[1E+2, 1e-2, 2.5E-1, 0.0, -0.5, 4.9e-324, 1e-400]");
    if (!v) return;
    CHECK(v->items[0].number == 100 && v->items[1].number == 0.01 && v->items[2].number == 0.25, "exponents");
    CHECK(v->items[3].number == 0 && v->items[4].number == -0.5, "fractions");
    CHECK(v->items[5].number == 4.9e-324, "smallest subnormal");
    CHECK(v->items[6].number == 0, "underflow to zero is allowed");
    k3c_json_free(v);
}

static void test_strings(void) {
    k3c_json *v =
        parse_ok("[\"\\\"\\\\\\/\\b\\f\\n\\r\\t\", \"\\u0041\\u00e9\\u20ac\", \"\\ud83d\\ude00\", \"a\\u0000b\", "
                 "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\", \"\\uD834\\uDD1E\"]");
    if (!v) return;
    CHECK(strcmp(v->items[0].string, "\"\\/\b\f\n\r\t") == 0 && v->items[0].len == 8, "simple escapes");
    CHECK(strcmp(v->items[1].string, "A\xc3\xa9\xe2\x82\xac") == 0, "BMP \\u escapes to UTF-8");
    CHECK(strcmp(v->items[2].string, "\xf0\x9f\x98\x80") == 0, "surrogate pair U+1F600 -> 4-byte UTF-8");
    CHECK(v->items[3].len == 3 && memcmp(v->items[3].string, "a\0b", 4) == 0, "embedded NUL kept, len 3");
    CHECK(strcmp(v->items[4].string, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80") == 0, "raw UTF-8 passes");
    CHECK(strcmp(v->items[5].string, "\xf0\x9d\x84\x9e") == 0, "upper-case hex surrogates U+1D11E");
    k3c_json_free(v);
    /* Keys differing only after an embedded NUL are distinct. */
    v = parse_ok("{\"a\\u0000x\": 1, \"a\\u0000y\": 2}");
    CHECK(v && v->n == 2, "NUL-distinguished keys are not duplicates");
    k3c_json_free(v);
}

static void test_rejections(void) {
    REJECT("", "1:1", "empty document");
    REJECT("  \n ", "2:2", "empty document");
    REJECT("[1, 2,]", "1:7", "trailing comma");
    REJECT("{\"a\": 1,}", "1:9", "trailing comma");
    REJECT("{\"a\": 1 // c\n}", "1:9", "expected ','");
    REJECT("// c\n{}", "1:1", "comments");
    REJECT("/* c */ {}", "1:1", "comments");
    REJECT("[NaN]", "1:2", "NaN");
    REJECT("[Infinity]", "1:2", "Infinity");
    REJECT("[-Infinity]", "1:2", "Infinity");
    REJECT("[01]", "1:2", "leading zero");
    REJECT("[-01]", "1:3", "leading zero");
    REJECT("[1.]", "1:4", "after '.'");
    REJECT("[.5]", "1:2", "unexpected '.'");
    REJECT("[+1]", "1:2", "unexpected '+'");
    REJECT("[1e]", "1:4", "exponent");
    REJECT("[-]", "1:3", "expected a digit");
    REJECT("[1e999]", "1:2", "out of range");
    REJECT("[0x10]", "1:3", "expected ','");
    REJECT("[\"a\tb\"]", "1:4", "control character");
    REJECT("[\"a\nb\"]", "1:4", "control character");
    REJECT("[\"\\x\"]", "1:3", "invalid escape");
    REJECT("[\"\\u12g4\"]", "1:3", "\\u escape");
    REJECT("[\"\\ud800\"]", "1:3", "high surrogate");
    REJECT("[\"\\ud800\\u0041\"]", "1:3", "high surrogate");
    REJECT("[\"\\udc00\"]", "1:3", "lone low surrogate");
    REJECT("[\"abc]", "1:2", "unterminated string");
    REJECT("[\"\xff\"]", "1:3", "invalid UTF-8");
    REJECT("[\"\xc0\xaf\"]", "1:3", "invalid UTF-8");         /* overlong '/' */
    REJECT("[\"\xe0\x80\xaf\"]", "1:3", "invalid UTF-8");     /* overlong 3-byte */
    REJECT("[\"\xed\xa0\x80\"]", "1:3", "invalid UTF-8");     /* encoded surrogate */
    REJECT("[\"\xf4\x90\x80\x80\"]", "1:3", "invalid UTF-8"); /* > U+10FFFF */
    REJECT("[\"\xc3\"]", "1:3", "invalid UTF-8");             /* truncated sequence */
    REJECT("{\"a\": 1, \"b\": 2, \"a\": 3}", "1:18", "duplicate key \"a\"");
    REJECT("{} x", "1:4", "trailing garbage");
    REJECT("[1] [2]", "1:5", "trailing garbage");
    REJECT("{1: 2}", "1:2", "string key");
    REJECT("{'a': 2}", "1:2", "string key");
    REJECT("{\"a\" 2}", "1:6", "expected ':'");
    REJECT("[1 2]", "1:4", "expected ','");
    REJECT("[1,", "1:4", "end of input");
    REJECT("{\"a\":1", "1:7", "end of input");
    REJECT("[tru]", "1:2", "expected true");
    REJECT("[True]", "1:2", "unexpected 'T'");
    REJECT("[nul", "1:2", "expected null");
    REJECT("\xef\xbb\xbf{}", "1:1", "byte 0xef");
    reject("[\"a\0b\"]", 7, "1:4", "control character"); /* raw NUL byte */
    reject("[1]\0", 4, "1:4", "trailing garbage");
}

/* 512 nested arrays are fine, 513 are not; a large object (hashed duplicate check) finds its duplicate. */
static void test_limits(void) {
    char buf[2 * 520 + 8];
    for (int depth = 512; depth <= 513; depth++) {
        size_t k = 0;
        for (int i = 0; i < depth; i++) buf[k++] = '[';
        for (int i = 0; i < depth; i++) buf[k++] = ']';
        k3c_json *v = NULL;
        k3c_err err = {0};
        int rc = k3c_json_parse(buf, k, "deep.json", &v, &err);
        if (depth == 512)
            CHECK(rc == K3C_OK, "depth 512 accepted: %s", err.msg);
        else
            CHECK(rc == K3C_EFORMAT && strstr(err.msg, "deep.json:1:513: nesting deeper than 512"), "depth 513: %s",
                  err.msg);
        k3c_json_free(v);
    }
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    k3c_sbuf_append(&s, "{", 1);
    for (int i = 0; i < 5000; i++) k3c_sbuf_printf(&s, "%s\"k%d\": %d", i ? ", " : "", i, i);
    size_t good = s.len;
    k3c_sbuf_append(&s, "}", 1);
    k3c_json *v = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_json_parse(s.buf, s.len, "big.json", &v, &err), &err);
    CHECK(v && v->n == 5000 && k3c_json_get(v, "k4999")->integer == 4999, "5000 keys");
    k3c_json_free(v);
    s.len = good;
    k3c_sbuf_append(&s, ", \"k1234\": 0}", 13);
    v = NULL;
    CHECK(k3c_json_parse(s.buf, s.len, "big.json", &v, &err) == K3C_EFORMAT &&
              strstr(err.msg, "duplicate key \"k1234\""),
          "duplicate among 5001 keys: %s", err.msg);
    CHECK(v == NULL, "no value on error");
    k3c_sbuf_free(&s);
}

static void test_writer(void) {
    double xs[] = {0.1,
                   1.0 / 3,
                   1e-300,
                   4.9e-324,
                   1.7976931348623157e308,
                   -2.5,
                   100,
                   1e21,
                   123456789012345680.0,
                   0.30000000000000004,
                   5e-7,
                   -0.0,
                   2.0 / 3,
                   1e100};
    for (size_t i = 0; i < sizeof xs / sizeof *xs; i++) {
        k3c_sbuf s;
        k3c_sbuf_init(&s);
        k3c_sbuf_json_number(&s, xs[i]);
        k3c_json *v = NULL;
        k3c_err err = {0};
        int rc = k3c_json_parse(s.buf, s.len, "num", &v, &err);
        CHECK(rc == K3C_OK && v->type == K3C_JSON_NUMBER && v->number == xs[i] && signbit(v->number) == signbit(xs[i]),
              "number %.17g written as '%s' does not round-trip", xs[i], s.buf);
        k3c_json_free(v);
        k3c_sbuf_free(&s);
    }
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    k3c_sbuf_json_number(&s, 0.1);
    CHECK(strcmp(s.buf, "0.1") == 0, "shortest form: 0.1 -> '%s'", s.buf);
    s.len = 0;
    k3c_sbuf_json_number(&s, 1.0 / 3);
    CHECK(strcmp(s.buf, "0.3333333333333333") == 0, "1/3 needs 16 digits: '%s'", s.buf);
    s.len = 0;
    k3c_sbuf_json_number(&s, 0.30000000000000004);
    CHECK(strcmp(s.buf, "0.30000000000000004") == 0, "17 digits: '%s'", s.buf);
    s.len = 0;
    k3c_sbuf_json_number(&s, NAN);
    k3c_sbuf_json_number(&s, INFINITY);
    CHECK(strcmp(s.buf, "nullnull") == 0, "non-finite -> null: '%s'", s.buf);
    s.len = 0;

    /* Every byte 1..255 that forms valid UTF-8, plus NUL, quotes and backslashes, survives write + parse. */
    const char raw[] = "q\"b\\s/\x01\x1f\n\r\t\b\f\x7f \xc3\xa9\xf0\x9f\x98\x80\0end";
    size_t rn = sizeof raw - 1;
    k3c_sbuf_json_string(&s, raw, rn);
    CHECK(s.ok && strchr(s.buf, '\n') == NULL && strchr(s.buf, '\x01') == NULL, "control chars escaped: %s", s.buf);
    k3c_json *v = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_json_parse(s.buf, s.len, "str", &v, &err), &err);
    CHECK(v && v->len == rn && memcmp(v->string, raw, rn) == 0, "string round trip");
    k3c_json_free(v);
    k3c_sbuf_free(&s);

    k3c_sbuf_init(&s);
    k3c_sbuf_printf(&s, "%s-%d", "abc", 42);
    k3c_sbuf_printf(&s, "%0300d", 7);
    CHECK(s.ok && s.len == 306 && strncmp(s.buf, "abc-42000", 9) == 0 && s.buf[s.len] == 0, "printf appends and grows");
    k3c_sbuf_free(&s);
}

/* Writes v with `flags` and compares with `want`. */
static void check_write(const k3c_json *v, int flags, const char *want) {
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    k3c_sbuf_json_value(&s, v, flags);
    CHECK(s.ok && !strcmp(s.buf, want), "wrote '%s', want '%s'", s.buf, want);
    k3c_sbuf_free(&s);
}

/* Numbers keep their literal: an integer of any size is written back digit for digit, a decimal as written (LEXEMES)
 * or as Python's repr(float) of it (the default, what json.dumps(json.loads(...)) gives). */
static void test_lexemes(void) {
    const char *doc = "[12345678901234567890, -12345678901234567890, 0.1, 0.10, 1E5, -0, 7, 1.5e-7, "
                      "0.30000000000000000001, 123456789012345678901234567890.5]";
    k3c_json *v = parse_ok(doc);
    if (!v) return;
    CHECK(!v->items[0].is_integer && k3c_json_is_integral(&v->items[0]) && v->items[0].number == 12345678901234567890.0,
          "a big integer: integral, not int64, nearest double kept");
    CHECK(v->items[6].is_integer && v->items[6].lexeme == NULL, "an int64 integer keeps no copy of its literal");
    CHECK(v->items[5].lexeme && !strcmp(v->items[5].lexeme, "-0"), "-0 keeps its sign in the literal");
    CHECK(!k3c_json_is_integral(&v->items[2]) && !k3c_json_is_integral(&v->items[4]), "fractions, exponents");
    check_write(v, K3C_JSON_W_LEXEMES,
                "[12345678901234567890,-12345678901234567890,0.1,0.10,1E5,-0,7,1.5e-7,0.30000000000000000001,"
                "123456789012345678901234567890.5]");
    check_write(v, 0,
                "[12345678901234567890,-12345678901234567890,0.1,0.1,100000.0,0,7,1.5e-07,0.3,1.2345678901234568e+29]");
    k3c_json_free(v);
    /* the typed getters still read every number; a big integer is named as such */
    v = parse_ok("{\"big\": 12345678901234567890, \"x\": 0.10}");
    k3c_err err = {0};
    k3c_json_ctx c = {"t.json", &err};
    int64_t i = 0;
    double d = 0;
    CHECK(k3c_json_get_int(&c, K3C_JSON_REQ, K3C_SPOT(v, "", "big"), K3C_NOSPOT, &i, NULL) != 0 &&
              strstr(err.msg, "expected an integer, got an integer beyond the 64-bit range"),
          "big integer message: '%s'", err.msg);
    CHECK(k3c_json_get_num(&c, K3C_JSON_REQ, K3C_SPOT(v, "", "x"), K3C_NOSPOT, &d, NULL) == 0 && d == 0.1, "0.10");
    k3c_json_free(v);
}

/* Duplicate keys: an error by default; with K3C_JSON_P_DUP_KEYS, Python's reading (first position, last value). */
static void test_duplicates(void) {
    const char *doc = "{\"a\": 1, \"b\": {\"x\": 1, \"x\": [2]}, \"a\": 3, \"c\": 4, \"a\": \"last\"}";
    reject(doc, strlen(doc), "1:24", "duplicate key \"x\"");
    k3c_json *v = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_json_parse_ex(doc, strlen(doc), "t.json", K3C_JSON_P_DUP_KEYS, &v, &err), &err);
    if (v) check_write(v, 0, "{\"a\":\"last\",\"b\":{\"x\":[2]},\"c\":4}");
    k3c_json_free(v);
    /* large objects take the hashed path */
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    k3c_sbuf_append(&s, "{", 1);
    for (int k = 0; k < 40; k++) k3c_sbuf_printf(&s, "%s\"k%d\":%d", k ? "," : "", k % 25, k);
    k3c_sbuf_append(&s, "}", 1);
    CHECK_OK(k3c_json_parse_ex(s.buf, s.len, "t.json", K3C_JSON_P_DUP_KEYS, &v, &err), &err);
    CHECK(v && v->n == 25 && !strcmp(v->keys[3], "k3") && v->items[3].integer == 28 && v->items[24].integer == 24,
          "40 members, 25 keys: first positions, last values");
    k3c_json_free(v);
    k3c_sbuf_free(&s);
}

static void test_file(void) {
    const char *dir = test_tmpdir("test_json");
    char path[4200];
    snprintf(path, sizeof path, "%s/c.json", dir);
    k3c_err err = {0};
    const char *txt = "{\n\"x\": [1,\n 2,, 3]}";
    CHECK_OK(k3c_write_file_atomic(path, txt, strlen(txt), &err), &err);
    k3c_json *v = NULL;
    int rc = k3c_json_parse_file(path, &v, &err);
    char want[4300];
    snprintf(want, sizeof want, "%s:3:4: ", path);
    CHECK(rc == K3C_EFORMAT && strncmp(err.msg, want, strlen(want)) == 0, "file error names path:line:col: %s",
          err.msg);
    snprintf(path, sizeof path, "%s/missing.json", dir);
    rc = k3c_json_parse_file(path, &v, &err);
    CHECK(rc == K3C_EIO && strstr(err.msg, "missing.json"), "missing file: %s", err.msg);
}

/* The typed getters (k3c_json_get_*): values, defaults, two spellings and messages naming file and field. */
static void test_getters(void) {
    k3c_json *v = parse_ok("{\"n\": 3, \"m\": 3, \"k\": 4, \"x\": 1.5, \"s\": \"a\", \"b\": true, \"z\": null, "
                           "\"o\": {}, \"f\": 2.5}");
    if (!v) return;
    k3c_err err = {0};
    k3c_json_ctx c = {"t.json", &err};
    int64_t i = -1;
    double d = -1;
    int b = -1, present = -1;
    const char *str = NULL;
    const k3c_json *o = NULL;
    CHECK(k3c_json_get_int(&c, K3C_JSON_REQ, K3C_SPOT(v, "", "n"), K3C_SPOT(v, "", "m"), &i, &present) == 0 && i == 3 &&
              present == 1,
          "agreeing spellings: %lld %s", (long long)i, err.msg);
    CHECK(k3c_json_get_int(&c, K3C_JSON_OPT, K3C_SPOT(v, "", "n"), K3C_SPOT(v, "p.", "k"), &i, NULL) == K3C_ECONFIG &&
              strstr(err.msg, "t.json: n (3) and p.k (4) disagree"),
          "disagreeing spellings: '%s'", err.msg);
    CHECK(k3c_json_get_int(&c, K3C_JSON_OPT, K3C_SPOT(v, "", "q"), K3C_NOSPOT, &i, &present) == 0 && i == 0 &&
              present == 0,
          "absent optional: %lld %d", (long long)i, present);
    CHECK(k3c_json_get_int(&c, K3C_JSON_REQ, K3C_SPOT(v, "a.", "q"), K3C_NOSPOT, &i, NULL) == K3C_ECONFIG &&
              strcmp(err.msg, "t.json: a.q: missing") == 0,
          "missing: '%s'", err.msg);
    CHECK(k3c_json_get_int(&c, K3C_JSON_REQ, K3C_SPOT(v, "", "z"), K3C_NOSPOT, &i, NULL) == K3C_ECONFIG &&
              strcmp(err.msg, "t.json: z: null") == 0,
          "null: '%s'", err.msg);
    CHECK(k3c_json_get_int(&c, K3C_JSON_REQ | K3C_JSON_NULL_ZERO, K3C_SPOT(v, "", "z"), K3C_NOSPOT, &i, &present) ==
                  0 &&
              i == 0 && present == 1,
          "null as zero: %s", err.msg);
    CHECK(k3c_json_get_int(&c, K3C_JSON_OPT, K3C_SPOT(v, "", "f"), K3C_NOSPOT, &i, NULL) == K3C_ECONFIG &&
              strstr(err.msg, "t.json: f: expected an integer, got a number with a fraction or exponent"),
          "fraction: '%s'", err.msg);
    CHECK(k3c_json_get_num(&c, K3C_JSON_OPT, K3C_SPOT(v, "", "x"), K3C_NOSPOT, &d, NULL) == 0 && d == 1.5, "num");
    CHECK(k3c_json_get_num(&c, K3C_JSON_OPT, K3C_SPOT(v, "", "s"), K3C_NOSPOT, &d, NULL) == K3C_ECONFIG &&
              strstr(err.msg, "t.json: s: expected a number, got a string"),
          "num of a string: '%s'", err.msg);
    CHECK(k3c_json_get_bool(&c, K3C_JSON_REQ, K3C_SPOT(v, "", "b"), K3C_NOSPOT, &b, NULL) == 0 && b == 1, "bool");
    CHECK(k3c_json_get_bool(&c, K3C_JSON_REQ, K3C_SPOT(v, "", "n"), K3C_NOSPOT, &b, NULL) == K3C_ECONFIG &&
              strstr(err.msg, "expected true or false, got a number"),
          "bool of a number: '%s'", err.msg);
    CHECK(k3c_json_get_str(&c, K3C_JSON_REQ, K3C_SPOT(v, "", "s"), &str) == 0 && str && strcmp(str, "a") == 0, "str");
    CHECK(k3c_json_get_str(&c, K3C_JSON_REQ, K3C_SPOT(v, "", "o"), &str) == K3C_ECONFIG &&
              strstr(err.msg, "t.json: o: expected a string, got an object"),
          "str of an object: '%s'", err.msg);
    CHECK(k3c_json_get_obj(&c, K3C_SPOT(v, "", "o"), &o) == 0 && o && o->type == K3C_JSON_OBJECT, "obj");
    CHECK(k3c_json_get_obj(&c, K3C_SPOT(v, "", "z"), &o) == 0 && o == NULL, "null obj is absent");
    k3c_json_free(v);
}

int main(void) {
    test_valid();
    test_integers();
    test_strings();
    test_rejections();
    test_limits();
    test_writer();
    test_lexemes();
    test_duplicates();
    test_file();
    test_getters();
    return test_summary();
}
