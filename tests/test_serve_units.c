/* test_serve_units.c — the server's pieces without HTTP: stop strings (split across tokens, UTF-8 split across tokens,
 * held-back text released at the end, specials), request validation (every kind of bad request gets its status, code
 * and parameter), and a canned K3 answer with a tool call streamed through the turn pipeline as SSE chunks. */
#include "serve_fixture.h"

#include "serve/anthropic.h"
#include "serve/response.h"

static k3c_tok *g_tok;

typedef struct {
    k3c_sbuf out;
    int calls;
} sink;

static void collect(void *ctx, const char *s, size_t n) {
    sink *k = ctx;
    k3c_sbuf_append(&k->out, s, n);
    k->calls++;
}

/* Feeds the bytes of s one byte token each (ranks 0..255 are the single bytes); returns the first feed's result that
 * was not 0, or 0. */
static int feed_bytes(k3c_stopper *st, const char *s) {
    k3c_err err = {0};
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int rc = k3c_stopper_feed(st, *p, &err);
        if (rc) return rc;
    }
    return 0;
}

static void stop_strings(void) {
    k3c_err err = {0};
    k3c_stopper st;
    sink k = {{0}, 0};
    k3c_sbuf_init(&k.out);
    const char *stops[2] = {"<STOP>", "END"};
    /* a stop string split over many tokens: the text before it comes out, nothing of it, and generation ends */
    CHECK_OK(k3c_stopper_init(&st, g_tok, stops, 2, 0, collect, &k, &err), &err);
    CHECK(feed_bytes(&st, "abc<ST") == 0, "no stop yet");
    CHECK(k.out.len == 3 && !memcmp(k.out.buf, "abc", 3), "held back a stop prefix: got '%.*s'", (int)k.out.len,
          k.out.buf ? k.out.buf : "");
    CHECK(feed_bytes(&st, "OP>def") == 1, "stop string found");
    k3c_stopper_finish(&st);
    CHECK(k.out.len == 3, "nothing after the stop string: '%.*s'", (int)k.out.len, k.out.buf);
    k3c_stopper_free(&st);
    /* a prefix that never completes is released at the end, untouched */
    k.out.len = 0;
    CHECK_OK(k3c_stopper_init(&st, g_tok, stops, 2, 0, collect, &k, &err), &err);
    CHECK(feed_bytes(&st, "x <STO") == 0 && k.out.len == 2, "held '<STO'");
    CHECK(feed_bytes(&st, "P!") == 0, "'<STOP!' is not a stop");
    CHECK(feed_bytes(&st, " EN") == 0, "'EN' held");
    k3c_stopper_finish(&st);
    CHECK(k.out.len == 11 && !memcmp(k.out.buf, "x <STOP! EN", 11), "released at the end: '%.*s'", (int)k.out.len,
          k.out.buf);
    k3c_stopper_free(&st);
    /* the earlier of two stop strings wins, even when the later one completes in the same token */
    k.out.len = 0;
    CHECK_OK(k3c_stopper_init(&st, g_tok, stops, 2, 0, collect, &k, &err), &err);
    k3c_tok_ids ids = {0};
    CHECK_OK(k3c_tok_encode(g_tok, "ab END <STOP>", 13, 0, &ids, &err), &err);
    int rc = 0;
    for (size_t i = 0; i < ids.n && rc == 0; i++) rc = k3c_stopper_feed(&st, ids.ids[i], &err);
    CHECK(rc == 1 && k.out.len == 3 && !memcmp(k.out.buf, "ab ", 3), "earliest stop: '%.*s'", (int)k.out.len,
          k.out.buf);
    k3c_tok_ids_free(&ids);
    k3c_stopper_free(&st);
    /* UTF-8 split across tokens: "é" = C3 A9 and "東" = E6 9D B1 fed byte by byte never come out in halves */
    k.out.len = 0;
    k.calls = 0;
    CHECK_OK(k3c_stopper_init(&st, g_tok, NULL, 0, 0, collect, &k, &err), &err);
    CHECK(k3c_stopper_feed(&st, 0xC3, &err) == 0 && k.out.len == 0, "half of é held back");
    CHECK(k3c_stopper_feed(&st, 0xA9, &err) == 0 && k.out.len == 2, "é whole");
    CHECK(k3c_stopper_feed(&st, 0xE6, &err) == 0 && k3c_stopper_feed(&st, 0x9D, &err) == 0 && k.out.len == 2,
          "two thirds of 東 held back");
    CHECK(k3c_stopper_feed(&st, 0xB1, &err) == 0 && k.out.len == 5 && !memcmp(k.out.buf, "é東", 5), "東 whole");
    /* an unfinished character at the end becomes U+FFFD; a stray byte in the middle too */
    CHECK(k3c_stopper_feed(&st, 0xF0, &err) == 0 && k.out.len == 5, "lead byte held");
    k3c_stopper_finish(&st);
    CHECK(k.out.len == 8 && !memcmp(k.out.buf + 5, "\xEF\xBF\xBD", 3), "U+FFFD for the cut character");
    k3c_stopper_free(&st);
    k.out.len = 0;
    CHECK_OK(k3c_stopper_init(&st, g_tok, NULL, 0, 0, collect, &k, &err), &err);
    CHECK(k3c_stopper_feed(&st, 0xA9, &err) == 0 && k3c_stopper_feed(&st, 'a', &err) == 0 && k.out.len == 4 &&
              !memcmp(k.out.buf,
                      "\xEF\xBF\xBD"
                      "a",
                      4),
          "a stray continuation byte is replaced, not held");
    k3c_stopper_free(&st);
    /* a stop string with a multi-byte character split inside it */
    const char *ustop[1] = {"°C"};
    k.out.len = 0;
    CHECK_OK(k3c_stopper_init(&st, g_tok, ustop, 1, 0, collect, &k, &err), &err);
    CHECK(feed_bytes(&st, "18\xC2") == 0 && k.out.len == 2, "'18' out, the half degree sign held");
    CHECK(feed_bytes(&st, "\xB0") == 0 && k.out.len == 2, "'°' held: it starts the stop string");
    CHECK(feed_bytes(&st, "C") == 1 && k.out.len == 2, "stop '°C'");
    k3c_stopper_free(&st);
    /* special tokens: skipped for completions, spelled out for the chat parser */
    int32_t eom = k3c_tok_special_id(g_tok, "<|end_of_msg|>");
    for (int flags = 0; flags < 2; flags++) {
        k.out.len = 0;
        CHECK_OK(k3c_stopper_init(&st, g_tok, NULL, 0, flags, collect, &k, &err), &err);
        CHECK(k3c_stopper_feed(&st, eom, &err) == 0, "special fed");
        k3c_stopper_finish(&st);
        CHECK(k.out.len == (flags ? 14u : 0u), "specials with flags %d: %zu bytes", flags, k.out.len);
        k3c_stopper_free(&st);
    }
    CHECK_OK(k3c_stopper_init(&st, g_tok, NULL, 0, 0, collect, &k, &err), &err);
    CHECK(k3c_stopper_feed(&st, 99999, &err) == K3C_EINVAL, "an unknown id is an error");
    k3c_stopper_free(&st);
    const char *empty[1] = {""};
    CHECK(k3c_stopper_init(&st, g_tok, empty, 1, 0, collect, &k, &err) == K3C_EINVAL, "empty stop string refused");
    k3c_sbuf_free(&k.out);
}

