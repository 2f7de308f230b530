/* test_xtml.c — chat prompts (src/tok/xtml.h): every case of ../shared/golden/xtml/examples.jsonl rendered byte for byte
 * (string and segments) and parsed; streaming parses (byte at a time, random splits) equal the one-shot parse with no
 * marker leaking into content; typed tool-call round trips; both formats (XTML, K2); bad inputs refused. */
#include "test.h"

#include "base/json.h"
#include "tok/xtml.h"

static k3c_json *J(const char *s) {
    k3c_json *v = NULL;
    k3c_err err;
    if (k3c_json_parse(s, strlen(s), "test", &v, &err) != K3C_OK) {
        printf("FAIL bad test JSON: %s\n", err.msg);
        test_failed_++;
    }
    return v;
}

/* Renders JSON texts; returns the status, the prompt in *out (freed by the caller) and the message in err. */
static int render(const char *msgs, const char *tools, const char *opts, k3c_chat_prompt *out, k3c_err *err) {
    k3c_json *m = J(msgs), *t = tools ? J(tools) : NULL, *o = opts ? J(opts) : NULL;
    int rc = m ? k3c_chat_render(m, t, o, out, err) : K3C_EINVAL;
    k3c_json_free(m);
    k3c_json_free(t);
    k3c_json_free(o);
    return rc;
}

static void check_render(const char *msgs, const char *tools, const char *opts, const char *want) {
    k3c_chat_prompt p;
    k3c_err err = {0};
    int rc = render(msgs, tools, opts, &p, &err);
    CHECK(rc == K3C_OK, "render failed: %s", err.msg);
    if (rc) return;
    CHECK(p.len == strlen(want) && !memcmp(p.text, want, p.len), "\n got: %s\nwant: %s", p.text, want);
    k3c_chat_prompt_free(&p);
}

static void check_render_error(const char *msgs, const char *tools, const char *opts, const char *needle) {
    k3c_chat_prompt p;
    k3c_err err = {0};
    int rc = render(msgs, tools, opts, &p, &err);
    CHECK(rc != K3C_OK && strstr(err.msg, needle), "expected an error mentioning '%s', got rc %d '%s'", needle, rc,
          err.msg);
    if (rc == K3C_OK) k3c_chat_prompt_free(&p);
}

/* ---------------------------------------------------------------- streaming */

typedef struct {
    k3c_sbuf reasoning, content;
    int calls, begins, finished, leaked;
    const char *want; /* the final content, when known */
} deltas;

static void on_delta(void *ctx, const k3c_chat_delta *d) {
    deltas *x = ctx;
    switch (d->kind) {
    case K3C_CHAT_DELTA_REASONING: k3c_sbuf_append(&x->reasoning, d->text, d->len); break;
    case K3C_CHAT_DELTA_CONTENT:
        k3c_sbuf_append(&x->content, d->text, d->len);
        /* what was emitted can never be taken back: it must stay a prefix of the final content */
        if (x->want && (x->content.len > strlen(x->want) || memcmp(x->content.buf, x->want, x->content.len)))
            x->leaked = 1;
        break;
    case K3C_CHAT_DELTA_CALL_BEGIN: x->begins++; break;
    case K3C_CHAT_DELTA_CALL_ARGS: break; /* test_xtml_release checks the pieces */
    case K3C_CHAT_DELTA_CALL: x->calls++; break;
    case K3C_CHAT_DELTA_FINISHED: x->finished++; break;
    }
}

static int same_result(const k3c_chat_result *a, const k3c_chat_result *b) {
    if (a->reasoning_len != b->reasoning_len || memcmp(a->reasoning, b->reasoning, a->reasoning_len)) return 0;
    if (a->content_len != b->content_len || memcmp(a->content, b->content, a->content_len)) return 0;
    if (a->ncalls != b->ncalls || a->finished != b->finished) return 0;
    for (size_t i = 0; i < a->ncalls; i++)
        if (strcmp(a->calls[i].name, b->calls[i].name) || a->calls[i].index != b->calls[i].index ||
            strcmp(a->calls[i].arguments, b->calls[i].arguments))
            return 0;
    return 1;
}

