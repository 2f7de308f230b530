/* test_serve.c — `k3c serve` end to end: starts it on a free loopback port with a tiny model built on the spot, waits
 * for /health, streams a chat request with a tool (every SSE chunk valid JSON, usage, [DONE]), checks whole chat and
 * text completions, /tokenize ↔ /detokenize, /metrics counters, every kind of bad request (4xx with an OpenAI error
 * body), logprobs in the OpenAI shapes (whole and streamed), four concurrent streams batched by the engine (a seeded
 * one gives the same text as alone), a client that hangs up mid-stream (its sequence leaves the engine), then SIGTERM
 * (a clean exit). Also `k3c chat` on piped stdin. */
#include "serve_fixture.h"

#include <sys/stat.h>

#define KEY "Bearer sk-test"

/* The flags every server of this test starts with. */
static const char *const ARGS[] = {"--slots",    "4",     "--api-key", "sk-test", "--max-tokens-cap",  "48",
                                   "--max-body", "65536", "--name",    "tiny",    "--max-image-bytes", "400",
                                   NULL};

static k3c_json *parse_body(const http_resp *r) {
    k3c_json *j = NULL;
    k3c_err err = {0};
    if (!r->body || k3c_json_parse(r->body, r->body_len, "response", &j, &err)) return NULL;
    return j;
}

static const k3c_json *path(const k3c_json *j, const char *a, const char *b) {
    const k3c_json *v = k3c_json_get(j, a);
    return b ? k3c_json_get(v, b) : v;
}

#define TOOLS                                                                                                          \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Current weather\","              \
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}]"

static void streamed_chat(int port) {
    const char *body = "{\"model\":\"tiny\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":"
                       "\"user\",\"content\":\"Weather in Paris?\"}],\"tools\":" TOOLS ",\"tool_choice\":\"auto\","
                       "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"max_tokens\":24,\"seed\":5,"
                       "\"temperature\":0.9,\"top_k\":50,\"min_p\":0.01,\"stop\":[\"zzqq\"]}";
    http_resp r;
    CHECK(http_do(port, "POST", "/v1/chat/completions", KEY, body, &r) == 0, "stream request");
    CHECK(r.status == 200 && r.headers && strcasestr(r.headers, "content-type: text/event-stream"), "SSE reply %d",
          r.status);
    int events = 0, bad = 0, done = 0, after_done = 0, finish = 0, role = 0;
    int64_t completion = -1, prompt = -1, total = -1;
    for (char *save = NULL, *ev = r.body ? strtok_r(r.body, "\n", &save) : NULL; ev; ev = strtok_r(NULL, "\n", &save)) {
        events++;
        after_done += done;
        if (strncmp(ev, "data: ", 6)) {
            bad++;
            continue;
        }
        if (!strcmp(ev + 6, "[DONE]")) {
            done++;
            continue;
        }
        k3c_json *j = NULL;
        k3c_err err = {0};
        if (k3c_json_parse(ev + 6, strlen(ev + 6), "chunk", &j, &err)) {
            printf("  bad chunk: %s (%s)\n", ev, err.msg);
            bad++;
            continue;
        }
        const k3c_json *o = k3c_json_get(j, "object"), *ch = k3c_json_get(j, "choices"), *u = k3c_json_get(j, "usage");
        bad += !o || strcmp(o->string, "chat.completion.chunk") || !ch || !k3c_json_get(j, "id");
        if (ch && ch->n) {
            const k3c_json *f = k3c_json_get(&ch->items[0], "finish_reason");
            role += path(&ch->items[0], "delta", "role") != NULL;
            if (f && f->type == K3C_JSON_STRING) {
                finish++;
                bad += strcmp(f->string, "stop") && strcmp(f->string, "length") && strcmp(f->string, "tool_calls");
            }
        }
        if (u) {
            prompt = k3c_json_get(u, "prompt_tokens")->integer;
            completion = k3c_json_get(u, "completion_tokens")->integer;
            total = k3c_json_get(u, "total_tokens")->integer;
        }
        k3c_json_free(j);
    }
    CHECK(events >= 4 && bad == 0 && done == 1 && after_done == 0 && finish == 1 && role == 1,
          "SSE: %d events, %d bad, %d [DONE] (%d after), %d finish, %d role", events, bad, done, after_done, finish,
          role);
    CHECK(prompt > 20 && completion >= 1 && completion <= 24 && total == prompt + completion,
          "usage %lld + %lld = %lld", (long long)prompt, (long long)completion, (long long)total);
    http_resp_free(&r);
}