/* ---------------------------------------------------------------- request validation */

static k3c_api_limits limits(void) {
    return (k3c_api_limits){.tok = g_tok,
                            .format = K3C_CHAT_XTML,
                            .model_name = "tiny",
                            .n_vocab = k3c_tok_n_vocab(g_tok),
                            .max_context = 256,
                            .max_tokens_cap = 32};
}

static void expect_error(k3c_api_kind kind, const char *body, int status, const char *code, const char *param) {
    k3c_api_limits lim = limits();
    k3c_api_req q;
    k3c_api_error e;
    int rc = k3c_api_parse(kind, body, strlen(body), &lim, &q, &e);
    CHECK(rc == status && rc == e.status, "%s: status %d, want %d (%s)", body, rc, status, rc ? e.message : "");
    if (rc) {
        CHECK(code ? e.code && !strcmp(e.code, code) : 1, "%s: code %s, want %s", body, e.code ? e.code : "null", code);
        CHECK(!strcmp(e.param, param), "%s: param '%s', want '%s'", body, e.param, param);
        CHECK(e.message[0] && e.type, "%s: a message and a type", body);
    }
    k3c_api_req_free(&q);
}

static void validation(void) {
    k3c_api_limits lim = limits();
    const char *ok = "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"temperature\":0.5,"
                     "\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,"
                     "\"repetition_penalty\":1.1,\"seed\":-3,\"max_tokens\":10,\"stop\":[\"a\",\"bc\"],"
                     "\"logprobs\":true,\"top_logprobs\":3,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                     "\"unknown_field\":{\"ignored\":1}}";
    k3c_api_req q;
    k3c_api_error e;
    /* fuzz_http_request found it: a model vocabulary smaller than the tokenizer's (chat markers beyond it) gave an
     * accepted prompt with out-of-range ids; now a 500 naming the id (the setup, not the client, is at fault) */
    k3c_api_limits small_vocab = lim;
    small_vocab.n_vocab = 10;
    CHECK(k3c_api_parse(K3C_API_CHAT, ok, strlen(ok), &small_vocab, &q, &e) == 500 && strstr(e.message, "vocabulary"),
          "ids beyond the model's vocabulary refused: %s", e.message);
    k3c_api_req_free(&q);
    /* fuzz_http_request found it: an error quoting a long unknown role of multi-byte characters was cut at the message
     * limit inside a character, so the 400 body was not valid JSON; now the message ends on a character boundary and
     * the JSON writer replaces any invalid byte with U+FFFD */
    for (int pad = 0; pad < 3; pad++) { /* 3-byte characters after 0..2 ASCII bytes: one of them is cut inside */
        k3c_sbuf long_role;
        k3c_sbuf_init(&long_role);
        k3c_sbuf_printf(&long_role, "{\"messages\":[{\"role\":\"%.*s", pad, "xx");
        for (int i = 0; i < 400; i++) k3c_sbuf_printf(&long_role, "\xe2\x82\xac");
        k3c_sbuf_printf(&long_role, "\",\"content\":\"Hi\"}]}");
        int rc = k3c_api_parse(K3C_API_CHAT, long_role.buf, long_role.len, &lim, &q, &e);
        CHECK(rc == 400 && k3c_utf8_valid(e.message, strlen(e.message)),
              "long unknown role (pad %d): 400 with a UTF-8 message (%d)", pad, rc);
        k3c_api_req_free(&q);
        k3c_sbuf body;
        k3c_sbuf_init(&body);
        k3c_api_error_json(&body, &e);
        k3c_json *parsed = NULL;
        CHECK(body.ok && k3c_json_parse(body.buf, body.len, "error", &parsed, NULL) == 0,
              "its error body is valid JSON (pad %d)", pad);
        k3c_json_free(parsed);
        k3c_sbuf_free(&body);
        k3c_sbuf_free(&long_role);
    }
    k3c_sbuf bad;
    k3c_sbuf_init(&bad);
    k3c_sbuf_json_string(&bad, "a\xc3\xa9\xc3|\xff\xe2\x82\xac", 9);
    CHECK(bad.ok && !strcmp(bad.buf, "\"a\xc3\xa9\\ufffd|\\ufffd\xe2\x82\xac\""), "invalid bytes written as U+FFFD: %s",
          bad.buf);
    k3c_sbuf_free(&bad);
    CHECK(k3c_api_parse(K3C_API_CHAT, ok, strlen(ok), &lim, &q, &e) == 0, "valid request: %s", e.message);
    const k3c_sampler *sm = &q.gen.sampler;
    CHECK(sm->temperature == 0.5 && sm->top_p == 0.9 && sm->top_k == 40 && sm->min_p == 0.05 &&
              sm->presence_penalty == 0.5 && sm->frequency_penalty == -0.5 && sm->repetition_penalty == 1.1 &&
              sm->seed == (uint64_t)-3 && q.logprobs == 1 && sm->logprobs == 3,
          "sampling parameters carried");
    CHECK(q.gen.max_new == 10 && q.nstop == 2 && !strcmp(q.stop[1], "bc") && q.stream && q.include_usage,
          "max_tokens, stop, stream");
    CHECK(q.prompt.n > 5 && q.parse.format == K3C_CHAT_XTML && q.parse.in_think == 1, "rendered prompt %zu ids",
          q.prompt.n);
    /* the prompt is the rendered XTML: its markers are special ids */
    int32_t open = k3c_tok_special_id(g_tok, "<|open|>");
    CHECK(q.prompt.ids[0] == open, "the prompt starts with <|open|> (%d)", q.prompt.ids[0]);
    k3c_api_req_free(&q);
    /* no max_tokens: the cap, bounded by the context */
    const char *small = "{\"prompt\":\"Hello world\"}";
    CHECK(k3c_api_parse(K3C_API_COMPLETION, small, strlen(small), &lim, &q, &e) == 0 && q.gen.max_new == 32,
          "default max_tokens = cap (%lld)", (long long)q.gen.max_new);
    k3c_api_req_free(&q);
    const char *ids = "{\"prompt\":[1,2,3],\"max_tokens\":253}";
    CHECK(k3c_api_parse(K3C_API_COMPLETION, ids, strlen(ids), &lim, &q, &e) == 0 && q.prompt.n == 3 &&
              q.gen.max_new == 32,
          "ids prompt, max_tokens capped");
    k3c_api_req_free(&q);

    /* the K2 envelope (Kimi Linear): rendered with its markers; XTML-only options are refused */
    k3c_api_limits k2 = lim;
    k2.format = K3C_CHAT_K2;
    const char *k2body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"tools\":[{\"type\":"
                         "\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]}";
    CHECK(k3c_api_parse(K3C_API_CHAT, k2body, strlen(k2body), &k2, &q, &e) == 0 && q.parse.format == K3C_CHAT_K2 &&
              q.has_tools,
          "K2 request: %s", e.message);
    int32_t im_user = k3c_tok_special_id(g_tok, "<|im_user|>"), seen = 0;
    for (size_t i = 0; i < q.prompt.n; i++) seen |= q.prompt.ids[i] == im_user;
    CHECK(seen, "the K2 prompt holds <|im_user|>");
    k3c_api_req_free(&q);
    const char *k2forced = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"tool_choice\":\"required\","
                           "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]}";
    CHECK(k3c_api_parse(K3C_API_CHAT, k2forced, strlen(k2forced), &k2, &q, &e) == 400 && !strcmp(e.param, "tool_choice"),
          "K2: tool_choice required (not enforceable) is a 400 naming tool_choice: %s", e.message);
    k3c_api_req_free(&q);
    const char *k2bad = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"low\"}";
    CHECK(k3c_api_parse(K3C_API_CHAT, k2bad, strlen(k2bad), &k2, &q, &e) == 0, "effort is dropped for K2: %s",
          e.message);
    k3c_api_req_free(&q);

    expect_error(K3C_API_CHAT, "{\"messages\": [", 400, "invalid_json", "");
    expect_error(K3C_API_CHAT, "[1,2]", 400, "invalid_json", "");
    expect_error(K3C_API_CHAT, "{}", 400, "missing_required_parameter", "messages");
    expect_error(K3C_API_CHAT, "{\"messages\":\"hi\"}", 400, "invalid_type", "messages");
    expect_error(K3C_API_CHAT, "{\"messages\":[]}", 400, "invalid_value", "messages");
    expect_error(K3C_API_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "invalid_value",
                 "messages");
    expect_error(K3C_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}", 400,
                 "invalid_type", "temperature");
    expect_error(K3C_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":3}", 400,
                 "invalid_value", "temperature");
    expect_error(K3C_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":0}", 400,
                 "invalid_value", "top_p");
    expect_error(K3C_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1.5}", 400,
                 "invalid_type", "max_tokens");
    expect_error(K3C_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":17}", 400, "invalid_value",
                 "n");
    expect_error(K3C_API_COMPLETION, "{\"prompt\":\"x\",\"n\":0}", 400, "invalid_value", "n");
    expect_error(K3C_API_CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\",\"b\",\"c\","
                 "\"d\",\"e\"]}",
                 400, "invalid_value", "stop");
    expect_error(K3C_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":7}", 400, "invalid_type",
                 "stop");
    expect_error(K3C_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}", 400,
                 "invalid_type", "tools");
    expect_error(K3C_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", 400,
                 "invalid_value", "top_logprobs");
    expect_error(K3C_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream_options\":{}}", 400,
                 "invalid_value", "stream_options");
    expect_error(K3C_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"huge\"}",
                 400, "invalid_value", "messages");
    expect_error(K3C_API_CHAT, "{\"model\":\"gpt-4\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404,
                 "model_not_found", "model");
    expect_error(K3C_API_CHAT, "{\"model\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400,
                 "invalid_type", "model");
    expect_error(K3C_API_COMPLETION, "{\"prompt\":[1,2,99999]}", 400, "invalid_value", "prompt");
    expect_error(K3C_API_COMPLETION, "{\"prompt\":[1,-2]}", 400, "invalid_value", "prompt");
    expect_error(K3C_API_COMPLETION, "{\"prompt\":[1,\"a\"]}", 400, "invalid_type", "prompt");
    expect_error(K3C_API_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", 400, "invalid_value", "prompt");
    expect_error(K3C_API_COMPLETION, "{\"prompt\":[]}", 400, "invalid_value", "prompt");
    expect_error(K3C_API_COMPLETION, "{\"prompt\":3}", 400, "invalid_type", "prompt");
    expect_error(K3C_API_COMPLETION, "{\"prompt\":\"Hello\",\"max_tokens\":1000}", 400, "context_length_exceeded",
                 "prompt");
    k3c_sbuf big;
    k3c_sbuf_init(&big);
    k3c_sbuf_append(&big, "{\"prompt\":[", 11);
    for (int i = 0; i < 300; i++) k3c_sbuf_printf(&big, "%s%d", i ? "," : "", 65 + i % 20);
    k3c_sbuf_append(&big, "]}", 3);
    expect_error(K3C_API_COMPLETION, big.buf, 400, "context_length_exceeded", "prompt");
    k3c_sbuf_free(&big);
    expect_error(K3C_API_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":9}", 400, "invalid_value", "logprobs");
    expect_error(K3C_API_TOKENIZE, "{\"text\":\"x\"}", 400, "missing_required_parameter", "prompt");
    expect_error(K3C_API_DETOKENIZE, "{\"tokens\":[1,100000]}", 400, "invalid_value", "tokens");
    expect_error(K3C_API_DETOKENIZE, "{\"tokens\":\"1 2\"}", 400, "invalid_type", "tokens");
}