/* Feeds `s` in pieces (piece = 1: byte at a time; 0: random lengths 1..12 from `seed`) and checks the final result and
 * the concatenated deltas against the one-shot parse. `no_markup`: content and reasoning must hold no marker text. */
static void check_stream(const k3c_chat_parse_opts *po, const char *s, size_t piece, uint64_t seed, int no_markup) {
    k3c_chat_result one;
    k3c_err err = {0};
    if (k3c_chat_parse(po, s, strlen(s), &one, &err) != K3C_OK) {
        CHECK(0, "one-shot parse failed: %s", err.msg);
        return;
    }
    deltas d = {0};
    k3c_sbuf_init(&d.reasoning);
    k3c_sbuf_init(&d.content);
    if (no_markup) d.want = one.content;
    k3c_chat_parser *p;
    CHECK_OK(k3c_chat_parser_new(po, on_delta, &d, &p, &err), &err);
    k3c_rng r = {seed, 0};
    size_t n = strlen(s);
    int rc = K3C_OK;
    for (size_t at = 0; at < n && !rc;) {
        size_t k = piece ? piece : 1 + (size_t)(k3c_rng_u64(&r) % 12);
        if (k > n - at) k = n - at;
        rc = k3c_chat_parser_feed(p, s + at, k, &err);
        at += k;
    }
    if (!rc) rc = k3c_chat_parser_finish(p, &err);
    CHECK(rc == K3C_OK, "streamed parse failed: %s", err.msg);
    const k3c_chat_result *res = k3c_chat_parser_result(p);
    CHECK(same_result(res, &one), "piece %zu seed %llu: streamed result differs from one-shot for %.60s", piece,
          (unsigned long long)seed, s);
    CHECK(d.reasoning.len == one.reasoning_len &&
              !memcmp(d.reasoning.buf ? d.reasoning.buf : "", one.reasoning, d.reasoning.len),
          "reasoning deltas do not add up");
    CHECK(d.content.len == one.content_len && !memcmp(d.content.buf ? d.content.buf : "", one.content, d.content.len),
          "content deltas do not add up");
    /* a call cut off by the end of the output was begun but never completed */
    CHECK(d.calls == (int)one.ncalls && d.begins >= d.calls && d.begins <= d.calls + 1,
          "tool-call deltas %d/%d for %zu calls", d.begins, d.calls, one.ncalls);
    CHECK(d.finished == one.finished, "finished delta");
    if (no_markup) CHECK(!d.leaked, "content emitted while streaming is not in the final content of %.60s", s);
    k3c_chat_parser_free(p);
    k3c_sbuf_free(&d.reasoning);
    k3c_sbuf_free(&d.content);
    k3c_chat_result_free(&one);
}

static void check_stream_all(const k3c_chat_parse_opts *po, const char *s, int no_markup) {
    check_stream(po, s, 1, 0, no_markup);
    for (uint64_t seed = 1; seed <= 20; seed++) check_stream(po, s, 0, seed, no_markup);
}

/* Parses `s` and compares with the expected fields; `calls` is "name|index|arguments" lines (NULL: none). */
static void check_parse(const k3c_chat_parse_opts *po, const char *s, const char *reasoning, const char *content,
                        const char *calls, int finished) {
    k3c_chat_result r;
    k3c_err err = {0};
    if (k3c_chat_parse(po, s, strlen(s), &r, &err) != K3C_OK) {
        CHECK(0, "parse failed: %s", err.msg);
        return;
    }
    CHECK(!strcmp(r.reasoning, reasoning), "reasoning '%s' want '%s'", r.reasoning, reasoning);
    CHECK(!strcmp(r.content, content), "content '%s' want '%s'", r.content, content);
    CHECK(r.finished == finished, "finished %d want %d", r.finished, finished);
    k3c_sbuf got;
    k3c_sbuf_init(&got);
    k3c_sbuf_append(&got, "", 0);
    for (size_t i = 0; i < r.ncalls; i++)
        k3c_sbuf_printf(&got, "%s|%d|%s\n", r.calls[i].name, r.calls[i].index, r.calls[i].arguments);
    CHECK(!strcmp(got.buf, calls ? calls : ""), "tool calls\n%s want\n%s", got.buf, calls ? calls : "");
    k3c_sbuf_free(&got);
    k3c_chat_result_free(&r);
    check_stream_all(po, s, 1);
}

