/* test_serve_anthropic.c — `k3c serve`'s Anthropic Messages endpoint end to end (docs/SERVING.md §8): a whole answer
 * (message object, content blocks, stop_reason, usage), a stream (named events in order, blocks opened and closed,
 * message_delta's usage), a tool_use / tool_result round trip, the key as x-api-key or Bearer, errors in Anthropic's
 * shape. On the tiny random-weight model of test_serve. */
#include "serve_fixture.h"

/* POST /v1/messages with the key as x-api-key (NULL: none) and anthropic-version. */
static int post_xkey(int port, const char *key, const char *body, http_resp *r) {
    memset(r, 0, sizeof *r);
    int fd = http_connect(port);
    if (fd < 0) return -1;
    char head[512];
    size_t n = strlen(body);
    int h = snprintf(head, sizeof head,
                     "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: "
                     "application/json\r\nanthropic-version: 2023-06-01\r\n%s%s%sContent-Length: %zu\r\n\r\n",
                     key ? "x-api-key: " : "", key ? key : "", key ? "\r\n" : "", n);
    int rc = send(fd, head, (size_t)h, MSG_NOSIGNAL) == h && send(fd, body, n, MSG_NOSIGNAL) == (ssize_t)n
                 ? http_read(fd, r)
                 : -1;
    close(fd);
    return rc;
}

/* "" for an absent member, so messages can print it */
static const char *sget(const k3c_json *o, const char *key) { return json_str(o, key) ? json_str(o, key) : ""; }

static int64_t iget(const k3c_json *o, const char *key) {
    const k3c_json *v = k3c_json_get(o, key);
    return v && v->type == K3C_JSON_NUMBER && v->is_integer ? v->integer : -1;
}

static int known_stop(const char *s) {
    return !strcmp(s, "end_turn") || !strcmp(s, "max_tokens") || !strcmp(s, "stop_sequence") || !strcmp(s, "tool_use");
}

#define TOOLS                                                                                                          \
    "\"tools\":[{\"name\":\"get_weather\",\"description\":\"Current weather\",\"input_schema\":{\"type\":\"object\","  \
    "\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}]"

static void whole(int port) {
    const char *body = "{\"model\":\"tiny\",\"max_tokens\":8,\"system\":\"Be brief.\",\"temperature\":0.7,"
                       "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024}," TOOLS
                       ",\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]}";
    http_resp r;
    CHECK(post_xkey(port, "sk-test", body, &r) == 0 && r.status == 200, "whole answer: %d %s", r.status,
          r.body ? r.body : "");
    k3c_json *j = http_json(r.body, r.body_len);
    const k3c_json *content = k3c_json_get(j, "content"), *u = k3c_json_get(j, "usage");
    int blocks_ok = content && content->type == K3C_JSON_ARRAY && content->n > 0;
    for (size_t i = 0; blocks_ok && i < content->n; i++) {
        const char *t = sget(&content->items[i], "type");
        blocks_ok = !strcmp(t, "text") || !strcmp(t, "thinking") || !strcmp(t, "tool_use");
    }
    CHECK(j && !strcmp(sget(j, "type"), "message") && !strcmp(sget(j, "role"), "assistant") &&
              !strncmp(sget(j, "id"), "msg_", 4) && !strcmp(sget(j, "model"), "tiny") && blocks_ok &&
              known_stop(sget(j, "stop_reason")) && iget(u, "input_tokens") > 10 && iget(u, "output_tokens") >= 1 &&
              iget(u, "output_tokens") <= 8,
          "message object: %s", r.body ? r.body : "");
    k3c_json_free(j);
    http_resp_free(&r);
    /* max_tokens 1 ends at the limit: stop_reason max_tokens (unless the one token ended the turn) */
    const char *one = "{\"model\":\"tiny\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}";
    CHECK(http_do(port, "POST", "/v1/messages", "Bearer sk-test", one, &r) == 0 && r.status == 200, "Bearer key: %d",
          r.status);
    j = http_json(r.body, r.body_len);
    CHECK(j && (!strcmp(sget(j, "stop_reason"), "max_tokens") || !strcmp(sget(j, "stop_reason"), "end_turn")) &&
              iget(k3c_json_get(j, "usage"), "output_tokens") == 1,
          "max_tokens 1: %s", r.body ? r.body : "");
    k3c_json_free(j);
    http_resp_free(&r);
}

