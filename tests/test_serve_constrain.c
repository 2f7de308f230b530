/* test_serve_constrain.c — constrained decoding through `k3c serve` (docs/SERVING.md "Constrained decoding"): on the
 * tiny random-weight model of test_serve, sampled at temperature 1, response_format json_object and strict json_schema
 * answers parse and validate (whole and streamed, thinking on and off), tool_choice required / named / none and
 * parallel_tool_calls false shape the calls, Anthropic's tool_choice any / tool / none likewise, and a schema outside
 * the subset, an unknown tool or a budget too small for the answer are 400s naming the parameter. */
#include "http_client.h"
#include "serve_fixture.h"

/* "" for an absent member, so messages can print it */
static const char *sget(const k3c_json *o, const char *key) { return json_str(o, key) ? json_str(o, key) : ""; }

/* POSTs body to path; the parsed response (NULL when not JSON), its status in *status. */
static k3c_json *post(int port, const char *path, const char *body, int *status) {
    http_resp r;
    int rc = http_do(port, "POST", path, "Bearer sk-test", body, &r);
    *status = rc ? -1 : r.status;
    k3c_json *j = http_json(r.body, r.body_len);
    if (!j && r.status == 200) CHECK(0, "%s: not JSON: %.300s", path, r.body ? r.body : "");
    http_resp_free(&r);
    return j;
}

static const k3c_json *message(const k3c_json *j) {
    const k3c_json *ch = k3c_json_get(j, "choices");
    return ch && ch->type == K3C_JSON_ARRAY && ch->n ? k3c_json_get(&ch->items[0], "message") : NULL;
}

static const char *finish(const k3c_json *j) {
    const k3c_json *ch = k3c_json_get(j, "choices");
    return ch && ch->type == K3C_JSON_ARRAY && ch->n ? sget(&ch->items[0], "finish_reason") : "";
}

/* ---------------------------------------------------------------- a validator of the test schema */

#define SCHEMA                                                                                                         \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"            \
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\"]}},\"ok\":{\"type\":\"boolean\"},"          \
    "\"note\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}},"                                              \
    "\"required\":[\"name\",\"age\",\"tags\",\"ok\",\"note\"],\"additionalProperties\":false}"

static int valid_answer(const k3c_json *v) {
    static const char *const keys[] = {"name", "age", "tags", "ok", "note"};
    if (!v || v->type != K3C_JSON_OBJECT || v->n != 5) return 0;
    for (int k = 0; k < 5; k++)
        if (!k3c_json_get(v, keys[k])) return 0;
    const k3c_json *age = k3c_json_get(v, "age"), *tags = k3c_json_get(v, "tags"), *note = k3c_json_get(v, "note");
    if (k3c_json_get(v, "name")->type != K3C_JSON_STRING || age->type != K3C_JSON_NUMBER || !age->is_integer ||
        k3c_json_get(v, "ok")->type != K3C_JSON_BOOL || tags->type != K3C_JSON_ARRAY ||
        (note->type != K3C_JSON_STRING && note->type != K3C_JSON_NULL))
        return 0;
    for (size_t i = 0; i < tags->n; i++)
        if (tags->items[i].type != K3C_JSON_STRING ||
            (strcmp(tags->items[i].string, "red") && strcmp(tags->items[i].string, "green")))
            return 0;
    return 1;
}

/* ---------------------------------------------------------------- response_format */