static void whole_answers(int port) {
    http_resp r;
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":12,\"seed\":1,"
                       "\"thinking\":false}";
    CHECK(http_do(port, "POST", "/v1/chat/completions", KEY, chat, &r) == 0 && r.status == 200, "chat %d", r.status);
    k3c_json *j = parse_body(&r);
    const k3c_json *ch = k3c_json_get(j, "choices"), *u = k3c_json_get(j, "usage");
    const k3c_json *msg = ch && ch->n ? k3c_json_get(&ch->items[0], "message") : NULL;
    CHECK(j && !strcmp(k3c_json_get(j, "object")->string, "chat.completion") && msg &&
              !strcmp(k3c_json_get(msg, "role")->string, "assistant") &&
              k3c_json_get(msg, "content")->type == K3C_JSON_STRING,
          "chat.completion with an assistant message: %s", r.body);
    CHECK(u && k3c_json_get(u, "completion_tokens")->integer <= 12 &&
              k3c_json_get(u, "total_tokens")->integer ==
                  k3c_json_get(u, "prompt_tokens")->integer + k3c_json_get(u, "completion_tokens")->integer,
          "usage adds up");
    k3c_json_free(j);
    http_resp_free(&r);
    /* developer is OpenAI's system role; whatever the (random) model writes, no chat control token is text */
    const char *dev = "{\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},{\"role\":\"user\","
                      "\"content\":\"Hi\"}],\"max_tokens\":24,\"seed\":5}";
    CHECK(http_do(port, "POST", "/v1/chat/completions", KEY, dev, &r) == 0 && r.status == 200 && r.body &&
              !strstr(r.body, "<|open|>") && !strstr(r.body, "<|close|>") && !strstr(r.body, "<|sep|>") &&
              !strstr(r.body, "<|end_of_msg|>"),
          "developer role: %d %s", r.status, r.body ? r.body : "");
    http_resp_free(&r);
    /* text completions: a string prompt and an id prompt; greedy is deterministic */
    const char *greedy = "{\"prompt\":\"Hello world\",\"max_tokens\":8,\"temperature\":0}";
    char first[4096] = "";
    for (int k = 0; k < 2; k++) {
        CHECK(http_do(port, "POST", "/v1/completions", KEY, greedy, &r) == 0 && r.status == 200, "completion %d",
              r.status);
        j = parse_body(&r);
        ch = k3c_json_get(j, "choices");
        const k3c_json *text = ch && ch->n ? k3c_json_get(&ch->items[0], "text") : NULL;
        CHECK(j && text && !strcmp(k3c_json_get(j, "object")->string, "text_completion") &&
                  k3c_json_get(path(j, "usage", NULL), "completion_tokens")->integer <= 8,
              "text_completion: %s", r.body);
        if (text && k == 0) snprintf(first, sizeof first, "%s", text->string);
        if (text && k == 1) CHECK(!strcmp(first, text->string), "greedy twice: '%s' vs '%s'", first, text->string);
        k3c_json_free(j);
        http_resp_free(&r);
    }
    CHECK(http_do(port, "POST", "/v1/completions", KEY, "{\"prompt\":[5,6,7],\"max_tokens\":3,\"stream\":true}", &r) ==
                  0 &&
              r.status == 200 && strstr(r.body, "\"text_completion\"") && strstr(r.body, "data: [DONE]\n\n"),
          "streamed completion from ids: %s", r.body ? r.body : "");
    http_resp_free(&r);
}

/* ---------------------------------------------------------------- batching, logprobs, seeds */

/* The logprob entries of a chat "logprobs" object ({"content": [...]}) or a completions one (tokens, token_logprobs,
 * top_logprobs, text_offset): counts them and the invalid ones (a logprob > 0, a top list not sorted or of the wrong
 * length, with greedy the chosen token not first in it). */