/* ---------------------------------------------------------------- golden */

static void test_golden(void) {
    const char *path = test_shared("golden/xtml/examples.jsonl");
    char *data = NULL;
    size_t n = 0;
    k3c_err err = {0};
    if (k3c_read_file(path, &data, &n, &err) != K3C_OK) {
        CHECK(0, "cannot read the XTML golden: %s", err.msg);
        return;
    }
    int cases = 0, rendered = 0, parse_cases = 0, parsed = 0;
    for (size_t at = 0; at < n;) {
        const char *line = data + at, *nl = memchr(line, '\n', n - at);
        size_t len = nl ? (size_t)(nl - line) : n - at;
        at += len + 1;
        if (len == 0) continue;
        k3c_json *g;
        if (k3c_json_parse(line, len, "examples.jsonl", &g, &err) != K3C_OK) {
            CHECK(0, "%s", err.msg);
            continue;
        }
        cases++;
        const char *id = k3c_json_get(g, "id")->string;
        k3c_chat_prompt p;
        int rc = k3c_chat_render(k3c_json_get(g, "messages"), k3c_json_get(g, "tools"), k3c_json_get(g, "options"), &p,
                                 &err);
        CHECK(rc == K3C_OK, "%s: %s", id, err.msg);
        if (rc == K3C_OK) {
            const k3c_json *want = k3c_json_get(g, "rendered"), *segs = k3c_json_get(g, "segments");
            int ok = p.len == want->len && !memcmp(p.text, want->string, p.len);
            CHECK(ok, "%s: rendered differs\n got: %s\nwant: %s", id, p.text, want->string);
            int sok = p.nseg == segs->n;
            for (size_t i = 0; sok && i < p.nseg; i++) {
                const k3c_json *s = &segs->items[i];
                sok = s->items[0].len == p.segs[i].len &&
                      !memcmp(s->items[0].string, p.text + p.segs[i].off, p.segs[i].len) &&
                      s->items[1].boolean == p.segs[i].markup;
            }
            CHECK(sok, "%s: segments differ (%zu vs %zu)", id, p.nseg, segs->n);
            rendered += ok && sok;
            k3c_chat_prompt_free(&p);
        }
        const k3c_json *out = k3c_json_get(g, "assistant_output");
        if (out) {
            parse_cases++;
            k3c_chat_parse_opts po;
            k3c_chat_result r;
            CHECK_OK(k3c_chat_parse_opts_from_json(k3c_json_get(g, "parse_options"), &po, &err), &err);
            rc = k3c_chat_parse(&po, out->string, out->len, &r, &err);
            CHECK(rc == K3C_OK, "%s: parse: %s", id, err.msg);
            if (rc == K3C_OK) {
                const k3c_json *w = k3c_json_get(g, "parsed"), *wc = k3c_json_get(w, "tool_calls");
                int ok = !strcmp(r.reasoning, k3c_json_get(w, "reasoning")->string) &&
                         !strcmp(r.content, k3c_json_get(w, "content")->string) &&
                         r.finished == k3c_json_get(w, "finished")->boolean && r.ncalls == wc->n;
                for (size_t i = 0; ok && i < r.ncalls; i++) {
                    k3c_sbuf a;
                    k3c_sbuf_init(&a);
                    k3c_sbuf_json_value(&a, k3c_json_get(&wc->items[i], "arguments"), 0);
                    ok = !strcmp(r.calls[i].name, k3c_json_get(&wc->items[i], "name")->string) &&
                         !strcmp(r.calls[i].arguments, a.buf);
                    k3c_sbuf_free(&a);
                }
                CHECK(ok, "%s: parsed result differs from the golden", id);
                parsed += ok;
                k3c_chat_result_free(&r);
                check_stream_all(&po, out->string, 1);
            }
        }
        k3c_json_free(g);
    }
    free(data);
    CHECK(cases >= 8 && rendered == cases, "golden render: %d of %d cases exact", rendered, cases);
    CHECK(parse_cases >= 1 && parsed == parse_cases, "golden parse: %d of %d cases exact", parsed, parse_cases);
    printf("golden: %d/%d rendered exactly, %d/%d parsed exactly\n", rendered, cases, parsed, parse_cases);
}