/* ---------------------------------------------------------------- a canned answer through the pipeline as SSE */

static void on_delta_sse(void *ctx, const k3c_chat_delta *d) {
    void **pair = ctx;
    k3c_sse_chat_delta(pair[0], pair[1], d);
}

/* A stream whose whole output was markup: the finish event alone carries the role, and is still valid JSON. */
static void markup_only_stream(void) {
    k3c_sbuf sse;
    k3c_sbuf_init(&sse);
    k3c_api_meta meta;
    k3c_api_meta_init(&meta, 1, "tiny", 42);
    k3c_sse_finish(&sse, &meta, "stop", 0, 7, 3);
    const char *ev = sse.buf ? strstr(sse.buf, "data: {") : NULL, *end = ev ? strstr(ev, "\n\n") : NULL;
    k3c_json *j = NULL;
    k3c_err err = {0};
    CHECK(end != NULL, "no finish event: %s", sse.buf ? sse.buf : "");
    if (end) CHECK_OK(k3c_json_parse(ev + 6, (size_t)(end - ev - 6), "chunk", &j, &err), &err);
    const k3c_json *ch = k3c_json_get(j, "choices");
    const k3c_json *role = ch && ch->n == 1 ? k3c_json_get(k3c_json_get(&ch->items[0], "delta"), "role") : NULL;
    CHECK(role && role->type == K3C_JSON_STRING && !strcmp(role->string, "assistant"), "delta holds the role");
    k3c_json_free(j);
    k3c_sbuf_free(&sse);
}

