/* test_post_verify.c — verifiers (src/post/verify.c, schema.c): exact answers, the JSON-schema subset, XTML format
 * validity and code against unit tests, each on correct, wrong and malformed inputs. */
#include "test.h"

#include "post/post.h"

static double comp(const k3c_reward *r, const char *name) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->c[i].name, name)) return r->c[i].value;
    return NAN;
}

static void test_answer(void) {
    struct {
        const char *resp, *truth;
        int ok;
    } cases[] = {
        {"Step 1: 3*4=12\n#### 12", "12", 1},
        {"so the total is\n#### 1,234\n", "1234", 1},
        {"#### $5.00", "5", 1},
        {"#### 0.5", "1/2", 1},
        {"#### 3\nthen later #### 4", "4", 1}, /* the last marker counts */
        {"#### 13", "12", 0},
        {"I think 12", "12", 0}, /* no marker: the whole text must be the answer */
        {"12", "12", 1},
        {"Answer: Paris.", "paris", 1},
        {"answer:   New   York!", "new york", 1},
        {"Answer: Lyon", "paris", 0},
        {"#### twelve", "12", 0},
        {"", "12", 0},
        {"#### 12abc", "12", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        k3c_reward r;
        k3c_verify_answer(cases[i].resp, cases[i].truth, &r);
        CHECK(r.n == 1 && r.reward == cases[i].ok && comp(&r, "answer") == cases[i].ok,
              "case %zu \"%s\" vs %s: %g (%s)", i, cases[i].resp, cases[i].truth, r.reward, r.info);
    }
}

static int schema_ok(const char *schema, const char *value, char *msg) {
    k3c_json *s = NULL, *v = NULL;
    k3c_err err = {0};
    k3c_json_parse(schema, strlen(schema), "schema", &s, &err);
    k3c_json_parse(value, strlen(value), "value", &v, &err);
    int rc = s && v ? k3c_json_schema_check(s, v, &err) : -100;
    if (msg) snprintf(msg, 512, "%.511s", err.msg);
    k3c_json_free(s);
    k3c_json_free(v);
    return rc;
}

static void test_schema(void) {
    const char *S =
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"units\":{\"enum\":[\"c\",\"f\"]},"
        "\"days\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
        "\"note\":{\"type\":[\"string\",\"null\"]}},\"required\":[\"city\"],\"additionalProperties\":false}";
    char msg[512];
    CHECK(schema_ok(S, "{\"city\":\"Paris\",\"units\":\"c\",\"days\":3,\"tags\":[\"a\"],\"note\":null}", msg) == 0,
          "valid: %s", msg);
    struct {
        const char *v, *want;
    } bad[] = {
        {"{\"units\":\"c\"}", "$: missing required property \"city\""},
        {"{\"city\":3}", "$.city: expected string, got a number"},
        {"{\"city\":\"x\",\"units\":\"k\"}", "$.units: expected one of [\"c\",\"f\"]"},
        {"{\"city\":\"x\",\"days\":2.5}", "$.days: expected integer"},
        {"{\"city\":\"x\",\"tags\":[\"a\",1]}", "$.tags[1]: expected string"},
        {"{\"city\":\"x\",\"note\":5}", "$.note: a number matches none of the allowed types"},
        {"{\"city\":\"x\",\"zip\":1}", "$.zip: property not allowed"},
        {"[1]", "$: expected object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = schema_ok(S, bad[i].v, msg);
        CHECK(rc == K3C_EINVAL && strstr(msg, bad[i].want), "%s: rc %d, \"%s\" (want \"%s\")", bad[i].v, rc, msg,
              bad[i].want);
    }
}

static const char *TOOLS = "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
                           "\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"units\":{\"enum\":[\"c\","
                           "\"f\"]}},\"required\":[\"city\"]}}}]";

static k3c_reward fmt(const char *out) {
    k3c_reward r;
    k3c_err err = {0};
    CHECK_OK(k3c_verify_format(out, strlen(out), TOOLS, 1, &r, &err), &err);
    return r;
}

#define CALL(args)                                                                                                     \
    "ok<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|><|open|>call "          \
    "tool=\"get_weather\" index=\"1\"<|sep|>" args "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>"  \
    "<|end_of_msg|>"
#define ARG(k, t, v) "<|open|>argument key=\"" k "\" type=\"" t "\"<|sep|>" v "<|close|>argument<|sep|>"

static void test_format(void) {
    k3c_reward r = fmt(CALL(ARG("city", "string", "Paris") ARG("units", "string", "c")));
    CHECK(r.reward == 1 && comp(&r, "xtml") == 1 && comp(&r, "tool_args") == 1, "valid call: %g %s", r.reward, r.info);
    r = fmt("hmm<|close|>think<|sep|><|open|>response<|sep|>Hi.<|close|>response<|sep|><|close|>message<|sep|>"
            "<|end_of_msg|>");
    CHECK(r.reward == 1, "plain answer, no calls: %g %s", r.reward, r.info);
    r = fmt(CALL(ARG("city", "string", "Paris") ARG("units", "string", "k")));
    CHECK(comp(&r, "xtml") == 1 && comp(&r, "tool_args") == 0 && strstr(r.info, "$.units: expected one of"),
          "bad enum: %s", r.info);
    r = fmt(CALL(ARG("units", "string", "c")));
    CHECK(comp(&r, "tool_args") == 0 && strstr(r.info, "missing required property \"city\""), "missing: %s", r.info);
    r = fmt(CALL(ARG("city", "number", "3")));
    CHECK(comp(&r, "tool_args") == 0 && strstr(r.info, "$.city: expected string"), "mistyped: %s", r.info);
    r = fmt(
        "x<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"rm_rf\" index=\"1\"<|sep|><|close|>call<|sep|>"
        "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>");
    CHECK(comp(&r, "tool_args") == 0 && strstr(r.info, "unknown tool \"rm_rf\""), "unknown tool: %s", r.info);
    r = fmt("x<|close|>think<|sep|><|open|>response<|sep|>Hi.");
    CHECK(comp(&r, "xtml") == 0 && r.reward == 0.5 && strstr(r.info, "not closed"), "unclosed: %g %s", r.reward,
          r.info);
    r = fmt(
        "x<|close|>think<|sep|><|open|>banana<|sep|>Hi.<|close|>banana<|sep|><|close|>message<|sep|><|end_of_msg|>");
    CHECK(r.reward == 0 && strstr(r.info, "unknown XTML element"), "malformed: %g %s", r.reward, r.info);
    k3c_err err = {0};
    CHECK(k3c_verify_format("x", 1, "[oops", 1, &r, &err) != K3C_OK, "malformed tools JSON is an error");
}

static void test_code(void) {
    k3c_sandbox_limits l = {.cpu_s = 2, .wall_s = 5, .mem_bytes = 512 << 20, .fsize_bytes = 1 << 20, .nproc = 16};
    const char *cases = "[[\"rev('abc')\", \"'cba'\"], [\"rev('')\", \"''\"], [\"rev('ab')\", \"'ba'\"]]";
    k3c_reward r;
    k3c_err err = {0};
    CHECK_OK(k3c_verify_code("def rev(s):\n    return s[::-1]\n", cases, &l, 1, &r, &err), &err);
    CHECK(r.reward == 1 && comp(&r, "loads") == 1, "correct: %g %s", r.reward, r.info);
    CHECK_OK(k3c_verify_code("def rev(s):\n    return s if len(s) == 3 else s[::-1]\n", cases, &l, 2, &r, &err), &err);
    CHECK(fabs(r.reward - 2.0 / 3) < 1e-12, "wrong on one case of three: %g %s", r.reward, r.info);
    CHECK_OK(k3c_verify_code("def rev(s) return s\n", cases, &l, 3, &r, &err), &err);
    CHECK(r.reward == 0 && comp(&r, "loads") == 0 && strstr(r.info, "did not load"), "syntax error: %s", r.info);
    CHECK_OK(k3c_verify_code("def rev(s):\n    while True: pass\n", cases, &l, 4, &r, &err), &err);
    CHECK(r.reward == 0, "infinite loop: %g %s", r.reward, r.info);
    CHECK_OK(k3c_verify_code("for i in range(3): print('K3C 0000 %d PASS' % i)\ndef rev(s):\n    return 0\n", cases, &l,
                             5, &r, &err),
             &err);
    CHECK(r.reward == 0, "forged result lines do not count: %g %s", r.reward, r.info);
    CHECK(k3c_verify_code("x", "[[1, 2]]", &l, 6, &r, &err) == K3C_EINVAL && strstr(err.msg, "cases"),
          "malformed cases: %s", err.msg);
}

int main(void) {
    test_answer();
    test_schema();
    test_format();
    test_code();
    return test_summary();
}