static void check_logprobs(const k3c_json *lp, int chat, int top, int greedy, int *n, int *bad) {
    if (!lp || lp->type != K3C_JSON_OBJECT) {
        (*bad)++;
        return;
    }
    if (chat) {
        const k3c_json *c = k3c_json_get(lp, "content");
        if (!c || c->type != K3C_JSON_ARRAY) {
            (*bad)++;
            return;
        }
        for (size_t i = 0; i < c->n; i++, (*n)++) {
            const k3c_json *e = &c->items[i], *t = k3c_json_get(e, "token"), *l = k3c_json_get(e, "logprob"),
                           *b = k3c_json_get(e, "bytes"), *tl = k3c_json_get(e, "top_logprobs");
            if (!t || t->type != K3C_JSON_STRING || !l || !(l->number <= 0) || !b || b->type != K3C_JSON_ARRAY || !tl ||
                tl->type != K3C_JSON_ARRAY || (int)tl->n != top) {
                (*bad)++;
                continue;
            }
            for (size_t k = 0; k < tl->n; k++) {
                const k3c_json *lk = k3c_json_get(&tl->items[k], "logprob");
                *bad += !lk || !(lk->number <= 0) ||
                        (k && !(lk->number <= k3c_json_get(&tl->items[k - 1], "logprob")->number));
            }
            if (greedy && top >= 1)
                *bad += strcmp(k3c_json_get(&tl->items[0], "token")->string, t->string) ||
                        k3c_json_get(&tl->items[0], "logprob")->number != l->number;
        }
        return;
    }
    const k3c_json *t = k3c_json_get(lp, "tokens"), *l = k3c_json_get(lp, "token_logprobs"),
                   *tl = k3c_json_get(lp, "top_logprobs"), *o = k3c_json_get(lp, "text_offset");
    if (!t || !l || !tl || !o || l->n != t->n || tl->n != t->n || o->n != t->n) {
        (*bad)++;
        return;
    }
    for (size_t i = 0; i < t->n; i++, (*n)++) {
        const k3c_json *d = &tl->items[i];
        *bad += !(l->items[i].number <= 0) || d->type != K3C_JSON_OBJECT || d->n < 1 || (int)d->n > top ||
                (i && o->items[i].integer < o->items[i - 1].integer);
        int found = 0;
        for (size_t k = 0; k < d->n; k++) {
            *bad += !(d->items[k].number <= 0);
            found |= d->items[k].number == l->items[i].number;
        }
        if (greedy) *bad += !found;
    }
}

/* Walks an SSE body: counts chunks, finish reasons, [DONE], appends completions text, checks logprobs (top < 0: none
 * asked for, so every "logprobs" must be null). */
typedef struct {
    int chunks, finish, done, bad, n_lp;
    char text[4096];
} sse_sum;

static void sse_walk(char *body, int chat, int top, sse_sum *o) {
    memset(o, 0, sizeof *o);
    for (char *save = NULL, *ev = body ? strtok_r(body, "\n", &save) : NULL; ev; ev = strtok_r(NULL, "\n", &save)) {
        if (!strcmp(ev, "data: [DONE]")) {
            o->done++;
            continue;
        }
        k3c_json *j = NULL;
        k3c_err err = {0};
        if (strncmp(ev, "data: ", 6) || k3c_json_parse(ev + 6, strlen(ev + 6), "chunk", &j, &err)) {
            o->bad++;
            continue;
        }
        const k3c_json *ch = k3c_json_get(j, "choices");
        if (ch && ch->n) {
            o->chunks++;
            const k3c_json *c0 = &ch->items[0], *f = k3c_json_get(c0, "finish_reason"),
                           *lp = k3c_json_get(c0, "logprobs");
            const k3c_json *t = k3c_json_get(c0, "text");
            o->finish += f && f->type == K3C_JSON_STRING;
            if (t && t->type == K3C_JSON_STRING && strlen(o->text) + strlen(t->string) < sizeof o->text)
                strcat(o->text, t->string);
            if (top < 0)
                o->bad += !lp || lp->type != K3C_JSON_NULL;
            else
                check_logprobs(lp, chat, top, 0, &o->n_lp, &o->bad);
        }
        k3c_json_free(j);
    }
}