static void json_answers(int port) {
    char body[2048];
    int n = 0, good = 0, objects = 0, status;
    for (int i = 0; i < 8; i++, n++) { /* json_object, thinking on (the default) and off */
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Give JSON.\"}],\"seed\":%d,\"max_tokens\":%d,"
                 "\"thinking\":%s,\"response_format\":{\"type\":\"json_object\"}}",
                 i, 40 + 10 * i, i % 2 ? "false" : "true");
        k3c_json *j = post(port, "/v1/chat/completions", body, &status);
        const k3c_json *m = message(j);
        k3c_json *v = http_json(sget(m, "content"), strlen(sget(m, "content")));
        int ok = status == 200 && v && v->type == K3C_JSON_OBJECT && !strcmp(finish(j), "stop");
        objects += ok;
        if (!ok)
            CHECK(0, "json_object %d: %d, finish %s, content %.300s %s", i, status, finish(j), sget(m, "content"),
                  sget(k3c_json_get(j, "error"), "message"));
        k3c_json_free(v);
        k3c_json_free(j);
    }
    CHECK(objects == 8, "json_object: %d of 8 answers are JSON objects", objects);
    for (int i = 0; i < 8; i++) { /* strict json_schema */
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"A person.\"}],\"seed\":%d,\"max_tokens\":%d,"
                 "\"thinking\":%s,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"person\","
                 "\"strict\":true,\"schema\":" SCHEMA "}}}",
                 100 + i, 80 + 15 * i, i % 2 ? "false" : "true");
        k3c_json *j = post(port, "/v1/chat/completions", body, &status);
        const k3c_json *m = message(j);
        k3c_json *v = http_json(sget(m, "content"), strlen(sget(m, "content")));
        int ok = status == 200 && valid_answer(v);
        good += ok;
        if (!ok) CHECK(0, "json_schema %d: %d, content %.400s", i, status, sget(m, "content"));
        k3c_json_free(v);
        k3c_json_free(j);
    }
    CHECK(good == 8, "json_schema strict: %d of 8 answers parse and validate", good);
}

/* n samples of one constrained request: each has its own automaton, so every choice validates. */
static void n_samples(int port) {
    char body[2048];
    int status;
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"A person.\"}],\"seed\":5,\"max_tokens\":120,\"n\":3,"
             "\"thinking\":false,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\","
             "\"strict\":true,\"schema\":" SCHEMA "}}}");
    k3c_json *j = post(port, "/v1/chat/completions", body, &status);
    const k3c_json *ch = k3c_json_get(j, "choices");
    CHECK(status == 200 && ch && ch->type == K3C_JSON_ARRAY && ch->n == 3, "n 3 with json_schema: %d, 3 choices",
          status);
    for (size_t i = 0; ch && ch->type == K3C_JSON_ARRAY && i < ch->n; i++) {
        const char *c = sget(k3c_json_get(&ch->items[i], "message"), "content");
        k3c_json *v = http_json(c, strlen(c));
        CHECK(valid_answer(v), "n 3: choice %zu validates: %.300s", i, c);
        k3c_json_free(v);
    }
    k3c_json_free(j);
}

/* The streamed content deltas add up to a valid answer. */
static void streamed_schema(int port) {
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"A person.\"}],\"seed\":7,\"max_tokens\":90,"
                       "\"stream\":true,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\","
                       "\"strict\":true,\"schema\":" SCHEMA "}}}";
    http_resp r;
    CHECK(http_do(port, "POST", "/v1/chat/completions", "Bearer sk-test", body, &r) == 0 && r.status == 200,
          "stream: %d", r.status);
    k3c_sbuf content;
    k3c_sbuf_init(&content);
    char *save = NULL;
    for (char *line = r.body ? strtok_r(r.body, "\n", &save) : NULL; line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "data: {", 7)) continue;
        k3c_json *j = http_json(line + 6, strlen(line + 6));
        const k3c_json *ch = k3c_json_get(j, "choices");
        const k3c_json *d = ch && ch->n ? k3c_json_get(&ch->items[0], "delta") : NULL;
        const char *c = sget(d, "content");
        k3c_sbuf_append(&content, c, strlen(c));
        k3c_json_free(j);
    }
    k3c_json *v = http_json(content.buf ? content.buf : "", content.len);
    CHECK(valid_answer(v), "streamed json_schema answer validates: %.*s", (int)content.len,
          content.buf ? content.buf : "");
    k3c_json_free(v);
    k3c_sbuf_free(&content);
    http_resp_free(&r);
}

/* ---------------------------------------------------------------- tool_choice */

#define TOOLS                                                                                                          \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","    \
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}}},"       \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\",\"properties\":"    \
    "{\"zone\":{\"type\":\"string\",\"pattern\":\"^[A-Z]\"}}}}}]"

/* The calls of an answer: all named one of the tools (only `only` when given) with object arguments, get_weather's
 * with a string city; the count, -1 when one is wrong. */