static void canned_stream(void) {
    const char *out = "Checking the tool.<|close|>think<|sep|><|open|>response<|sep|>Let me look.<|close|>response"
                      "<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument "
                      "key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|><|close|>call<|sep|><|close|>"
                      "tools<|sep|><|close|>message<|sep|><|end_of_msg|>";
    k3c_err err = {0};
    k3c_tok_ids ids = {0};
    CHECK_OK(k3c_tok_encode(g_tok, out, strlen(out), K3C_TOK_ALLOW_SPECIAL, &ids, &err), &err);
    k3c_sbuf sse;
    k3c_sbuf_init(&sse);
    k3c_api_meta meta;
    k3c_api_meta_init(&meta, 1, "tiny", 42);
    void *pair[2] = {&sse, &meta};
    k3c_chat_parse_opts po = {K3C_CHAT_XTML, 1, 0, 0};
    k3c_turn t;
    CHECK_OK(k3c_turn_init(&t, g_tok, &po, NULL, 0, on_delta_sse, NULL, pair, &err), &err);
    int32_t eom = k3c_tok_special_id(g_tok, "<|end_of_msg|>");
    int rc = 0;
    size_t i = 0;
    for (; i < ids.n && rc == 0; i++) rc = k3c_turn_token(&t, ids.ids[i], ids.ids[i] == eom, &err);
    CHECK(rc == 1 && i == ids.n, "ended at the end-of-message id (%d at %zu of %zu)", rc, i, ids.n);
    CHECK_OK(k3c_turn_finish(&t, &err), &err);
    k3c_sse_finish(&sse, &meta, k3c_api_chat_finish(K3C_FINISH_STOP, t.msg.ncalls), 1, 7, (int64_t)ids.n);
    CHECK(t.msg.ncalls == 1 && !strcmp(t.msg.call_name[0], "get_weather") &&
              !strcmp(t.msg.call_args[0], "{\"city\":\"Paris\"}"),
          "one call get_weather(Paris): %zu %s", t.msg.ncalls, t.msg.ncalls ? t.msg.call_args[0] : "");
    CHECK(t.msg.reasoning.len == 18 && !memcmp(t.msg.reasoning.buf, "Checking the tool.", 18), "reasoning");
    CHECK(t.msg.content.len == 12 && !memcmp(t.msg.content.buf, "Let me look.", 12), "content");
    /* every event is a JSON chunk, then [DONE]; together they carry reasoning, content, the call and the finish */
    int events = 0, bad = 0, done = 0, role = 0, call = 0, usage = 0, pieces = 0;
    k3c_sbuf reasoning, content, args;
    k3c_sbuf_init(&args);
    k3c_sbuf_init(&reasoning);
    k3c_sbuf_init(&content);
    const char *fin = NULL;
    for (char *save = NULL, *ev = strtok_r(sse.buf, "\n", &save); ev; ev = strtok_r(NULL, "\n", &save)) {
        events++;
        if (strncmp(ev, "data: ", 6)) {
            bad++;
            continue;
        }
        if (!strcmp(ev + 6, "[DONE]")) {
            done++;
            continue;
        }
        k3c_json *j = NULL;
        if (k3c_json_parse(ev + 6, strlen(ev + 6), "chunk", &j, &err)) {
            bad++;
            continue;
        }
        const k3c_json *ch = k3c_json_get(j, "choices");
        usage += k3c_json_get(j, "usage") != NULL;
        bad += strcmp(k3c_json_get(j, "object")->string, "chat.completion.chunk") != 0;
        if (ch && ch->n) {
            const k3c_json *d = k3c_json_get(&ch->items[0], "delta"), *f = k3c_json_get(&ch->items[0], "finish_reason");
            const k3c_json *r = k3c_json_get(d, "reasoning_content"), *c = k3c_json_get(d, "content");
            const k3c_json *tc = k3c_json_get(d, "tool_calls");
            role += k3c_json_get(d, "role") != NULL;
            if (r) k3c_sbuf_append(&reasoning, r->string, r->len);
            if (c) k3c_sbuf_append(&content, c->string, c->len);
            if (tc) { /* the first delta names the call (id, type, name), the next ones carry argument pieces */
                const k3c_json *fn = k3c_json_get(&tc->items[0], "function"), *nm = k3c_json_get(fn, "name");
                const k3c_json *a = k3c_json_get(fn, "arguments");
                bad += k3c_json_get(&tc->items[0], "index")->integer != 0;
                if (nm) {
                    call += !strcmp(nm->string, "get_weather") && k3c_json_get(&tc->items[0], "id") &&
                            !strcmp(k3c_json_get(&tc->items[0], "type")->string, "function") && a && a->len == 0;
                } else {
                    pieces++;
                    if (a) k3c_sbuf_append(&args, a->string, a->len);
                }
            }
            if (f && f->type == K3C_JSON_STRING) fin = f->string == NULL ? NULL : "tool_calls";
            if (f && f->type == K3C_JSON_STRING) bad += strcmp(f->string, "tool_calls") != 0;
        }
        k3c_json_free(j);
    }
    CHECK(bad == 0 && done == 1 && role == 1 && call == 1 && usage == 1 && fin,
          "SSE: %d events, %d bad, %d done, "
          "%d role, %d call, %d usage",
          events, bad, done, role, call, usage);
    CHECK(reasoning.len == 18 && content.len == 12 && !memcmp(content.buf, "Let me look.", 12),
          "streamed reasoning + content add up");
    CHECK(pieces == 2 && args.len == 16 && !memcmp(args.buf, "{\"city\":\"Paris\"}", 16),
          "the call's arguments streamed in %d pieces add up: %.*s", pieces, (int)args.len, args.buf ? args.buf : "");
    k3c_sbuf_free(&args);
    k3c_sbuf_free(&reasoning);
    k3c_sbuf_free(&content);
    k3c_sbuf_free(&sse);
    k3c_turn_free(&t);
    k3c_tok_ids_free(&ids);
    /* output that breaks the markup is read past, not an error, and none of its markup becomes text */
    const char *broken = "fine<|close|>think<|sep|><|open|>response<|sep|>ok<|tool_call_end|>tail";
    CHECK_OK(k3c_tok_encode(g_tok, broken, strlen(broken), K3C_TOK_ALLOW_SPECIAL, &ids, &err), &err);
    k3c_chat_parse_opts pk = {K3C_CHAT_XTML, 1, 0, 0};
    CHECK_OK(k3c_turn_init(&t, g_tok, &pk, NULL, 0, NULL, NULL, NULL, &err), &err);
    for (i = 0; i < ids.n; i++) CHECK(k3c_turn_token(&t, ids.ids[i], 0, &err) == 0, "token %zu", i);
    CHECK_OK(k3c_turn_finish(&t, &err), &err);
    CHECK(t.msg.content.len == 6 && !memcmp(t.msg.content.buf, "oktail", 6), "broken markup read past: '%s'",
          t.msg.content.buf ? t.msg.content.buf : "");
    k3c_turn_free(&t);
    k3c_tok_ids_free(&ids);
}