/* Chat and completions with logprobs, whole and streamed: valid entries, one per generated token (no stop id). */
static void logprobs_answers(int port) {
    http_resp r;
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":10,\"temperature\":0,"
                       "\"logprobs\":true,\"top_logprobs\":3,\"thinking\":false}";
    CHECK(http_do(port, "POST", "/v1/chat/completions", KEY, chat, &r) == 0 && r.status == 200, "chat %d", r.status);
    k3c_json *j = parse_body(&r);
    const k3c_json *ch = k3c_json_get(j, "choices");
    int n = 0, bad = 0;
    int64_t gen = j ? k3c_json_get(k3c_json_get(j, "usage"), "completion_tokens")->integer : -1;
    if (ch && ch->n) check_logprobs(k3c_json_get(&ch->items[0], "logprobs"), 1, 3, 1, &n, &bad);
    CHECK(bad == 0 && n >= 1 && (n == gen || n == gen - 1), "chat logprobs: %d entries for %lld tokens, %d bad: %s", n,
          (long long)gen, bad, r.body);
    k3c_json_free(j);
    http_resp_free(&r);
    const char *cmpl = "{\"prompt\":\"Hello world\",\"max_tokens\":8,\"temperature\":0,\"logprobs\":2}";
    CHECK(http_do(port, "POST", "/v1/completions", KEY, cmpl, &r) == 0 && r.status == 200, "completion %d", r.status);
    j = parse_body(&r);
    ch = k3c_json_get(j, "choices");
    n = 0, bad = 0;
    gen = j ? k3c_json_get(k3c_json_get(j, "usage"), "completion_tokens")->integer : -1;
    if (ch && ch->n) check_logprobs(k3c_json_get(&ch->items[0], "logprobs"), 0, 2, 1, &n, &bad);
    CHECK(bad == 0 && n >= 1 && (n == gen || n == gen - 1), "completion logprobs: %d for %lld, %d bad: %s", n,
          (long long)gen, bad, r.body);
    k3c_json_free(j);
    http_resp_free(&r);
    /* streamed: spread over the chunks, as many in all */
    const char *streams[2] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":10,\"seed\":3,"
        "\"logprobs\":true,\"top_logprobs\":2,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
        "{\"prompt\":\"Hello\",\"max_tokens\":10,\"seed\":3,\"logprobs\":1,\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true}}"};
    for (int k = 0; k < 2; k++) {
        CHECK(http_do(port, "POST", k ? "/v1/completions" : "/v1/chat/completions", KEY, streams[k], &r) == 0 &&
                  r.status == 200,
              "stream %d", r.status);
        const char *u = r.body ? strstr(r.body, "\"completion_tokens\":") : NULL;
        gen = u ? atoll(u + 20) : -1;
        sse_sum o;
        sse_walk(r.body, k == 0, k ? 1 : 2, &o);
        CHECK(o.bad == 0 && o.done == 1 && o.finish == 1 && o.n_lp >= 1 && (o.n_lp == gen || o.n_lp == gen - 1),
              "%s stream logprobs: %d for %lld tokens, %d bad", k ? "completion" : "chat", o.n_lp, (long long)gen,
              o.bad);
        http_resp_free(&r);
    }
}

static char *long_prompt_body(int n, int max_tokens) {
    k3c_sbuf b;
    k3c_sbuf_init(&b);
    k3c_sbuf_append(&b, "{\"prompt\":[", 11);
    for (int i = 0; i < n; i++) k3c_sbuf_printf(&b, "%s%d", i ? "," : "", 32 + (i * 37) % 380);
    k3c_sbuf_printf(&b, "],\"max_tokens\":%d,\"stream\":true,\"min_p\":0.0}", max_tokens);
    return b.buf;
}

/* Four streams at once (a long prompt first, so the others join while it runs): every one completes, the engine ran
 * more than one sequence in a step, and a seeded request gives the same text alone and amid the others. */
