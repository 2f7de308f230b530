/* test_xtml_release.c — the chat renderer and parser where they follow the release's encoder (src/tok/xtml.h,
 * docs/FORMATS.md §9.2): exact big integers and Python's reading of argument text, tools as a mapping, unknown roles
 * skipped; the parser's start states, partial calls, bare JSON arguments, and recovery from markup that does not fit
 * the prompt (no control token ever reaches reasoning or content, also when streamed byte by byte). */
#include "test.h"

#include "base/json.h"
#include "tok/xtml.h"

#define END "<|close|>message<|sep|><|end_of_msg|>"
#define ASST "<|open|>message role=\"assistant\"<|sep|>"
#define RESP_EMPTY "<|open|>response<|sep|><|close|>response<|sep|>"

static const k3c_chat_parse_opts THINK = {K3C_CHAT_XTML, 1, 0, 0}, RESP = {K3C_CHAT_XTML, 0, 1, 0},
                                 NONE = {K3C_CHAT_XTML, 0, 0, 0}, K2 = {K3C_CHAT_K2, 0, 0, 0};

static k3c_json *J(const char *s) {
    k3c_json *v = NULL;
    k3c_err err = {0};
    if (k3c_json_parse(s, strlen(s), "test", &v, &err) != K3C_OK) {
        printf("FAIL bad test JSON: %s\n", err.msg);
        test_failed_++;
    }
    return v;
}

/* Renders; returns the prompt text (malloc'd) or NULL with the error printed as a failure. */
static char *render(const char *msgs, const char *tools, const char *opts) {
    k3c_json *m = J(msgs), *t = tools ? J(tools) : NULL, *o = opts ? J(opts) : NULL;
    k3c_chat_prompt p;
    k3c_err err = {0};
    int rc = m ? k3c_chat_render(m, t, o, &p, &err) : K3C_EINVAL;
    k3c_json_free(m);
    k3c_json_free(t);
    k3c_json_free(o);
    CHECK(rc == K3C_OK, "render failed: %s", err.msg);
    if (rc) return NULL;
    char *s = p.text;
    free(p.segs);
    return s;
}

static void check_render(const char *msgs, const char *tools, const char *opts, const char *want) {
    char *got = render(msgs, tools, opts);
    if (!got) return;
    CHECK(!strcmp(got, want), "\n got: %s\nwant: %s", got, want);
    free(got);
}

/* No chat control token in s[0..n). */
static int clean(const char *s, size_t n) {
    for (int i = 0; i < K3C_CHAT_N_SPECIALS; i++)
        if (memmem(s, n, k3c_chat_specials[i], strlen(k3c_chat_specials[i]))) return 0;
    return 1;
}

typedef struct {
    k3c_sbuf reasoning, content, args;
    int calls, partial, args_bad, args_streamed;
} deltas;

/* A call's argument pieces (CALL_ARGS after its CALL_BEGIN) must add up to its arguments unless it says diverged. */
static void on_delta(void *ctx, const k3c_chat_delta *d) {
    deltas *x = ctx;
    if (d->kind == K3C_CHAT_DELTA_REASONING) k3c_sbuf_append(&x->reasoning, d->text, d->len);
    if (d->kind == K3C_CHAT_DELTA_CONTENT) k3c_sbuf_append(&x->content, d->text, d->len);
    if (d->kind == K3C_CHAT_DELTA_CALL_BEGIN) x->args.len = 0;
    if (d->kind == K3C_CHAT_DELTA_CALL_ARGS) k3c_sbuf_append(&x->args, d->text, d->len);
    if (d->kind == K3C_CHAT_DELTA_CALL) {
        x->calls++, x->partial += d->partial;
        size_t n = strlen(d->arguments);
        x->args_streamed += !d->diverged;
        x->args_bad += !d->diverged && (x->args.len != n || memcmp(x->args.buf, d->arguments, n));
    }
}

/* Parses s one-shot and byte by byte; both must give `reasoning`, `content`, the calls ("name|index|args|finished"
 * lines) and `finished`, and no control token may appear in any streamed delta. */