/* Runs model output (specials spelled as markers) through a turn with parse options po; the whole response JSON goes
 * to *resp (caller frees), the finish reason as the server picks it. */
static void run_turn(const k3c_chat_parse_opts *po, const char *out, k3c_turn *t, k3c_sbuf *resp) {
    k3c_err err = {0};
    k3c_tok_ids ids = {0};
    CHECK_OK(k3c_tok_encode(g_tok, out, strlen(out), K3C_TOK_ALLOW_SPECIAL, &ids, &err), &err);
    CHECK_OK(k3c_turn_init(t, g_tok, po, NULL, 0, NULL, NULL, NULL, &err), &err);
    int32_t eom = k3c_tok_special_id(g_tok, "<|end_of_msg|>");
    for (size_t i = 0; i < ids.n; i++)
        if (k3c_turn_token(t, ids.ids[i], ids.ids[i] == eom, &err)) break;
    CHECK_OK(k3c_turn_finish(t, &err), &err);
    k3c_api_meta meta;
    k3c_api_meta_init(&meta, 1, "tiny", 7);
    k3c_sbuf_init(resp);
    k3c_api_chat_json(resp, &meta, &t->msg, k3c_api_chat_finish(K3C_FINISH_STOP, t->msg.ncalls), 3, 4);
    k3c_tok_ids_free(&ids);
}

/* n choices: the request keeps n; the answer's choices carry their index, tool call ids differ between choices that
 * share the response id; a streamed choice's chunks and finish carry its index, the usage chunk and [DONE] come once. */