static void concurrent_streams(int port) {
    const char *seeded = "{\"prompt\":\"The weather in\",\"max_tokens\":16,\"seed\":42,\"temperature\":0.8,"
                         "\"top_k\":30,\"repetition_penalty\":1.2,\"presence_penalty\":0.5,\"stream\":true}";
    const char *others[2] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"}],\"max_tokens\":24,\"seed\":9,"
        "\"stream\":true}",
        "{\"prompt\":\"café\",\"max_tokens\":24,\"seed\":11,\"stream\":true}"};
    http_resp r;
    CHECK(http_do(port, "POST", "/v1/completions", KEY, seeded, &r) == 0 && r.status == 200, "seeded alone");
    sse_sum alone;
    sse_walk(r.body, 0, -1, &alone);
    http_resp_free(&r);
    double max0 = metric(port, "\nk3c_engine_batch_max ");
    char *first = long_prompt_body(3000, 48);
    const char *bodies[4] = {first, others[0], seeded, others[1]};
    const char *paths[4] = {"/v1/completions", "/v1/chat/completions", "/v1/completions", "/v1/completions"};
    int fds[4];
    for (int i = 0; i < 4; i++) {
        fds[i] = http_connect(port);
        CHECK(fds[i] >= 0 && http_send(fds[i], "POST", paths[i], KEY, bodies[i], strlen(bodies[i])) == 0, "send %d", i);
    }
    double running = metric(port, "\nk3c_running ");
    int complete = 0;
    sse_sum o[4];
    for (int i = 0; i < 4; i++) {
        int rc = fds[i] >= 0 ? http_read(fds[i], &r) : -1;
        if (fds[i] >= 0) close(fds[i]);
        if (rc == 0) sse_walk(r.body, i == 1, -1, &o[i]);
        complete +=
            rc == 0 && r.status == 200 && o[i].bad == 0 && o[i].done == 1 && o[i].finish == 1 && o[i].chunks >= 2;
        http_resp_free(&r);
    }
    free(first);
    double max1 = metric(port, "\nk3c_engine_batch_max "), steps = metric(port, "\nk3c_engine_steps_total "),
           seqs = metric(port, "\nk3c_engine_step_sequences_total ");
    CHECK(complete == 4, "all 4 concurrent streams completed (%d)", complete);
    CHECK(max1 >= 2 && max1 > max0 - 1 && seqs > steps,
          "the engine batched them: at most %g at once (before %g), %g "
          "sequence-steps in %g steps; running %g while they were open",
          max1, max0, seqs, steps, running);
    CHECK(alone.done == 1 && alone.text[0] && !strcmp(alone.text, o[2].text),
          "seeded text alone '%s' and amid 3 other streams '%s'", alone.text, o[2].text);
}

static void tokenize_round_trip(int port) {
    http_resp r;
    CHECK(http_do(port, "POST", "/tokenize", KEY, "{\"prompt\":\"Hello world, 東京 café\"}", &r) == 0 &&
              r.status == 200,
          "tokenize %d", r.status);
    k3c_json *j = parse_body(&r);
    const k3c_json *t = k3c_json_get(j, "tokens");
    CHECK(t && t->type == K3C_JSON_ARRAY && t->n > 2 && k3c_json_get(j, "count")->integer == (int64_t)t->n,
          "tokens: %s", r.body);
    k3c_sbuf b;
    k3c_sbuf_init(&b);
    k3c_sbuf_append(&b, "{\"tokens\":[", 11);
    for (size_t i = 0; t && i < t->n; i++) k3c_sbuf_printf(&b, "%s%lld", i ? "," : "", (long long)t->items[i].integer);
    k3c_sbuf_append(&b, "]}", 2);
    k3c_json_free(j);
    http_resp_free(&r);
    CHECK(http_do(port, "POST", "/detokenize", KEY, b.buf, &r) == 0 && r.status == 200, "detokenize %d", r.status);
    j = parse_body(&r);
    const k3c_json *p = k3c_json_get(j, "prompt");
    CHECK(p && !strcmp(p->string, "Hello world, 東京 café"), "round trip: %s", r.body);
    k3c_json_free(j);
    http_resp_free(&r);
    k3c_sbuf_free(&b);
}

/* The error body: {"error": {"message": string, "type": string, "param", "code"}}. */
static void expect(int port, const char *method, const char *url, const char *auth, const char *body, int status,
                   const char *code) {
    http_resp r;
    int rc = http_do(port, method, url, auth, body, &r);
    k3c_json *j = rc ? NULL : parse_body(&r);
    const k3c_json *e = k3c_json_get(j, "error"), *c = k3c_json_get(e, "code");
    CHECK(!rc && r.status == status, "%s %s: status %d, want %d", method, url, r.status, status);
    CHECK(e && k3c_json_get(e, "message") && k3c_json_get(e, "message")->type == K3C_JSON_STRING &&
              k3c_json_get(e, "type") && k3c_json_get(e, "param") && c,
          "%s %s: OpenAI error body: %s", method, url, r.body ? r.body : "");
    if (c && code) CHECK(c->type == K3C_JSON_STRING && !strcmp(c->string, code), "code %s, want %s", r.body, code);
    k3c_json_free(j);
    http_resp_free(&r);
}