static void check_parse(const k3c_chat_parse_opts *po, const char *s, const char *reasoning, const char *content,
                        const char *calls, int finished) {
    k3c_chat_result r;
    k3c_err err = {0};
    if (k3c_chat_parse(po, s, strlen(s), &r, &err) != K3C_OK) {
        CHECK(0, "parse of %.80s failed: %s", s, err.msg);
        return;
    }
    CHECK(!strcmp(r.reasoning, reasoning), "%.60s: reasoning '%s' want '%s'", s, r.reasoning, reasoning);
    CHECK(!strcmp(r.content, content), "%.60s: content '%s' want '%s'", s, r.content, content);
    CHECK(r.finished == finished, "%.60s: finished %d want %d", s, r.finished, finished);
    k3c_sbuf got;
    k3c_sbuf_init(&got);
    k3c_sbuf_append(&got, "", 0);
    int partial = 0;
    for (size_t i = 0; i < r.ncalls; i++) {
        k3c_sbuf_printf(&got, "%s|%d|%s|%d\n", r.calls[i].name, r.calls[i].index, r.calls[i].arguments,
                        r.calls[i].finished);
        partial += !r.calls[i].finished;
    }
    CHECK(!strcmp(got.buf, calls ? calls : ""), "%.60s: tool calls\n%s want\n%s", s, got.buf, calls ? calls : "");
    k3c_sbuf_free(&got);
    deltas d = {0};
    k3c_sbuf_init(&d.reasoning);
    k3c_sbuf_init(&d.content);
    k3c_sbuf_init(&d.args);
    k3c_chat_parser *p;
    CHECK_OK(k3c_chat_parser_new(po, on_delta, &d, &p, &err), &err);
    for (size_t i = 0; s[i]; i++) CHECK_OK(k3c_chat_parser_feed(p, s + i, 1, &err), &err);
    CHECK_OK(k3c_chat_parser_finish(p, &err), &err);
    const k3c_chat_result *st = k3c_chat_parser_result(p);
    CHECK(st->ncalls == r.ncalls && d.calls == (int)r.ncalls && d.partial == partial, "%.60s: streamed calls", s);
    CHECK(d.args_bad == 0, "%.60s: streamed argument pieces differ from the arguments", s);
    k3c_sbuf_free(&d.args);
    CHECK(d.reasoning.len == r.reasoning_len && d.content.len == r.content_len &&
              (!d.content.len || !memcmp(d.content.buf, r.content, d.content.len)),
          "%.60s: streamed deltas add up to the result", s);
    CHECK(clean(r.reasoning, r.reasoning_len) && clean(r.content, r.content_len), "%.60s: a control token in text", s);
    k3c_chat_parser_free(p);
    k3c_sbuf_free(&d.reasoning);
    k3c_sbuf_free(&d.content);
    k3c_chat_result_free(&r);
}

/* ---------------------------------------------------------------- rendering */