static void choice_objects(void) {
    k3c_api_limits lim = limits();
    k3c_api_req q;
    k3c_api_error e;
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":3}";
    CHECK(k3c_api_parse(K3C_API_CHAT, body, strlen(body), &lim, &q, &e) == 0 && q.n == 3, "n 3 kept");
    k3c_api_req_free(&q);
    CHECK(k3c_api_parse(K3C_API_COMPLETION, "{\"prompt\":\"x\"}", 14, &lim, &q, &e) == 0 && q.n == 1, "n 1 by default");
    k3c_api_req_free(&q);
    const char *call = "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"pay\" index=\"1\"<|sep|>"
                       "<|open|>argument key=\"id\" type=\"number\"<|sep|>7<|close|>argument<|sep|><|close|>call<|sep|>"
                       "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";
    k3c_chat_parse_opts think = {K3C_CHAT_XTML, 1, 0, 0};
    k3c_turn t[2];
    k3c_sbuf one[2], resp, sse;
    k3c_api_meta m[2];
    k3c_sbuf_init(&resp), k3c_sbuf_init(&sse);
    for (int i = 0; i < 2; i++) {
        run_turn(&think, call, &t[i], &one[i]);
        k3c_api_meta_init(&m[i], 1, "tiny", 9);
        m[i].index = i;
    }
    k3c_api_choices_begin(&resp, &m[0]);
    for (int i = 0; i < 2; i++) k3c_api_chat_choice(&resp, &m[i], &t[i].msg, "tool_calls", !i);
    k3c_api_choices_end(&resp, 5, 8);
    k3c_json *j = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_json_parse(resp.buf, resp.len, "response", &j, &err), &err);
    const k3c_json *ch = k3c_json_get(j, "choices"), *u = k3c_json_get(j, "usage");
    const char *id[2] = {"", ""};
    int64_t index[2] = {-1, -1};
    for (size_t i = 0; ch && i < ch->n && i < 2; i++) {
        const k3c_json *tc = k3c_json_get(k3c_json_get(&ch->items[i], "message"), "tool_calls");
        const k3c_json *v = tc && tc->n ? k3c_json_get(&tc->items[0], "id") : NULL;
        id[i] = v && v->type == K3C_JSON_STRING ? v->string : "";
        index[i] = k3c_json_get(&ch->items[i], "index") ? k3c_json_get(&ch->items[i], "index")->integer : -1;
    }
    CHECK(ch && ch->n == 2 && index[0] == 0 && index[1] == 1 && id[0][0] && id[1][0] && strcmp(id[0], id[1]) &&
              k3c_json_get(u, "total_tokens") && k3c_json_get(u, "total_tokens")->integer == 13,
          "two choices, indexes 0 and 1, distinct call ids '%s' '%s': %s", id[0], id[1], resp.buf);
    k3c_json_free(j);
    k3c_chat_delta d = {.kind = K3C_CHAT_DELTA_CONTENT, .text = "hi", .len = 2};
    k3c_sse_chat_delta(&sse, &m[1], &d);
    k3c_sse_choice_finish(&sse, &m[1], "stop");
    k3c_sse_choice_finish(&sse, &m[0], "length");
    k3c_sse_end(&sse, &m[0], 1, 5, 8);
    const char *p = sse.buf ? sse.buf : "",
               *i1 = strstr(p, "\"index\":1,\"delta\":{\"role\":\"assistant\",\"content\":\"hi\"");
    const char *f1 = strstr(p, "\"index\":1,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"");
    const char *f0 =
        strstr(p, "\"index\":0,\"delta\":{\"role\":\"assistant\"},\"logprobs\":null,\"finish_reason\":\"length\"");
    const char *us = strstr(p, "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":8"),
               *done = strstr(p, "data: [DONE]");
    CHECK(i1 && f1 && f0 && us && done && i1 < f1 && f1 < f0 && f0 < us && us < done &&
              !strstr(done + strlen("data: [DONE]"), "[DONE]"),
          "streamed choices: %s", p);
    for (int i = 0; i < 2; i++) k3c_turn_free(&t[i]), k3c_sbuf_free(&one[i]);
    k3c_sbuf_free(&resp), k3c_sbuf_free(&sse);
}

/* The chat format as the release has it, through the request and response code: roles, numbers, the channel the
 * checkpoint's defaults open, and a model whose channel markers do not fit the prompt. */
static void chat_release(void) {
    k3c_api_limits lim = limits();
    lim.max_context = 1024;
    k3c_api_req q;
    k3c_api_error e;
    k3c_err err = {0};
    /* developer is system; the prompt is the same as with a system message */
    const char *dev = "{\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief\"},{\"role\":\"user\","
                      "\"content\":\"Hi\"}]}";
    const char *sys = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief\"},{\"role\":\"user\","
                      "\"content\":\"Hi\"}]}";
    k3c_api_req q2;
    CHECK(k3c_api_parse(K3C_API_CHAT, dev, strlen(dev), &lim, &q, &e) == 0, "developer accepted: %s", e.message);
    CHECK(k3c_api_parse(K3C_API_CHAT, sys, strlen(sys), &lim, &q2, &e) == 0, "system accepted: %s", e.message);
    CHECK(q.prompt.n == q2.prompt.n && q.prompt.n && !memcmp(q.prompt.ids, q2.prompt.ids, q.prompt.n * 4),
          "developer renders as system (%zu / %zu ids)", q.prompt.n, q2.prompt.n);
    k3c_api_req_free(&q);
    k3c_api_req_free(&q2);
    const char *wiz = "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}";
    CHECK(k3c_api_parse(K3C_API_CHAT, wiz, strlen(wiz), &lim, &q, &e) == 400 && strstr(e.message, "'wizard'") &&
              !strcmp(e.param, "messages"),
          "an unknown role is a 400 naming it: %s", e.message);
    k3c_api_req_free(&q);
    /* numbers in a request's tool-call arguments reach the prompt with every digit */
    const char *args = "{\"messages\":[{\"role\":\"user\",\"content\":\"pay\"},{\"role\":\"assistant\",\"content\":"
                       "null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"pay\","
                       "\"arguments\":\"{\\\"id\\\": 12345678901234567890, \\\"amount\\\": 0.1}\"}}]},{\"role\":"
                       "\"tool\",\"tool_call_id\":\"c1\",\"content\":\"{\\\"paid\\\": 12345678901234567890}\"}],"
                       "\"thinking\":false}";
    CHECK(k3c_api_parse(K3C_API_CHAT, args, strlen(args), &lim, &q, &e) == 0, "tool-call request: %s", e.message);
    char *text = NULL;
    size_t tn = 0;
    if (q.prompt.n) CHECK_OK(k3c_tok_decode(g_tok, q.prompt.ids, q.prompt.n, &text, &tn, &err), &err);
    CHECK(text && strstr(text, "key=\"id\" type=\"number\"<|sep|>12345678901234567890<|close|>") &&
              strstr(text, "key=\"amount\" type=\"number\"<|sep|>0.1<|close|>") &&
              strstr(text, "{\"paid\": 12345678901234567890}"),
          "the prompt keeps the digits: %s", text ? text : "");
    CHECK(q.parse.in_response && !q.parse.in_think && !q.parse.strict, "thinking off: the response channel is open");
    free(text);
    k3c_api_req_free(&q);
    /* a checkpoint tuned without thinking: requests default to the response channel, "thinking" still decides */
    lim.thinking_off = 1;
    CHECK(k3c_api_parse(K3C_API_CHAT, sys, strlen(sys), &lim, &q, &e) == 0 && q.parse.in_response && !q.parse.in_think,
          "thinking_off default");
    k3c_api_req_free(&q);
    const char *on = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"thinking\":true}";
    CHECK(k3c_api_parse(K3C_API_CHAT, on, strlen(on), &lim, &q, &e) == 0 && q.parse.in_think && !q.parse.in_response,
          "an explicit thinking wins");
    k3c_api_req_free(&q);

    /* the model's arguments come back in the response with every digit */
    k3c_turn t;
    k3c_sbuf resp;
    k3c_chat_parse_opts think = {K3C_CHAT_XTML, 1, 0, 0};
    const char *calls = "<|open|>tools<|sep|><|open|>call tool=\"pay\" index=\"1\"<|sep|><|open|>argument key=\"id\" "
                        "type=\"number\"<|sep|>12345678901234567890<|close|>argument<|sep|><|open|>argument "
                        "key=\"amount\" type=\"number\"<|sep|>0.1<|close|>argument<|sep|><|close|>call<|sep|><|close|>"
                        "tools<|sep|><|close|>message<|sep|><|end_of_msg|>";
    char out[2048];
    /* the case: the prompt opened think, the model closes response and calls the tool */
    snprintf(out, sizeof out, "<|close|>response<|sep|>%s", calls);
    run_turn(&think, out, &t, &resp);
    k3c_json *j = NULL;
    CHECK_OK(k3c_json_parse(resp.buf, resp.len, "response", &j, &err), &err);
    const k3c_json *ch = j ? k3c_json_get(j, "choices") : NULL, *c0 = ch && ch->n ? &ch->items[0] : NULL;
    const k3c_json *msg = k3c_json_get(c0, "message"), *tc = k3c_json_get(msg, "tool_calls");
    const k3c_json *fn = tc && tc->n ? k3c_json_get(&tc->items[0], "function") : NULL;
    const k3c_json *a = k3c_json_get(fn, "arguments"), *fin = k3c_json_get(c0, "finish_reason");
    CHECK(a && a->type == K3C_JSON_STRING && !strcmp(a->string, "{\"id\":12345678901234567890,\"amount\":0.1}"),
          "arguments unchanged: %s", resp.buf);
    CHECK(fin && !strcmp(fin->string, "tool_calls") && t.msg.content.len == 0 && t.msg.reasoning.len == 0,
          "a tool call, no markup as text: %s", resp.buf);
    k3c_json_free(j);
    k3c_sbuf_free(&resp);
    k3c_turn_free(&t);
    /* no control token in any text field, whatever the model writes */
    const char *messy = "a<|sep|>b<|close|>call<|sep|><|open|>response<|sep|>c<|im_end|>d<|open|>x<|sep|>e[EOS]";
    run_turn(&think, messy, &t, &resp);
    CHECK(!strstr(resp.buf, "<|") && !strstr(resp.buf, "[EOS]") && t.msg.content.len == 3 &&
              !memcmp(t.msg.content.buf, "cde", 3) && t.msg.reasoning.len == 2,
          "messy output: %s", resp.buf);
    k3c_sbuf_free(&resp);
    k3c_turn_free(&t);
}

/* A special token that is no chat marker (here an image token of the vision tokenizer) has no text in a reply. */
static void other_specials(void) {
    const char *dir = test_tmpdir("serve_units_vision");
    k3c_tok *tok = NULL;
    k3c_err err = {0};
    if (serve_model_dir_v(dir, 1) || k3c_tok_load_dir(dir, NULL, &tok, &err)) {
        CHECK(0, "vision tokenizer: %s", err.msg);
        return;
    }
    k3c_tok_ids ids = {0};
    const char *out = "a<|media_pad|>b<|open|>response<|sep|>c<|media_end|>";
    CHECK_OK(k3c_tok_encode(tok, out, strlen(out), K3C_TOK_ALLOW_SPECIAL, &ids, &err), &err);
    k3c_chat_parse_opts po = {K3C_CHAT_XTML, 0, 1, 0};
    k3c_turn t;
    CHECK_OK(k3c_turn_init(&t, tok, &po, NULL, 0, NULL, NULL, NULL, &err), &err);
    for (size_t i = 0; i < ids.n; i++) CHECK(k3c_turn_token(&t, ids.ids[i], 0, &err) == 0, "token %zu", i);
    CHECK_OK(k3c_turn_finish(&t, &err), &err);
    CHECK(t.msg.content.len == 3 && !memcmp(t.msg.content.buf, "abc", 3), "image tokens are no text: '%s'",
          t.msg.content.buf ? t.msg.content.buf : "");
    k3c_turn_free(&t);
    k3c_tok_ids_free(&ids);
    k3c_tok_free(tok);
}

/* trainer_state.json's "chat" record: thinking on / off, absent, malformed. */
static void chat_defaults(void) {
    const char *dir = test_tmpdir("serve_units_chat");
    char path[4200];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    const char *bodies[4] = {"{\"step\": 3, \"chat\": {\"format\": \"xtml\", \"thinking\": false}}",
                             "{\"step\": 3, \"chat\": {\"thinking\": true}}", "{\"step\": 3}",
                             "{\"chat\": {\"thinking\": \"no\"}}"};
    int want[4] = {0, 1, -1, -1};
    k3c_err err = {0};
    int thinking = 5;
    remove(path);
    CHECK(k3c_turn_chat_thinking(dir, &thinking, &err) == 0 && thinking == -1, "no trainer_state.json: unrecorded");
    for (int i = 0; i < 4; i++) {
        FILE *f = fopen(path, "w");
        if (!f) continue;
        fputs(bodies[i], f);
        fclose(f);
        int rc = k3c_turn_chat_thinking(dir, &thinking, &err);
        if (i < 3)
            CHECK(rc == 0 && thinking == want[i], "record %d: rc %d thinking %d (%s)", i, rc, thinking, err.msg);
        else
            CHECK(rc != 0 && strstr(err.msg, "chat.thinking"), "malformed record refused: %s", err.msg);
    }
}

static void error_body(void) {
    k3c_api_error e;
    k3c_api_fail(&e, 401, "authentication_error", "invalid_api_key", NULL, "bad key \"%s\"", "x");
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    k3c_api_error_json(&s, &e);
    CHECK(!strcmp(s.buf,
                  "{\"error\":{\"message\":\"bad key \\\"x\\\"\",\"type\":\"authentication_error\",\"param\":null,"
                  "\"code\":\"invalid_api_key\"}}"),
          "error body: %s", s.buf);
    k3c_sbuf_free(&s);
}

/* ---------------------------------------------------------------- the Anthropic Messages request */

/* body (Messages API) through k3c_anthropic_chat_body and the chat parser; 0 or the error status. */
static int anthropic_parse(const char *body, k3c_api_req *q, k3c_api_error *e) {
    k3c_api_limits lim = limits();
    lim.max_context = 2048; /* room for the tool definitions' prompt */
    lim.max_tokens_cap = 120; /* and for a forced tool call (tool_choice any) */
    k3c_json *j = NULL;
    k3c_err err = {0};
    memset(q, 0, sizeof *q);
    CHECK_OK(k3c_json_parse(body, strlen(body), "body", &j, &err), &err);
    k3c_sbuf chat;
    k3c_sbuf_init(&chat);
    int rc = j ? k3c_anthropic_chat_body(j, &chat, e) : 400;
    if (!rc) rc = k3c_api_parse(K3C_API_CHAT, chat.buf, chat.len, &lim, q, e);
    k3c_sbuf_free(&chat);
    k3c_json_free(j);
    return rc;
}

#define THREAD_BODY                                                                                                    \
    "{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thread\":{\"type\":\"continue\","        \
    "\"previous_message_id\":\"msg_1\"}}"

/* A Messages request renders the same prompt as the chat request it stands for: system blocks, thinking, a tool_use
 * with a big integer, its tool_result, tools, tool_choice any without parallel calls, stop_sequences. */
static void anthropic_request(void) {
    const char *am =
        "{\"model\":\"tiny\",\"max_tokens\":120,\"system\":[{\"type\":\"text\",\"text\":\"Be brief.\"}],"
        "\"thinking\":{\"type\":\"disabled\"},\"stop_sequences\":[\"END\"],\"temperature\":0.5,"
        "\"tools\":[{\"name\":\"pay\",\"description\":\"Pays.\",\"input_schema\":{\"type\":\"object\","
        "\"properties\":{\"id\":{\"type\":\"integer\"}}}}],"
        "\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":true},"
        "\"messages\":[{\"role\":\"user\",\"content\":\"Pay it.\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Paying.\"},{\"type\":\"tool_use\","
        "\"id\":\"t1\",\"name\":\"pay\",\"input\":{\"id\":12345678901234567890}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":"
        "[{\"type\":\"text\",\"text\":\"paid 0.1\"}]},{\"type\":\"text\",\"text\":\"Thanks.\"}]}]}";
    const char *oa =
        "{\"model\":\"tiny\",\"max_tokens\":120,\"thinking\":false,\"stop\":[\"END\"],\"temperature\":0.5,"
        "\"parallel_tool_calls\":false,\"tool_choice\":\"required\","
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"pay\",\"description\":\"Pays.\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}}}}}],"
        "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Pay it.\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Paying.\"}],\"tool_calls\":[{\"id\":\"t1\","
        "\"type\":\"function\",\"function\":{\"name\":\"pay\",\"arguments\":{\"id\":12345678901234567890}}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"t1\",\"content\":\"paid 0.1\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Thanks.\"}]}]}";
    k3c_api_limits lim = limits();
    lim.max_context = 2048;
    lim.max_tokens_cap = 120; /* room for the forced tool call (tool_choice any) */
    k3c_api_req a, o;
    k3c_api_error e;
    int ra = anthropic_parse(am, &a, &e);
    CHECK(ra == 0, "Messages request parses: %d %s", ra, ra ? e.message : "");
    int ro = k3c_api_parse(K3C_API_CHAT, oa, strlen(oa), &lim, &o, &e);
    CHECK(ro == 0, "the chat request parses: %d %s", ro, ro ? e.message : "");
    if (!ra && !ro) {
        CHECK(a.prompt.n == o.prompt.n && !memcmp(a.prompt.ids, o.prompt.ids, a.prompt.n * sizeof *a.prompt.ids),
              "same prompt (%zu and %zu ids)", a.prompt.n, o.prompt.n);
        CHECK(a.gen.max_new == 120 && a.nstop == 1 && !strcmp(a.stop[0], "END") && a.one_call && a.has_tools &&
                  a.parse.in_response && !a.parse.in_think && a.gen.sampler.temperature == 0.5,
              "max_tokens, stop_sequences, disable_parallel_tool_use, thinking disabled, temperature");
        char *text = NULL;
        size_t n = 0;
        k3c_err err = {0};
        CHECK_OK(k3c_tok_decode(g_tok, a.prompt.ids, a.prompt.n, &text, &n, &err), &err);
        CHECK(text && strstr(text, "12345678901234567890") && strstr(text, "paid 0.1"),
              "the big integer and the tool result reach the prompt unchanged");
        free(text);
    }
    k3c_api_req_free(&a);
    k3c_api_req_free(&o);
    static const struct {
        const char *body, *param;
        int status;
    } bad[] = {
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "max_tokens", 400},
        {"{\"max_tokens\":4}", "messages", 400},
        {"{\"max_tokens\":4,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", "messages", 400},
        {"{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\","
         "\"name\":\"f\",\"input\":{}}]}]}",
         "messages", 400},
        {"{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"tool\"}}",
         "tool_choice", 400},
        {"{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"on\"}}",
         "thinking", 400},
        {"{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"system\":[{\"type\":\"image\"}]}",
         "system", 400},
        {"{\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "max_tokens", 400},
        {"{\"max_tokens\":4,\"model\":\"big\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "model", 404},
        {THREAD_BODY, "thread", 400},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        k3c_api_req q;
        int rc = anthropic_parse(bad[i].body, &q, &e);
        CHECK(rc == bad[i].status && !strcmp(e.param, bad[i].param), "%s: %d (%s) want %d on %s", bad[i].body, rc,
              rc ? e.param : "", bad[i].status, bad[i].param);
        k3c_api_req_free(&q);
    }
}

/* A thread is refused in the shape the SDKs read as "send the full history": error.details.error_code. */
static void anthropic_thread(void) {
    k3c_api_req q;
    k3c_api_error e;
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    if (anthropic_parse(THREAD_BODY, &q, &e) == 400) k3c_anth_error_json(&s, &e);
    k3c_json *j = NULL;
    k3c_err err = {0};
    const k3c_json *d = s.buf && !k3c_json_parse(s.buf, s.len, "error", &j, &err)
                            ? k3c_json_get(k3c_json_get(j, "error"), "details")
                            : NULL,
                   *code = k3c_json_get(d, "error_code");
    CHECK(code && code->type == K3C_JSON_STRING && !strcmp(code->string, "thread_unsupported_request"),
          "thread: error.details.error_code: %s", s.buf ? s.buf : "");
    k3c_json_free(j);
    k3c_sbuf_free(&s);
    k3c_api_req_free(&q);
}

int main(void) {
    const char *dir = test_tmpdir("serve_units");
    if (serve_model_dir(dir) == 0) {
        k3c_err err = {0};
        CHECK_OK(k3c_tok_load_dir(dir, NULL, &g_tok, &err), &err);
    }
    if (g_tok) {
        stop_strings();
        validation();
        canned_stream();
        markup_only_stream();
        chat_release();
        chat_defaults();
        other_specials();
        anthropic_request();
        anthropic_thread();
        choice_objects();
    }
    error_body();
    k3c_tok_free(g_tok);
    return test_summary();
}