/* Two 30x20 PNGs (2 image tokens each after padding to 56x28), made with zlib once. */
#define PNG_A                                                                                                          \
    "iVBORw0KGgoAAAANSUhEUgAAAB4AAAAUCAIAAAAVyRqTAAAALklEQVR42mNgENGAoBN3PkAQ1URGjUYTob6JMJFRo9GNHk18o+l6NF2PpmsKRA"   \
    "Akp0vutlNl+wAAAABJRU5ErkJggg=="
#define PNG_B                                                                                                          \
    "iVBORw0KGgoAAAANSUhEUgAAAB4AAAAUCAIAAAAVyRqTAAAAL0lEQVR42mPYcukDMmKQs0FGlMgy0NBoKpqFLktDo0fDejSsR8N6NKxHw3pIhDUA" \
    "br"                                                                                                               \
    "VL7r05uEsAAAAASUVORK5CYII="

/* A chat body whose user message is an image part with url, then text. */
static char *image_body(const char *url) {
    k3c_sbuf b;
    k3c_sbuf_init(&b);
    k3c_sbuf_printf(&b,
                    "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":"
                    "\"%s\"}},{\"type\":\"text\",\"text\":\"What is this?\"}]}],\"max_tokens\":1,\"temperature\":0,"
                    "\"logprobs\":true,\"thinking\":false}",
                    url);
    return b.buf;
}

/* The answer to an image chat: status, prompt tokens and the first token's logprob text. */
static int image_chat(int port, const char *url, long *prompt_tokens, char *lp, size_t n) {
    char *body = image_body(url);
    http_resp r;
    int rc = http_do(port, "POST", "/v1/chat/completions", KEY, body, &r), st = rc ? -1 : r.status;
    free(body);
    k3c_json *j = st == 200 ? parse_body(&r) : NULL;
    const k3c_json *u = path(j, "usage", "prompt_tokens");
    *prompt_tokens = u && u->type == K3C_JSON_NUMBER ? (long)u->number : -1;
    const char *p = r.body ? strstr(r.body, "\"logprob\":") : NULL;
    snprintf(lp, n, "%.24s", p ? p : "");
    k3c_json_free(j);
    http_resp_free(&r);
    return st;
}

/* Image parts on a model with a vision tower: answered, the image reaches the logits, bad images are 4xx. */
static void image_requests(int port) {
    long na = 0, nb = 0;
    char la[32], lb[32];
    CHECK(image_chat(port, "data:image/png;base64," PNG_A, &na, la, sizeof la) == 200, "image chat A answered");
    CHECK(image_chat(port, "data:image/png;base64," PNG_B, &nb, lb, sizeof lb) == 200, "image chat B answered");
    CHECK(na == nb && na > 4, "both prompts hold the image's tokens (%ld, %ld)", na, nb);
    CHECK(la[0] && lb[0] && strcmp(la, lb), "different images give different logprobs (%s vs %s)", la, lb);
    const char *chat = "/v1/chat/completions";
    static const struct {
        const char *url, *code;
        int status;
    } bad[] = {{"https://example.com/cat.png", "invalid_image_url", 400},
               {"data:image/png;base64,@@@@", "invalid_base64", 400},
               {"data:image/png;base64,aGVsbG8gd29ybGQh", "invalid_image", 400},
               {"data:image/gif;base64," PNG_A, "invalid_image_format", 400},
               {"data:image/png," PNG_A, "invalid_image_url", 400},
               {"data:image/png;base64," PNG_A PNG_A PNG_A PNG_A, "image_too_large", 413}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *body = image_body(bad[i].url);
        expect(port, "POST", chat, KEY, body, bad[i].status, bad[i].code);
        free(body);
    }
}