static void render_numbers(void) {
    /* big integers stay exact whether the arguments come as an object or as text; text is re-dumped as Python does:
     * floats in repr, a repeated key keeps its first position and its last value */
    const char *tail = "<|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>"
                       "<|open|>argument key=\"id\" type=\"number\"<|sep|>12345678901234567890<|close|>argument<|sep|>"
                       "<|open|>argument key=\"x\" type=\"number\"<|sep|>0.1<|close|>argument<|sep|>";
    char want[2048];
    snprintf(want, sizeof want, ASST RESP_EMPTY "%s<|close|>call<|sep|><|close|>tools<|sep|>" END, tail);
    check_render("[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":"
                 "{\"id\":12345678901234567890,\"x\":0.1}}}]}]",
                 NULL, "{\"add_generation_prompt\":false,\"thinking\":false}", want);
    check_render("[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":"
                 "\"{\\\"id\\\": 12345678901234567890, \\\"x\\\": 0.1}\"}}]}]",
                 NULL, "{\"add_generation_prompt\":false,\"thinking\":false}", want);
    check_render(
        "[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":"
        "\"{\\\"a\\\": 1, \\\"f\\\": 1.50, \\\"e\\\": 1E5, \\\"n\\\": -12345678901234567890123, \\\"o\\\": {\\\"k\\\": "
        "2.50, \\\"k\\\": [1e-5, -0]}, \\\"a\\\": 3}\"}}]}]",
        NULL, "{\"add_generation_prompt\":false,\"thinking\":false}",
        ASST RESP_EMPTY
        "<|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>"
        "<|open|>argument key=\"a\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
        "<|open|>argument key=\"f\" type=\"number\"<|sep|>1.5<|close|>argument<|sep|>"
        "<|open|>argument key=\"e\" type=\"number\"<|sep|>100000.0<|close|>argument<|sep|>"
        "<|open|>argument key=\"n\" type=\"number\"<|sep|>-12345678901234567890123<|close|>argument<|sep|>"
        "<|open|>argument key=\"o\" type=\"object\"<|sep|>{\"k\": [1e-05, 0]}<|close|>argument<|sep|>"
        "<|close|>call<|sep|><|close|>tools<|sep|>" END);
    /* numbers elsewhere: tool declarations and attribute values keep their digits too */
    check_render("[{\"role\":\"user\",\"name\":12345678901234567890,\"content\":\"q\"}]",
                 "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"maximum\":"
                 "98765432109876543210,\"minimum\":0.10}}}]",
                 "{\"add_generation_prompt\":false}",
                 "<|open|>message role=\"system\" type=\"tool-declare\"<|sep|># Tools\nHere are the available tools, "
                 "described in JSONSchema.\n\n```json\n[{\"function\":{\"name\":\"f\",\"parameters\":{\"maximum\":"
                 "98765432109876543210,\"minimum\":0.1}},\"type\":\"function\"}]\n```" END
                 "<|open|>message role=\"user\" name=\"12345678901234567890\"<|sep|>q" END);
}

static void render_tools_and_roles(void) {
    /* tools as a mapping of name to tool: declared as it stands (key-sorted), as the release does */
    check_render("[{\"role\":\"user\",\"content\":\"q\"}]",
                 "{\"calc\":{\"type\":\"function\",\"function\":{\"name\":\"calc\"}},\"abs\":{\"type\":\"function\"}}",
                 "{\"add_generation_prompt\":false}",
                 "<|open|>message role=\"system\" type=\"tool-declare\"<|sep|># Tools\nHere are the available tools, "
                 "described in JSONSchema.\n\n```json\n{\"abs\":{\"type\":\"function\"},\"calc\":{\"function\":"
                 "{\"name\":\"calc\"},\"type\":\"function\"}}\n```" END "<|open|>message role=\"user\"<|sep|>q" END);
    /* roles the release does not know, non-string roles and non-object messages are skipped */
    char *with = render("[{\"role\":\"developer\",\"content\":\"d\"},\"stray\",{\"role\":\"user\",\"content\":\"q\"},"
                        "{\"role\":\"robot\",\"content\":\"r\"},{\"role\":7,\"content\":\"s\"}]",
                        NULL, NULL);
    char *without = render("[{\"role\":\"user\",\"content\":\"q\"}]", NULL, NULL);
    CHECK(with && without && !strcmp(with, without), "unknown roles skipped:\n%s\n%s", with ? with : "",
          without ? without : "");
    free(with);
    free(without);
    /* tool results after a skipped message still bind to the preceding assistant's calls */
    check_render(
        "[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\",\"function\":{\"name\":\"f\",\"arguments\":{}}}]},"
        "{\"role\":\"note\",\"content\":\"n\"},{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"R\"}]",
        NULL, "{\"add_generation_prompt\":false,\"thinking\":false}",
        ASST RESP_EMPTY "<|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|><|close|>call<|sep|>"
                        "<|close|>tools<|sep|>" END "<|open|>message role=\"tool\" tool=\"f\" index=\"1\"<|sep|>R" END);
}

/* ---------------------------------------------------------------- parsing */