static int check_calls(const k3c_json *msg, const char *only, const char *what) {
    const k3c_json *calls = k3c_json_get(msg, "tool_calls");
    if (!calls || calls->type != K3C_JSON_ARRAY) return 0;
    for (size_t i = 0; i < calls->n; i++) {
        const k3c_json *fn = k3c_json_get(&calls->items[i], "function");
        const char *name = sget(fn, "name"), *args = sget(fn, "arguments");
        k3c_json *a = http_json(args, strlen(args));
        int ok = a && a->type == K3C_JSON_OBJECT && (!strcmp(name, "get_weather") || !strcmp(name, "get_time")) &&
                 (!only || !strcmp(name, only));
        if (ok && !strcmp(name, "get_weather")) ok = k3c_json_get(a, "city") && k3c_json_get(a, "city")->type == K3C_JSON_STRING;
        k3c_json_free(a);
        if (!ok) {
            CHECK(0, "%s: call %zu %s(%s)", what, i, name, args);
            return -1;
        }
    }
    return (int)calls->n;
}

static void tool_choices(int port) {
    char body[2048];
    int status, required = 0, named = 0, none = 0, single = 0;
    for (int i = 0; i < 6; i++) {
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]," TOOLS
                 ",\"seed\":%d,\"max_tokens\":%d,\"thinking\":%s,\"tool_choice\":\"required\"}",
                 i, 110 + 15 * i, i % 2 ? "false" : "true");
        k3c_json *j = post(port, "/v1/chat/completions", body, &status);
        int n = check_calls(message(j), NULL, "required");
        required += status == 200 && n >= 1 && !strcmp(finish(j), "tool_calls");
        if (!(status == 200 && n >= 1 && !strcmp(finish(j), "tool_calls"))) {
            k3c_sbuf t;
            k3c_sbuf_init(&t);
            if (j) k3c_sbuf_json_value(&t, j, 0);
            k3c_sbuf_append(&t, "", 0);
            CHECK(0, "required %d: %d %s", i, status, t.buf);
            k3c_sbuf_free(&t);
        }
        k3c_json_free(j);
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Time?\"}]," TOOLS
                 ",\"seed\":%d,\"max_tokens\":120,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":"
                 "\"get_time\"}}}",
                 i);
        j = post(port, "/v1/chat/completions", body, &status);
        n = check_calls(message(j), "get_time", "named");
        named += status == 200 && n >= 1;
        k3c_json_free(j);
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]," TOOLS
                 ",\"seed\":%d,\"max_tokens\":40,\"tool_choice\":\"none\"}",
                 i);
        j = post(port, "/v1/chat/completions", body, &status);
        const k3c_json *tc = k3c_json_get(message(j), "tool_calls");
        none += status == 200 && (!tc || tc->type == K3C_JSON_NULL || tc->n == 0) && !strcmp(finish(j), "stop");
        k3c_json_free(j);
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]," TOOLS
                 ",\"seed\":%d,\"max_tokens\":150,\"thinking\":false,\"tool_choice\":\"required\","
                 "\"parallel_tool_calls\":false}",
                 i);
        j = post(port, "/v1/chat/completions", body, &status);
        single += status == 200 && check_calls(message(j), NULL, "one call") == 1;
        k3c_json_free(j);
    }
    CHECK(required == 6, "tool_choice required: %d of 6 answers are tool calls of the given tools", required);
    CHECK(named == 6, "tool_choice named: %d of 6 answers call get_time", named);
    CHECK(none == 6, "tool_choice none: %d of 6 answers have no tool call", none);
    CHECK(single == 6, "parallel_tool_calls false: %d of 6 answers have exactly one call", single);
}