static void bad_requests(int port) {
    const char *chat = "/v1/chat/completions";
    expect(port, "POST", chat, KEY, "{\"messages\":[{\"role\":\"user\"", 400, "invalid_json");
    expect(port, "POST", chat, KEY, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":\"many\"}",
           400, "invalid_type");
    expect(port, "POST", chat, KEY, "{\"model\":\"gpt-9\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404,
           "model_not_found");
    expect(port, "POST", chat, KEY, "{\"model\":\"tiny\"}", 400, "missing_required_parameter");
    expect(port, "POST", chat, KEY, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "invalid_value");
    expect(port, "POST", chat, KEY, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":5000}", 400,
           "context_length_exceeded");
    expect(port, "POST", "/v1/completions", KEY, "{\"prompt\":[1,2,1000000]}", 400, "invalid_value");
    expect(port, "POST", chat, "Bearer wrong", "{\"messages\":[]}", 401, "invalid_api_key");
    expect(port, "POST", chat, NULL, "{\"messages\":[]}", 401, "invalid_api_key");
    expect(port, "GET", "/v1/models", NULL, NULL, 401, "invalid_api_key");
    expect(port, "GET", "/v2/nothing", KEY, NULL, 404, "unknown_url");
    expect(port, "GET", chat, KEY, NULL, 405, "method_not_allowed");
    char *img = image_body("data:image/png;base64," PNG_A);
    expect(port, "POST", chat, KEY, img, 400, "model_not_multimodal");
    free(img);
    /* a prompt longer than the context (4096), and a body over --max-body 65536 */
    k3c_sbuf b;
    k3c_sbuf_init(&b);
    k3c_sbuf_append(&b, "{\"prompt\":[", 11);
    for (int i = 0; i < 5000; i++) k3c_sbuf_printf(&b, "%s%d", i ? "," : "", 7);
    k3c_sbuf_append(&b, "]}", 2);
    expect(port, "POST", "/v1/completions", KEY, b.buf, 400, "context_length_exceeded");
    while (b.len < 70000) k3c_sbuf_append(&b, "          ", 10);
    expect(port, "POST", "/v1/completions", KEY, b.buf, 413, "request_too_large");
    k3c_sbuf_free(&b);
    /* still fine afterwards */
    http_resp r;
    CHECK(http_do(port, "GET", "/v1/models", KEY, NULL, &r) == 0 && r.status == 200 && strstr(r.body, "\"tiny\""),
          "models after the bad requests: %s", r.body ? r.body : "");
    http_resp_free(&r);
}

/* A client that reads the first chunk of a long stream and hangs up: its generation ends and the slot is freed. */
static void hang_up(int port) {
    int fd = http_connect(port);
    const char *body = "{\"prompt\":\"Hello\",\"max_tokens\":48,\"stream\":true,\"min_p\":0.0}";
    CHECK(fd >= 0 && http_send(fd, "POST", "/v1/completions", KEY, body, strlen(body)) == 0, "send");
    char buf[256];
    CHECK(recv(fd, buf, sizeof buf, 0) > 0, "first bytes of the stream");
    close(fd);
    double running = 1;
    for (int i = 0; i < 200 && running != 0; i++) {
        usleep(50 * 1000);
        running = metric(port, "\nk3c_running ");
    }
    CHECK(running == 0, "slot freed after the hang-up (running %g)", running);
    http_resp r;
    CHECK(http_do(port, "POST", "/v1/completions", KEY, "{\"prompt\":\"Hi\",\"max_tokens\":2}", &r) == 0 &&
              r.status == 200,
          "served after the hang-up: %d", r.status);
    http_resp_free(&r);
}

static int run_cmd(const char *cmd, char *out, size_t n) {
    FILE *p = popen(cmd, "r");
    size_t got = p ? fread(out, 1, n - 1, p) : 0;
    out[got] = 0;
    int st = p ? pclose(p) : -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* `k3c generate --stop`: the text stops right before the stop string, a prefix of the unstopped text. */
static void generate_stop(const char *dir) {
    char cmd[4600], full[8192], cut[8192];
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt 'Hello world' --greedy 24 2>&1", test_k3c_bin(), dir);
    int rc = run_cmd(cmd, full, sizeof full);
    CHECK(rc == 0 && strlen(full) > 13, "generate: %s", full);
    /* stop at the third character of the continuation, whatever the model wrote */
    char stop[8] = {0};
    memcpy(stop, full + 13, 2);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt 'Hello world' --greedy 24 --stop '%s' 2>&1",
             test_k3c_bin(), dir, stop);
    rc = run_cmd(cmd, cut, sizeof cut);
    size_t n = strlen(cut);
    CHECK(rc == 0 && n >= 12 && cut[n - 1] == '\n' && !strstr(cut + 11, stop) && !strncmp(full, cut, n - 1) &&
              n - 1 <= 13,
          "--stop '%s': '%s' vs '%s'", stop, cut, full);
}