static void parse_states(void) {
    /* the start state is the channel the prompt opened; with none, text without markup is content */
    check_parse(&THINK, "plain", "plain", "", NULL, 0);
    check_parse(&RESP, "plain", "", "plain", NULL, 0);
    check_parse(&NONE, "plain", "", "plain", NULL, 0);
    check_parse(&RESP, "Answer<|close|>response<|sep|><|close|>message<|sep|>", "", "Answer", NULL, 1);
    k3c_chat_parse_opts po;
    k3c_err err = {0};
    k3c_json *o = J("{}");
    CHECK_OK(k3c_chat_parse_opts_from_json(o, &po, &err), &err);
    CHECK(!po.in_think && !po.in_response && !po.strict, "absent options: no channel open, recovering");
    k3c_json_free(o);
    o = J("{\"in_response\":true}");
    CHECK_OK(k3c_chat_parse_opts_from_json(o, &po, &err), &err);
    CHECK(po.in_response && !po.in_think, "in_response read");
    k3c_json_free(o);
    o = J("{\"in_response\":true,\"in_think\":true}");
    CHECK(k3c_chat_parse_opts_from_json(o, &po, &err) != K3C_OK && strstr(err.msg, "exclude"), "both channels refused");
    k3c_json_free(o);
    o = J("{\"in_response\":1}");
    CHECK(k3c_chat_parse_opts_from_json(o, &po, &err) != K3C_OK && strstr(err.msg, "in_response"), "a bool: %s",
          err.msg);
    k3c_json_free(o);
}

static void parse_calls(void) {
    const char *open = "<|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>";
    char s[2048];
    /* cut off mid-argument: returned with what was read, finished false */
    snprintf(s, sizeof s,
             "%s<|open|>argument key=\"n\" type=\"number\"<|sep|>12345678901234567890<|close|>argument<|sep|>"
             "<|open|>argument key=\"s\" type=\"string\"<|sep|>hel",
             open);
    check_parse(&RESP, s, "", "", "f|1|{\"n\":12345678901234567890,\"s\":\"hel\"}|0\n", 0);
    /* cut off inside a tag header: the call so far */
    snprintf(s, sizeof s, "%s<|open|>argument key=\"n\" type=\"number\"<|sep|>7<|close|>argu", open);
    check_parse(&RESP, s, "", "", "f|1|{\"n\":7}|0\n", 0);
    /* arguments as one JSON block: bare inside the call, or in a json element; read as Python reads them */
    snprintf(s, sizeof s,
             "%s {\"id\": 12345678901234567890, \"x\": 0.1, \"x\": 0.25}<|close|>call<|sep|><|open|>call tool=\"g\" "
             "index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>{\"k\": [1.0, 2]}<|close|>json<|sep|><|close|>call"
             "<|sep|><|close|>tools<|sep|>" END,
             open);
    check_parse(&RESP, s, "", "", "f|1|{\"id\":12345678901234567890,\"x\":0.25}|1\ng|2|{\"k\":[1.0,2]}|1\n", 1);
    /* typed values keep every digit */
    snprintf(s, sizeof s,
             "%s<|open|>argument key=\"id\" type=\"number\"<|sep|>12345678901234567890<|close|>argument<|sep|>"
             "<|open|>argument key=\"x\" type=\"number\"<|sep|>0.1<|close|>argument<|sep|><|close|>call<|sep|>",
             open);
    check_parse(&RESP, s, "", "", "f|1|{\"id\":12345678901234567890,\"x\":0.1}|1\n", 0);
}