/* ---------------------------------------------------------------- XTML rendering beyond the golden */

#define OPEN_ASST "<|open|>message role=\"assistant\"<|sep|>"
#define END "<|close|>message<|sep|><|end_of_msg|>"

static void test_xtml_render(void) {
    /* typed arguments: strings raw, everything else as Python's json.dumps (", " / ": ", repr floats) */
    check_render(
        "[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"s\\\": \\\"a&b\\\", \\\"n\\\": 3, \\\"x\\\": 1.0, "
        "\\\"e\\\": 1e16, \\\"t\\\": 1e-5, \\\"b\\\": true, \\\"z\\\": null, \\\"o\\\": {\\\"k\\\": [1, 2.5]}}\"}}]}]",
        NULL, "{\"add_generation_prompt\":false,\"thinking\":false}",
        OPEN_ASST "<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
                  "<|open|>call tool=\"f\" index=\"1\"<|sep|>"
                  "<|open|>argument key=\"s\" type=\"string\"<|sep|>a&b<|close|>argument<|sep|>"
                  "<|open|>argument key=\"n\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
                  "<|open|>argument key=\"x\" type=\"number\"<|sep|>1.0<|close|>argument<|sep|>"
                  "<|open|>argument key=\"e\" type=\"number\"<|sep|>1e+16<|close|>argument<|sep|>"
                  "<|open|>argument key=\"t\" type=\"number\"<|sep|>1e-05<|close|>argument<|sep|>"
                  "<|open|>argument key=\"b\" type=\"boolean\"<|sep|>true<|close|>argument<|sep|>"
                  "<|open|>argument key=\"z\" type=\"null\"<|sep|>null<|close|>argument<|sep|>"
                  "<|open|>argument key=\"o\" type=\"object\"<|sep|>{\"k\": [1, 2.5]}<|close|>argument<|sep|>"
                  "<|close|>call<|sep|><|close|>tools<|sep|>" END);
    /* unparsable arguments stay verbatim in a json block; attribute values escape & then " */
    check_render(
        "[{\"role\":\"assistant\",\"content\":null,\"name\":\"a\\\"b&c\",\"tool_calls\":[{\"function\":"
        "{\"name\":\"g\",\"arguments\":\"{oops\"}}]}]",
        NULL, "{\"add_generation_prompt\":false}",
        "<|open|>message role=\"assistant\" name=\"a&quot;b&amp;c\"<|sep|><|open|>think<|sep|><|close|>think<|sep|>"
        "<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"g\" "
        "index=\"1\"<|sep|><|open|>json type=\"object\"<|sep|>{oops<|close|>json<|sep|><|close|>call<|sep|>"
        "<|close|>tools<|sep|>" END);
    /* tool results sorted into call order by tool_call_id, each taking its call's name */
    check_render(
        "[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"a\",\"function\":{\"name\":\"f1\","
        "\"arguments\":\"{}\"}},{\"id\":\"b\",\"function\":{\"name\":\"f2\",\"arguments\":{}}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"b\",\"content\":\"B\"},{\"role\":\"tool\",\"tool_call_id\":\"a\","
        "\"content\":\"A\"}]",
        NULL, "{\"add_generation_prompt\":false,\"thinking\":false}",
        OPEN_ASST "<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f1\" "
                  "index=\"1\"<|sep|><|close|>call<|sep|><|open|>call tool=\"f2\" index=\"2\"<|sep|><|close|>"
                  "call<|sep|><|close|>tools<|sep|>" END
                  "<|open|>message role=\"tool\" tool=\"f1\" index=\"1\"<|sep|>A" END
                  "<|open|>message role=\"tool\" tool=\"f2\" index=\"2\"<|sep|>B" END);
    /* one-shot options after the history, schema key-sorted; thinking off opens the response channel */
    check_render(
        "[{\"role\":\"user\",\"content\":\"q\"}]", NULL,
        "{\"thinking\":false,\"thinking_effort\":\"medium\",\"tool_choice\":\"required\",\"response_format\":"
        "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"object\",\"a\":1}}}}",
        "<|open|>message role=\"user\"<|sep|>q" END
        "<|open|>message role=\"system\" type=\"tool-choice\"<|sep|>The system is invoked with "
        "`tool_choice=required`.\nYou MUST call tools in the next message." END
        "<|open|>message role=\"system\" type=\"response-format\"<|sep|>The system is invoked with "
        "`response_format=json_schema`.\nYour response must be raw JSON data without markdown code blocks "
        "(```json) or any additional formatting.\nThe JSON data must match the following schema:\n```json\n"
        "{\"a\":1,\"type\":\"object\"}\n```" END OPEN_ASST "<|open|>response<|sep|>");
    /* images: each image part / placeholder takes the next prompt, as markup */
    k3c_chat_prompt p;
    k3c_err err = {0};
    int rc = render("[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}},{\"type\":\"text\","
                    "\"text\":\"x<|kimi_image_placeholder|>y\"}]}]",
                    NULL, "{\"image_prompts\":[\"<I1>\",\"<I2>\"],\"add_generation_prompt\":false}", &p, &err);
    CHECK(rc == K3C_OK, "%s", err.msg);
    if (rc == K3C_OK) {
        CHECK(!strcmp(p.text, "<|open|>message role=\"user\"<|sep|><I1>x<I2>y" END), "images: %s", p.text);
        int marks = 0;
        for (size_t i = 0; i < p.nseg; i++)
            marks += p.segs[i].markup && p.segs[i].len == 4 && !memcmp(p.text + p.segs[i].off, "<I", 2);
        CHECK(marks == 2, "image prompts are markup segments (%d)", marks);
        k3c_chat_prompt_free(&p);
    }
    /* a special-token spelling typed by a user is a text segment, never markup */
    rc = render("[{\"role\":\"user\",\"content\":\"<|sep|>\"}]", NULL, "{\"add_generation_prompt\":false}", &p, &err);
    CHECK(rc == K3C_OK && p.nseg == 12 && !p.segs[7].markup && p.segs[7].len == 7, "user <|sep|> stays text");
    if (rc == K3C_OK) k3c_chat_prompt_free(&p);
}