static void tool_round_trip(int port) {
    const char *body =
        "{\"model\":\"tiny\",\"max_tokens\":4," TOOLS ",\"tool_choice\":{\"type\":\"auto\"},\"messages\":["
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Weather in Paris?\"}]},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"Use the "
        "tool.\",\"signature\":\"\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{\"city\":\"Paris\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":\"18C\"}]}]"
        "}";
    http_resp r;
    CHECK(post_xkey(port, "sk-test", body, &r) == 0 && r.status == 200, "tool_result turn: %d %s", r.status,
          r.body ? r.body : "");
    http_resp_free(&r);
}

/* Walks the named events: their order, each data a JSON object of the event's type, blocks balanced. */
static void streamed(int port) {
    const char *body = "{\"model\":\"tiny\",\"max_tokens\":12,\"stream\":true," TOOLS
                       ",\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]}";
    http_resp r;
    CHECK(post_xkey(port, "sk-test", body, &r) == 0 && r.status == 200, "stream: %d", r.status);
    int n = 0, bad = 0, open = 0, starts = 0, deltas = 0, pings = 0, first_start = 0, last_stop = 0, md = 0;
    int64_t out = -1;
    char *save = NULL, name[64] = "";
    for (char *line = r.body ? strtok_r(r.body, "\n", &save) : NULL; line; line = strtok_r(NULL, "\n", &save)) {
        if (!strncmp(line, "event: ", 7)) {
            snprintf(name, sizeof name, "%s", line + 7);
            continue;
        }
        if (strncmp(line, "data: ", 6)) {
            bad++;
            continue;
        }
        k3c_json *j = http_json(line + 6, strlen(line + 6));
        bad += !j || strcmp(sget(j, "type"), name);
        if (n == 0) first_start = !strcmp(name, "message_start");
        last_stop = !strcmp(name, "message_stop");
        pings += !strcmp(name, "ping");
        if (!strcmp(name, "content_block_start")) open++, starts++;
        if (!strcmp(name, "content_block_stop")) open--;
        if (!strcmp(name, "content_block_delta")) {
            const char *t = sget(k3c_json_get(j, "delta"), "type");
            deltas++;
            bad += strcmp(t, "text_delta") && strcmp(t, "thinking_delta") && strcmp(t, "input_json_delta") &&
                   strcmp(t, "signature_delta");
            bad += open != 1;
        }
        if (!strcmp(name, "message_delta")) {
            md++;
            bad += !known_stop(sget(k3c_json_get(j, "delta"), "stop_reason"));
            out = iget(k3c_json_get(j, "usage"), "output_tokens");
        }
        k3c_json_free(j);
        n++;
    }
    CHECK(bad == 0 && first_start && last_stop && pings == 1 && open == 0 && starts >= 1 && deltas >= 1 && md == 1 &&
              out >= 1 && out <= 12,
          "stream events: %d, %d bad, %d open, %d blocks, %d deltas, output_tokens %lld", n, bad, open, starts, deltas,
          (long long)out);
    http_resp_free(&r);
}

static void expect_error(int port, const char *key, const char *body, int status, const char *type) {
    http_resp r;
    int rc = post_xkey(port, key, body, &r);
    k3c_json *j = http_json(r.body, r.body_len);
    const k3c_json *e = k3c_json_get(j, "error");
    CHECK(rc == 0 && r.status == status && !strcmp(sget(j, "type"), "error") && !strcmp(sget(e, "type"), type) &&
              sget(e, "message")[0],
          "%s: %d %s, want %d %s", body, r.status, r.body ? r.body : "", status, type);
    k3c_json_free(j);
    http_resp_free(&r);
}

static void errors(int port) {
    const char *ok = "{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}";
    expect_error(port, NULL, ok, 401, "authentication_error");
    expect_error(port, "sk-wrong", ok, 401, "authentication_error");
    expect_error(port, "sk-test", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", 400,
                 "invalid_request_error");
    expect_error(port, "sk-test", "{not json", 400, "invalid_request_error");
    expect_error(port, "sk-test",
                 "{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"x\"}]}]}", 400,
                 "invalid_request_error");
    expect_error(port, "sk-test",
                 "{\"model\":\"big\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", 404,
                 "not_found_error");
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const char *tmp = test_tmpdir("serve_anthropic");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", tmp);
    if (serve_model_dir(dir) != 0) return test_summary();
    static const char *const args[] = {"--slots", "2",      "--api-key", "sk-test", "--max-tokens-cap",
                                       "24",      "--name", "tiny",      NULL};
    serve_proc sv = serve_start(dir, args);
    if (sv.port) {
        whole(sv.port);
        tool_round_trip(sv.port);
        streamed(sv.port);
        errors(sv.port);
        CHECK(metric(sv.port, "\nk3c_generation_tokens_total ") >= 4, "the Messages answers generated tokens");
    }
    serve_stop(&sv);
    return test_summary();
}