static void parse_recovery(void) {
    const char *call = "<|open|>tools<|sep|><|open|>call tool=\"calc\" index=\"1\"<|sep|><|open|>argument "
                       "key=\"expression\" type=\"string\"<|sep|>2+2<|close|>argument<|sep|><|close|>call<|sep|>"
                       "<|close|>tools<|sep|>";
    const char *want = "calc|1|{\"expression\":\"2+2\"}|1\n";
    char s[2048];
    /* a response close where the prompt opened think (a model tuned without thinking) */
    snprintf(s, sizeof s, "<|close|>response<|sep|>%s" END, call);
    check_parse(&THINK, s, "", "", want, 1);
    snprintf(s, sizeof s, "Sure.<|close|>response<|sep|>%s" END, call);
    check_parse(&THINK, s, "Sure.", "", want, 1);
    /* a think channel where the prompt opened response, and a missing think close */
    snprintf(s, sizeof s, "<|open|>think<|sep|>hmm<|close|>think<|sep|>ok %s", call);
    check_parse(&RESP, s, "hmm", "ok ", want, 0);
    snprintf(s, sizeof s, "hmm<|open|>response<|sep|>ok<|close|>response<|sep|>%s", call);
    check_parse(&THINK, s, "hmm", "ok", want, 0);
    /* closes without opens, unknown elements, stray separators and other formats' tokens: dropped */
    check_parse(&RESP, "<|close|>call<|sep|>A<|close|>argument<|sep|>B<|open|>banana<|sep|>C<|sep|>D<|im_end|>E[EOS]F",
                "", "ABCDEF", NULL, 0);
    check_parse(&THINK, "r<|tool_call_begin|>s<|close|>json<|sep|>", "rs", "", NULL, 0);
    /* an unknown element inside an argument value leaves the value open */
    check_parse(&RESP,
                "<|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"s\" "
                "type=\"string\"<|sep|>a <|open|>b<|sep|>c<|close|>argument<|sep|><|close|>call<|sep|>",
                "", "", "f|1|{\"s\":\"a c\"}|1\n", 0);
    /* a header with surrounding whitespace still names its element */
    snprintf(s, sizeof s,
             "x<|close|> think <|sep|>y<|open|>  tools<|sep|><|open|>call tool=\"calc\" index=\"1\"<|sep|>"
             "<|open|>argument key=\"expression\" type=\"string\"<|sep|>2+2<|close|>argument<|sep|>"
             "<|close|>call\n<|sep|>");
    check_parse(&THINK, s, "x", "y", want, 0);
    /* a call without a name is read and discarded; an argument outside a call too; the next call is kept */
    snprintf(s, sizeof s,
             "<|open|>tools<|sep|><|open|>call index=\"1\"<|sep|><|open|>argument key=\"a\"<|sep|>1<|close|>argument"
             "<|sep|><|close|>call<|sep|><|open|>argument key=\"b\" type=\"number\"<|sep|>2<|close|>argument<|sep|>%s",
             call + strlen("<|open|>tools<|sep|>"));
    check_parse(&RESP, s, "", "", want, 0);
    /* an element left open ends where the next begins: an unclosed argument, an unclosed call */
    check_parse(&RESP,
                "<|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"a\" "
                "type=\"number\"<|sep|>1<|open|>argument key=\"b\" type=\"string\"<|sep|>x<|close|>call<|sep|>"
                "<|open|>call tool=\"g\" index=\"2\"<|sep|><|close|>tools<|sep|>after",
                "", "after", "f|1|{\"a\":1,\"b\":\"x\"}|1\ng|2|{}|1\n", 0);
    /* K2: a call end without its start, a call without a name, control tokens of XTML in text */
    check_parse(&K2,
                "a<|tool_call_end|>b<|open|>c<|tool_calls_section_begin|><|tool_call_begin|>functions.:0"
                "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_call_begin|>functions.f:1"
                "<|tool_call_argument_begin|>{\"n\": 12345678901234567890}<|tool_call_end|><|tool_calls_section_end|>",
                "", "abc", "f|1|{\"n\":12345678901234567890}|1\n", 0);
    check_parse(&K2,
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": 1", "",
                "", "f|0|\"{\\\"a\\\": 1\"|0\n", 0);
}

/* A stray <|open|> followed by text and no separator: the text is content, the marker is not. */
static void parse_header_overflow(void) {
    k3c_sbuf t, want;
    k3c_sbuf_init(&t);
    k3c_sbuf_init(&want);
    k3c_sbuf_append(&t, "a<|open|>", 9);
    k3c_sbuf_append(&want, "a", 1);
    for (int i = 0; i < 1100; i++) k3c_sbuf_append(&t, "z", 1), k3c_sbuf_append(&want, "z", 1);
    k3c_sbuf_append(&t, "<|open|>response<|sep|>!", 24);
    k3c_sbuf_append(&want, "!", 1);
    check_parse(&RESP, t.buf, "", want.buf, NULL, 0);
    k3c_sbuf_free(&t);
    k3c_sbuf_free(&want);
}