/* `serve --device cuda` in a CPU build is refused up front (before listening), naming the CUDA build. */
static void device_cuda_refused(const char *dir) {
    char cmd[4600], out[8192];
    snprintf(cmd, sizeof cmd, "%s serve --model %s --port 0 --device cuda 2>&1", test_k3c_bin(), dir);
    int rc = run_cmd(cmd, out, sizeof out);
    CHECK(rc == 1 && strstr(out, "make cuda") && !strstr(out, "listening"), "--device cuda refused (%d): %s", rc, out);
}

/* The vision model: k3c serve with image parts, k3c chat --image. */
static void vision_model(const char *tmp) {
    char dir[4200], png[4300], cmd[9000], out[8192];
    snprintf(dir, sizeof dir, "%.4000s/vision", tmp);
    mkdir(dir, 0755);
    if (serve_model_dir_v(dir, 1) != 0) return;
    serve_proc sv = serve_start(dir, ARGS);
    if (sv.port) image_requests(sv.port);
    serve_stop(&sv);
    unsigned char bytes[128];
    size_t n = 0;
    snprintf(png, sizeof png, "%s/a.png", dir);
    k3c_err err = {0};
    CHECK(k3c_base64_decode(PNG_A, strlen(PNG_A), bytes, &n) == 0, "PNG_A decodes");
    CHECK_OK(k3c_write_file_atomic(png, bytes, n, &err), &err);
    snprintf(cmd, sizeof cmd, "printf 'What is this?\\n' | %s chat --model %s --image %s --max-tokens 3 2>&1",
             test_k3c_bin(), dir, png);
    FILE *p = popen(cmd, "r");
    size_t m = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[m] = 0;
    int st = p ? pclose(p) : -1;
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && !strstr(out, "k3c chat:"), "k3c chat --image: %s", out);
    snprintf(cmd, sizeof cmd, "printf 'Hi\\n' | %s chat --model %s --image %s 2>&1", test_k3c_bin(), dir, dir);
    p = popen(cmd, "r");
    m = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[m] = 0;
    st = p ? pclose(p) : -1;
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) != 0 && strstr(out, dir), "k3c chat --image DIR fails naming it: %s", out);
}

static void chat_cli(const char *dir) {
    char cmd[4600], out[8192];
    snprintf(cmd, sizeof cmd,
             "printf 'Hello\\n\\nWeather?\\n/exit\\nnot read\\n' | %s chat --model %s --max-tokens 5 --seed 2 2>&1",
             test_k3c_bin(), dir);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[n] = 0;
    int st = p ? pclose(p) : -1;
    int turns = 0;
    for (const char *q = out; (q = strstr(q, "[stopped after ")); q++) turns++;
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "k3c chat exit: %s", out);
    CHECK(turns <= 2 && !strstr(out, "k3c chat:"), "two turns at most, no errors: %s", out);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const char *tmp = test_tmpdir("serve");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", tmp);
    if (serve_model_dir(dir) != 0) return test_summary();
    serve_proc sv = serve_start(dir, ARGS);
    const int port = sv.port;
    if (port) {
        double chat0 = metric(port, "k3c_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} ");
        double gen0 = metric(port, "\nk3c_generation_tokens_total ");
        streamed_chat(port);
        whole_answers(port);
        logprobs_answers(port);
        concurrent_streams(port);
        tokenize_round_trip(port);
        bad_requests(port);
        hang_up(port);
        double chat1 = metric(port, "k3c_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} ");
        double gen1 = metric(port, "\nk3c_generation_tokens_total ");
        double e401 = metric(port, "k3c_requests_total{endpoint=\"/v1/chat/completions\",status=\"401\"} ");
        double hist = metric(port, "k3c_request_duration_seconds_count{endpoint=\"/v1/completions\"} ");
        CHECK(chat1 - (chat0 < 0 ? 0 : chat0) == 6 && gen1 > gen0 && e401 == 2 && hist >= 5,
              "metrics moved: chat %g→%g, tokens %g→%g, 401s %g, completions timed %g", chat0, chat1, gen0, gen1, e401,
              hist);
    }
    serve_stop(&sv);
    chat_cli(dir);
    vision_model(tmp);
    generate_stop(dir);
    device_cuda_refused(dir);
    return test_summary();
}