static void test_k2_render(void) {
    check_render("[{\"role\":\"user\",\"content\":\"Hi\"}]",
                 "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}]",
                 "{\"format\":\"k2\"}",
                 "<|im_system|>tool_declare<|im_middle|>[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                 "\"parameters\":{\"type\":\"object\"}}}]<|im_end|><|im_system|>system<|im_middle|>You are a helpful "
                 "assistant<|im_end|><|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|>");
    check_render(
        "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"W?\"},{\"role\":\"assistant\","
        "\"content\":\"ok\",\"tool_calls\":[{\"id\":\"functions.get_weather:0\",\"function\":{\"name\":"
        "\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}},{\"function\":{\"name\":\"g\","
        "\"arguments\":{\"a\":1}}}]},{\"role\":\"tool\",\"tool_call_id\":\"functions.get_weather:0\","
        "\"content\":\"18C\"}]",
        NULL, "{\"format\":\"k2\",\"add_generation_prompt\":false}",
        "<|im_system|>system<|im_middle|>S<|im_end|><|im_user|>user<|im_middle|>W?<|im_end|><|im_assistant|>"
        "assistant<|im_middle|>ok<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.g:1"
        "<|tool_call_argument_begin|>{\"a\": 1}<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
        "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n18C<|im_end|>");
}