/* Strict parsing (format checks) still refuses what the default reads past. */
static void parse_strict(void) {
    k3c_chat_parse_opts strict = {K3C_CHAT_XTML, 1, 0, 1};
    const char *bad[] = {"<|close|>call<|sep|>", "<|open|>banana<|sep|>", "<|open|>argument key=\"a\"<|sep|>"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        k3c_chat_result r;
        k3c_err err = {0};
        int rc = k3c_chat_parse(&strict, bad[i], strlen(bad[i]), &r, &err);
        CHECK(rc == K3C_EFORMAT && strstr(err.msg, "model output"), "strict: %s refused (%d)", bad[i], rc);
        if (rc == K3C_OK) k3c_chat_result_free(&r);
    }
}

/* Random output made of markers, tag names and text: recovering parsing never fails, never leaves a control token in
 * text, and gives the same result one-shot and fed in random pieces. */
static void random_outputs(void) {
    static const char *frags[] = {"<|open|>",
                                  "<|close|>",
                                  "<|sep|>",
                                  "<|end_of_msg|>",
                                  "<|im_end|>",
                                  "[EOS]",
                                  "<|tool_calls_section_begin|>",
                                  "<|tool_call_begin|>",
                                  "<|tool_call_argument_begin|>",
                                  "<|tool_call_end|>",
                                  "<|tool_calls_section_end|>",
                                  "<think>",
                                  "</think>",
                                  "think",
                                  "response",
                                  "tools",
                                  "call tool=\"f\" index=\"1\"",
                                  "call",
                                  "argument key=\"a\" "
                                  "type=\"number\"",
                                  "argument key=\"s\"",
                                  "json",
                                  "message",
                                  "banana",
                                  " ",
                                  "x",
                                  "12345678901234567890",
                                  "0.1",
                                  "{\"a\": 1, \"a\": 2}",
                                  "\xc3\xa9",
                                  "<|",
                                  "|>",
                                  "<|se",
                                  "functions.f:0",
                                  "\n"};
    const size_t nf = sizeof frags / sizeof *frags;
    k3c_rng rng = {36, 0};
    int bad = 0, dirty = 0, differ = 0;
    deltas d = {0};
    k3c_sbuf_init(&d.reasoning);
    k3c_sbuf_init(&d.content);
    k3c_sbuf_init(&d.args);
    for (int iter = 0; iter < 3000; iter++) {
        k3c_sbuf s;
        k3c_sbuf_init(&s);
        size_t len = 1 + k3c_rng_u64(&rng) % 40;
        for (size_t i = 0; i < len; i++) {
            const char *f = frags[k3c_rng_u64(&rng) % nf];
            k3c_sbuf_append(&s, f, strlen(f));
        }
        if (iter % 100 == 0)
            for (int i = 0; i < 1100; i++) k3c_sbuf_append(&s, "z", 1);
        k3c_chat_parse_opts po = {iter & 1 ? K3C_CHAT_K2 : K3C_CHAT_XTML, (iter >> 1) % 3 == 1, (iter >> 1) % 3 == 2,
                                  0};
        k3c_chat_result one;
        k3c_err err = {0};
        if (k3c_chat_parse(&po, s.buf, s.len, &one, &err) != K3C_OK) {
            bad++;
            k3c_sbuf_free(&s);
            continue;
        }
        dirty += !clean(one.reasoning, one.reasoning_len) || !clean(one.content, one.content_len);
        k3c_chat_parser *p;
        CHECK_OK(k3c_chat_parser_new(&po, on_delta, &d, &p, &err), &err);
        int rc = K3C_OK;
        for (size_t at = 0; at < s.len && !rc;) {
            size_t k = 1 + k3c_rng_u64(&rng) % 9;
            if (k > s.len - at) k = s.len - at;
            rc = k3c_chat_parser_feed(p, s.buf + at, k, &err);
            at += k;
        }
        if (!rc) rc = k3c_chat_parser_finish(p, &err);
        k3c_sbuf a, b;
        k3c_sbuf_init(&a);
        k3c_sbuf_init(&b);
        k3c_chat_result_json(&a, &one);
        if (!rc) k3c_chat_result_json(&b, k3c_chat_parser_result(p));
        if (rc || a.len != b.len || memcmp(a.buf, b.buf, a.len)) {
            if (!differ) printf("differ: %s\n one-shot %s\n streamed %s\n", s.buf, a.buf, b.buf ? b.buf : "");
            differ++;
        }
        k3c_sbuf_free(&a);
        k3c_sbuf_free(&b);
        k3c_chat_parser_free(p);
        k3c_chat_result_free(&one);
        k3c_sbuf_free(&s);
    }
    CHECK(bad == 0 && dirty == 0 && differ == 0, "random outputs: %d errors, %d with control tokens in text, %d differ",
          bad, dirty, differ);
    CHECK(d.args_bad == 0 && d.args_streamed > 20, "random outputs: %d of %d streamed calls' pieces differ", d.args_bad,
          d.args_streamed);
    k3c_sbuf_free(&d.reasoning);
    k3c_sbuf_free(&d.content);
    k3c_sbuf_free(&d.args);
}