/* Anthropic's tool_choice goes through the same chat body. */
static void anthropic_choices(int port) {
    static const char *const choice[] = {"{\"type\":\"any\"}", "{\"type\":\"tool\",\"name\":\"get_time\"}",
                                         "{\"type\":\"none\"}"};
    char body[2048];
    int good[3] = {0};
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 3; i++) {
            snprintf(body, sizeof body,
                     "{\"model\":\"tiny\",\"max_tokens\":120,\"thinking\":{\"type\":\"disabled\"},\"tools\":["
                     "{\"name\":\"get_weather\",\"input_schema\":{\"type\":\"object\",\"properties\":{\"city\":"
                     "{\"type\":\"string\"}},\"required\":[\"city\"]}},{\"name\":\"get_time\",\"input_schema\":"
                     "{\"type\":\"object\"}}],\"tool_choice\":%s,\"messages\":[{\"role\":\"user\",\"content\":\"Go\"}]"
                     ",\"metadata\":{\"user_id\":\"%d\"}}",
                     choice[c], i);
            int status;
            k3c_json *j = post(port, "/v1/messages", body, &status);
            const k3c_json *content = k3c_json_get(j, "content");
            int uses = 0, named = 1;
            for (size_t b = 0; content && b < content->n; b++)
                if (!strcmp(sget(&content->items[b], "type"), "tool_use")) {
                    uses++;
                    named &= c != 1 || !strcmp(sget(&content->items[b], "name"), "get_time");
                    named &= k3c_json_get(&content->items[b], "input") &&
                             k3c_json_get(&content->items[b], "input")->type == K3C_JSON_OBJECT;
                }
            const char *stop = sget(j, "stop_reason");
            if (status != 200 || (c != 2 && !uses)) CHECK(0, "Anthropic %s: %d stop %s, error %s", choice[c], status, stop,
                                                 sget(k3c_json_get(j, "error"), "message"));
            good[c] += status == 200 &&
                       (c == 2 ? uses == 0 && !strcmp(stop, "end_turn") : uses >= 1 && named && !strcmp(stop, "tool_use"));
            k3c_json_free(j);
        }
    CHECK(good[0] == 3, "Anthropic tool_choice any: %d of 3 answers use a tool", good[0]);
    CHECK(good[1] == 3, "Anthropic tool_choice tool: %d of 3 answers use get_time", good[1]);
    CHECK(good[2] == 3, "Anthropic tool_choice none: %d of 3 answers use no tool", good[2]);
}

/* ---------------------------------------------------------------- refusals */

static void refused(int port, const char *body, const char *param, const char *code, const char *in_message) {
    int status;
    k3c_json *j = post(port, "/v1/chat/completions", body, &status);
    const k3c_json *e = k3c_json_get(j, "error");
    CHECK(status == 400 && !strcmp(sget(e, "param"), param) && (!code || !strcmp(sget(e, "code"), code)) &&
              strstr(sget(e, "message"), in_message) && !strcmp(sget(e, "type"), "invalid_request_error"),
          "%s: %d param '%s' code '%s' message '%s'", body, status, sget(e, "param"), sget(e, "code"),
          sget(e, "message"));
    k3c_json_free(j);
}

static void refusals(int port) {
    refused(port,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\","
            "\"json_schema\":{\"name\":\"a\",\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":{\"a\":"
            "{\"type\":\"string\",\"pattern\":\"^x\"}}}}}}",
            "response_format", "unsupported_schema", "/properties/a/pattern");
    refused(port,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\","
            "\"json_schema\":{\"name\":\"a\",\"schema\":{\"type\":\"array\",\"minItems\":1}}}}",
            "response_format", "unsupported_schema", "/minItems");
    refused(port, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"yaml\"}}",
            "response_format", "invalid_value", "json_schema");
    refused(port,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," TOOLS ",\"tool_choice\":{\"type\":\"function\","
            "\"function\":{\"name\":\"nope\"}}}",
            "tool_choice", "invalid_value", "nope");
    refused(port, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}", "tool_choice",
            "invalid_value", "no 'tools'");
    refused(port,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":3,\"response_format\":{\"type\":"
            "\"json_schema\",\"json_schema\":{\"name\":\"p\",\"schema\":" SCHEMA "}}}",
            "max_tokens", "invalid_value", "shortest answer");
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    (void)metric; /* http_client.h's /metrics reader: not needed here */
    const char *tmp = test_tmpdir("serve_constrain");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", tmp);
    if (serve_model_dir(dir) != 0) return test_summary();
    static const char *const args[] = {"--slots", "4", "--api-key", "sk-test", "--max-tokens-cap", "200", "--name",
                                       "tiny", NULL};
    serve_proc sv = serve_start(dir, args);
    const int port = sv.port;
    if (port) {
        json_answers(port);
        n_samples(port);
        streamed_schema(port);
        tool_choices(port);
        anthropic_choices(port);
        refusals(port);
    }
    serve_stop(&sv);
    return test_summary();
}