/* ---------------------------------------------------------------- parsing */

static void test_parse(void) {
    k3c_chat_parse_opts think = {K3C_CHAT_XTML, 1, 0, 0}, resp = {K3C_CHAT_XTML, 0, 1, 0}, k2 = {K3C_CHAT_K2, 0, 0, 0};
    const char *call =
        "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
        "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris <|close|>argument<|sep|>"
        "<|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
        "<|open|>argument key=\"opts\" type=\"object\"<|sep|>{\"a\": [true, null, 1.5]}<|close|>argument<|sep|>"
        "<|open|>argument key=\"bad\" type=\"number\"<|sep|>three<|close|>argument<|sep|>"
        "<|close|>call<|sep|><|open|>call tool=\"a&quot;b\" index=\"2\"<|sep|><|open|>json type=\"object\""
        "<|sep|>{\"x\": 1}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>" END;
    const char *want =
        "get_weather|1|{\"city\":\"Paris \",\"days\":3,\"opts\":{\"a\":[true,null,1.5]},\"bad\":\"three\"}\n"
        "a\"b|2|{\"x\":1}\n";
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    k3c_sbuf_printf(&s, "Let me check °C.<|close|>think<|sep|><|open|>response<|sep|>On it ✓<|close|>response<|sep|>%s",
                    call);
    check_parse(&think, s.buf, "Let me check °C.", "On it ✓", want, 1);
    /* no reasoning marker at all: the tool calls are still found */
    check_parse(&think, call, "", "", want, 1);
    s.len = 0;
    k3c_sbuf_printf(&s, "<|close|>response<|sep|>%s", call);
    check_parse(&resp, s.buf, "", "", want, 1);
    /* truncated output: text so far, an unfinished call returned as far as it got, an unfinished marker was text */
    check_parse(&resp, "Hello<|clo", "", "Hello<|clo", NULL, 0);
    check_parse(&resp, "Hi<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|><|open|>arg", "",
                "Hi", "f|1|{}\n", 0);
    /* held back while undecided: a marker prefix and an incomplete UTF-8 character */
    deltas d = {.want = "Hello\xc2\xb0"};
    k3c_sbuf_init(&d.content);
    k3c_sbuf_init(&d.reasoning);
    k3c_chat_parser *p;
    k3c_err err = {0};
    CHECK_OK(k3c_chat_parser_new(&resp, on_delta, &d, &p, &err), &err);
    CHECK_OK(k3c_chat_parser_feed(p, "Hello<|clo", 10, &err), &err);
    CHECK(d.content.len == 5, "'Hello' emitted, '<|clo' held back (%zu)", d.content.len);
    CHECK_OK(k3c_chat_parser_feed(p, "se|>response<|sep|>\xc2", 20, &err), &err);
    CHECK(d.content.len == 5 && !d.leaked, "the completed marker is not content");
    CHECK_OK(k3c_chat_parser_feed(p, "\xb0", 1, &err), &err);
    CHECK(d.content.len == 7 && !memcmp(d.content.buf + 5, "\xc2\xb0", 2), "whole characters only");
    k3c_chat_parser_free(p);
    k3c_sbuf_free(&d.content);
    k3c_sbuf_free(&d.reasoning);

    /* K2: <think> optional, tool-call section, functions.name:idx ids */
    const char *k2out = "<think>need weather</think>Sure.<|tool_calls_section_begin|> <|tool_call_begin|> "
                        "functions.get_weather:0 <|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>"
                        "<|tool_call_begin|>functions.f:1<|tool_call_argument_begin|>not json<|tool_call_end|>"
                        "<|tool_calls_section_end|><|im_end|>";
    check_parse(&k2, k2out, "need weather", "Sure.", "get_weather|0|{\"city\":\"Paris\"}\nf|1|\"not json\"\n", 1);
    check_parse(&k2,
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.g:0<|tool_call_argument_begin|>{}"
                "<|tool_call_end|><|tool_calls_section_end|>",
                "", "", "g|0|{}\n", 0);
    k3c_chat_parse_opts k2t = {K3C_CHAT_K2, 1, 0, 0};
    check_parse(&k2t, "hmm</think>Answer<|im_end|>ignored", "hmm", "Answer", NULL, 1);
    k3c_sbuf_free(&s);
}