/* Done when: arguments holding 12345678901234567890 and 0.1 come back unchanged through render and parse. */
static void roundtrip_numbers(void) {
    const char *msgs = "[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
                       "[{\"function\":{\"name\":\"pay\",\"arguments\":\"{\\\"id\\\": 12345678901234567890, "
                       "\\\"amount\\\": 0.1}\"}}]}]";
    const char *fmts[2] = {"{\"add_generation_prompt\":false,\"thinking\":false}",
                           "{\"add_generation_prompt\":false,\"format\":\"k2\"}"};
    const char *starts[2] = {ASST "<|open|>response<|sep|>", "<|im_assistant|>assistant<|im_middle|>"};
    const k3c_chat_parse_opts *po[2] = {&RESP, &K2};
    for (int f = 0; f < 2; f++) {
        char *p = render(msgs, NULL, fmts[f]);
        const char *body = p ? strstr(p, starts[f]) : NULL;
        CHECK(body != NULL, "assistant turn in %s", p ? p : "");
        if (body) {
            k3c_chat_result r;
            k3c_err err = {0};
            body += strlen(starts[f]);
            CHECK_OK(k3c_chat_parse(po[f], body, strlen(body), &r, &err), &err);
            CHECK(r.ncalls == 1 && !strcmp(r.calls[0].arguments, "{\"id\":12345678901234567890,\"amount\":0.1}"),
                  "format %d: arguments %s", f, r.ncalls ? r.calls[0].arguments : "none");
            k3c_chat_result_free(&r);
        }
        free(p);
    }
}

/* `k3c xtml parse`: --in-response / --in-think set the start channel of lines whose parse_options do not. */
static void cli(void) {
    const char *dir = test_tmpdir("xtml_release");
    char path[4200], cmd[8800];
    snprintf(path, sizeof path, "%s/p.jsonl", dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        CHECK(0, "cannot write %s", path);
        return;
    }
    fprintf(f, "{\"id\":1,\"assistant_output\":\"A<|close|>response<|sep|>\"}\n"
               "{\"id\":2,\"assistant_output\":\"B\",\"parse_options\":{\"in_think\":true}}\n");
    fclose(f);
    const char *flags[3] = {"--in-response", "--in-think", ""};
    const char *want[3] = {"{\"id\":1,\"parsed\":{\"reasoning\":\"\",\"content\":\"A\"",
                           "{\"id\":1,\"parsed\":{\"reasoning\":\"A\",\"content\":\"\"",
                           "{\"id\":1,\"parsed\":{\"reasoning\":\"\",\"content\":\"A\""};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "%s xtml parse %s --in %s 2>&1", test_k3c_bin(), flags[i], path);
        FILE *p = popen(cmd, "r");
        char out[4096] = {0};
        size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
        int st = p ? pclose(p) : -1;
        out[n] = 0;
        CHECK(st == 0 && strstr(out, want[i]), "%s: %s", flags[i], out);
        CHECK(strstr(out, "{\"id\":2,\"parsed\":{\"reasoning\":\"B\""), "%s: the line's own options win: %s", flags[i],
              out);
    }
    snprintf(cmd, sizeof cmd, "%s xtml parse --in-response --in-think --in %s >/dev/null 2>&1", test_k3c_bin(), path);
    CHECK(system(cmd) != 0, "both start channels refused");
}

int main(void) {
    render_numbers();
    render_tools_and_roles();
    parse_states();
    parse_calls();
    parse_recovery();
    parse_header_overflow();
    parse_strict();
    random_outputs();
    roundtrip_numbers();
    cli();
    return test_summary();
}