/* Render an assistant turn with typed tool calls, hand its body to the parser as model output: same calls back. */
static void test_roundtrip(void) {
    const char *msgs = "[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\",\"content\":\"C <|x\","
                       "\"reasoning_content\":\"R\",\"tool_calls\":[{\"function\":{\"name\":\"q\\\"&\",\"arguments\":"
                       "\"{\\\"s\\\": \\\"a\\\\nb\\\", \\\"n\\\": -2.5e-7, \\\"l\\\": [1, {\\\"k\\\": false}]}\"}}]}]";
    const char *opts[2] = {"{\"add_generation_prompt\":false}", "{\"add_generation_prompt\":false,\"format\":\"k2\"}"};
    const char *starts[2] = {OPEN_ASST "<|open|>think<|sep|>", "<|im_assistant|>assistant<|im_middle|>"};
    k3c_chat_parse_opts po[2] = {{K3C_CHAT_XTML, 1, 0, 0}, {K3C_CHAT_K2, 0, 0, 0}};
    const char *want[2] = {"q\"&|1|{\"s\":\"a\\nb\",\"n\":-2.5e-07,\"l\":[1,{\"k\":false}]}\n",
                           "q\"&|0|{\"s\":\"a\\nb\",\"n\":-2.5e-07,\"l\":[1,{\"k\":false}]}\n"};
    for (int f = 0; f < 2; f++) {
        k3c_chat_prompt p;
        k3c_err err = {0};
        if (render(msgs, NULL, opts[f], &p, &err) != K3C_OK) {
            CHECK(0, "%s", err.msg);
            continue;
        }
        const char *body = strstr(p.text, starts[f]);
        CHECK(body != NULL, "assistant turn not found in %s", p.text);
        if (body) check_parse(&po[f], body + strlen(starts[f]), f ? "" : "R", "C <|x", want[f], 1);
        k3c_chat_prompt_free(&p);
    }
}

/* ---------------------------------------------------------------- errors */

static void test_errors(void) {
    const char *u = "[{\"role\":\"user\",\"content\":\"x\"}]";
    check_render_error(u, NULL, "{\"thinking_effort\":\"medium\"}", "thinking_effort");
    check_render_error(u, NULL, "{\"thinking_effort\":5}", "thinking_effort");
    check_render_error(u, NULL, "{\"thinkin\":true}", "options.thinkin: unknown option");
    check_render_error(u, NULL, "{\"format\":\"chatml\"}", "options.format");
    check_render_error(u, NULL, "{\"format\":\"k2\",\"tool_choice\":\"none\"}", "not supported by the k2 format");
    check_render_error(u, NULL, "{\"image_prompts\":[\"<I>\"]}", "image_prompts");
    check_render_error(u, "5", NULL, "tools");
    check_render_error("{\"role\":\"user\"}", NULL, NULL, "messages");
    check_render_error("[{\"role\":\"robot\",\"content\":\"x\"}]", NULL, "{\"format\":\"k2\"}", "unknown role");
    check_render_error("[{\"content\":\"x\"}]", NULL, NULL, "messages[0].role: missing");
    check_render_error("[{\"role\":\"user\",\"content\":5}]", NULL, NULL, "messages[0].content");
    check_render_error("[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]", NULL, NULL, "content[0]");
    const char *noname =
        "[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}]";
    check_render_error(noname, NULL, NULL, "messages[0].tool_calls[0]: a tool call needs a non-empty function.name");
    check_render_error(noname, NULL, "{\"format\":\"k2\"}", "function.name");
    check_render_error("[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
                       "\"arguments\":\"[1]\"}}]}]",
                       NULL, NULL, "must be a JSON object");
    check_render_error("[{\"role\":\"tool\",\"content\":\"r\"}]", NULL, NULL, "tool name");

    /* strict parsing (format checks) refuses what the default parsing reads past */
    k3c_chat_parse_opts x = {K3C_CHAT_XTML, 0, 1, 1}, k2 = {K3C_CHAT_K2, 0, 0, 1};
    struct {
        const k3c_chat_parse_opts *o;
        const char *out, *needle;
    } bad[] = {
        {&x, "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call index=\"1\"<|sep|>", "without a name"},
        {&x, "<|open|>argument key=\"a\" type=\"string\"<|sep|>", "outside a tool call"},
        {&x, "<|open|>banana<|sep|>", "unknown XTML element"},
        {&k2, "<|tool_call_begin|>functions.:0<|tool_call_argument_begin|>{}<|tool_call_end|>", "without a name"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        k3c_chat_result r;
        k3c_err err = {0};
        int rc = k3c_chat_parse(bad[i].o, bad[i].out, strlen(bad[i].out), &r, &err);
        CHECK(rc != K3C_OK && strstr(err.msg, bad[i].needle), "parse error case %zu: rc %d '%s'", i, rc, err.msg);
        if (rc == K3C_OK) k3c_chat_result_free(&r);
    }
    k3c_chat_parse_opts po;
    k3c_err err = {0};
    k3c_json *o = J("{\"in_thinkk\":true}");
    CHECK(k3c_chat_parse_opts_from_json(o, &po, &err) != K3C_OK && strstr(err.msg, "in_thinkk"), "parse option");
    k3c_json_free(o);
}

/* ---------------------------------------------------------------- the command */

static void test_cli(void) {
    const char *dir = test_tmpdir("xtml");
    char path[4200], cmd[8600];
    snprintf(path, sizeof path, "%s/in.jsonl", dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        CHECK(0, "cannot write %s", path);
        return;
    }
    fprintf(f, "{\"id\":1,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"tools\":null,\"options\":"
               "{\"thinking\":false}}\n\n{\"id\":\"x\", oops}\n{\"id\":3,\"messages\":[{\"content\":\"x\"}]}\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s xtml render --in %s 2>&1", test_k3c_bin(), path);
    FILE *p = popen(cmd, "r");
    char out[8192] = {0};
    size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    int st = p ? pclose(p) : -1;
    out[n] = 0;
    CHECK(strstr(out, "{\"id\":1,\"rendered\":\"<|open|>message role=\\\"user\\\"<|sep|>Hi<|close|>message<|sep|>"
                      "<|end_of_msg|><|open|>message role=\\\"assistant\\\"<|sep|><|open|>response<|sep|>\","
                      "\"segments\":[[\"<|open|>\",true],[\"message\",false],"),
          "render line: %s", out);
    CHECK(strstr(out, "{\"id\":null,\"error\":\"") && strstr(out, "in.jsonl:3:"), "malformed line with its number: %s",
          out);
    CHECK(strstr(out, "{\"id\":3,\"error\":\"messages[0].role: missing\""), "no role: %s", out);
    CHECK(st != 0, "exit status reports the failed lines");
    snprintf(cmd, sizeof cmd, "%s xtml parse --in %s 2>&1", test_k3c_bin(), test_shared("golden/xtml/examples.jsonl"));
    p = popen(cmd, "r");
    n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    if (p) pclose(p);
    out[n] = 0;
    CHECK(strstr(out, "{\"id\":\"toolcall_single_roundtrip\",\"parsed\":{\"reasoning\":\"The tool says 18C.\","
                      "\"content\":\"It is 18°C and clear in Paris.\",\"tool_calls\":[],\"finished\":true}}"),
          "parse line: %s", out);
}

int main(void) {
    test_golden();
    test_xtml_render();
    test_k2_render();
    test_parse();
    test_roundtrip();
    test_errors();
    test_cli();
    return test_summary();
}
