/* test_serve_choices.c — `n` choices of one request over HTTP (docs/SERVING.md §3): chat and text completions with n
 * 2 and 3, whole and streamed. Choice i is the answer the request gives alone with the seed plus i (same text, same
 * token count), the prompt is counted once and the completion tokens of every choice are summed; streamed chunks
 * carry their choice's index, each choice finishes once, one usage chunk and one [DONE] close the stream; the choices
 * of a request prefill its prompt once (the engine forks the others from it). On the tiny random-weight model of
 * test_serve. */
#include "serve_fixture.h"

#define KEY "Bearer sk-test"
#define MAX_N 4

static int64_t iget(const k3c_json *o, const char *key) {
    const k3c_json *v = k3c_json_get(o, key);
    return v && v->type == K3C_JSON_NUMBER && v->is_integer ? v->integer : -1;
}

/* One answer, as the test compares them: each choice's text and finish reason by index, and the usage. */
typedef struct {
    int n, bad; /* choices; malformed ones (index out of order, missing fields) */
    char text[MAX_N][2048];
    char finish[MAX_N][32];
    int finishes[MAX_N]; /* streamed: finish reasons seen per index */
    int64_t prompt, completion, total;
    int chunks, usage_chunks, done, ids; /* streamed: data events, usage chunks, [DONE]s, distinct ids (1) */
} answer;

static void add_text(answer *a, int i, const char *t) {
    if (t) snprintf(a->text[i] + strlen(a->text[i]), sizeof a->text[i] - strlen(a->text[i]), "%s", t);
}

static void usage_of(answer *a, const k3c_json *u) {
    a->prompt = iget(u, "prompt_tokens"), a->completion = iget(u, "completion_tokens");
    a->total = iget(u, "total_tokens");
}

static void whole(const char *body, size_t n, int chat, answer *a) {
    memset(a, 0, sizeof *a);
    k3c_json *j = http_json(body, n);
    const k3c_json *ch = k3c_json_get(j, "choices");
    a->bad = !ch || ch->type != K3C_JSON_ARRAY || ch->n > MAX_N;
    for (size_t i = 0; !a->bad && i < ch->n; i++) {
        const k3c_json *c = &ch->items[i];
        const char *t = chat ? json_str(k3c_json_get(c, "message"), "content") : json_str(c, "text");
        a->bad += iget(c, "index") != (int64_t)i || !t || !json_str(c, "finish_reason");
        add_text(a, (int)i, t);
        snprintf(a->finish[i], sizeof a->finish[i], "%s", json_str(c, "finish_reason") ? json_str(c, "finish_reason") : "");
        a->n++;
    }
    usage_of(a, k3c_json_get(j, "usage"));
    k3c_json_free(j);
}

static void streamed(char *body, int chat, answer *a) {
    memset(a, 0, sizeof *a);
    char first_id[64] = "", *save = NULL;
    for (char *line = body ? strtok_r(body, "\n", &save) : NULL; line; line = strtok_r(NULL, "\n", &save)) {
        if (!strcmp(line, "data: [DONE]")) {
            a->done++;
            continue;
        }
        k3c_json *j = strncmp(line, "data: ", 6) ? NULL : http_json(line + 6, strlen(line + 6));
        const k3c_json *ch = k3c_json_get(j, "choices"), *u = k3c_json_get(j, "usage");
        const char *id = json_str(j, "id");
        a->bad += !j || !ch || !id || a->done;
        if (id && !first_id[0]) snprintf(first_id, sizeof first_id, "%s", id), a->ids = 1;
        a->ids += id && strcmp(id, first_id);
        if (u && u->type == K3C_JSON_OBJECT) a->usage_chunks++, usage_of(a, u);
        for (size_t k = 0; ch && k < ch->n; k++) {
            const k3c_json *c = &ch->items[k];
            const int64_t i = iget(c, "index");
            if (i < 0 || i >= MAX_N) {
                a->bad++;
                continue;
            }
            if (i >= a->n) a->n = (int)i + 1;
            add_text(a, (int)i, chat ? json_str(k3c_json_get(c, "delta"), "content") : json_str(c, "text"));
            const char *f = json_str(c, "finish_reason");
            if (f) snprintf(a->finish[i], sizeof a->finish[i], "%s", f), a->finishes[i]++;
        }
        a->chunks++;
        k3c_json_free(j);
    }
}

static void post(int port, const char *url, const char *body, int stream, int chat, answer *a) {
    http_resp r;
    int rc = http_do(port, "POST", url, KEY, body, &r);
    CHECK(rc == 0 && r.status == 200, "%s %s: %d %s", url, body, r.status, r.body ? r.body : "");
    if (stream)
        streamed(r.body, chat, a);
    else
        whole(r.body, r.body_len, chat, a);
    http_resp_free(&r);
}

/* body with "n": n and "seed": seed put in before its closing brace. */
static void with(char *out, size_t cap, const char *body, int n, int seed, int stream) {
    snprintf(out, cap, "%.*s,\"n\":%d,\"seed\":%d%s}", (int)strlen(body) - 1, body, n, seed,
             stream ? ",\"stream\":true,\"stream_options\":{\"include_usage\":true}" : "");
}

/* n choices of body against n requests alone with seed, seed+1, ...: the same texts and finishes, the prompt once,
 * the completion tokens summed; streamed, the same again in index-tagged chunks. */
static void choices(int port, const char *url, const char *body, int n, int chat) {
    char b[2048];
    answer alone[MAX_N], all, st;
    int64_t sum = 0;
    for (int i = 0; i < n; i++) {
        with(b, sizeof b, body, 1, 11 + i, 0);
        post(port, url, b, 0, chat, &alone[i]);
        sum += alone[i].completion;
    }
    with(b, sizeof b, body, n, 11, 0);
    post(port, url, b, 0, chat, &all);
    int same = 0, differ = 0;
    for (int i = 0; i < n && i < all.n; i++) {
        same += !strcmp(all.text[i], alone[i].text[0]) && !strcmp(all.finish[i], alone[i].finish[0]);
        differ += i > 0 && strcmp(all.text[i], all.text[0]);
    }
    CHECK(all.n == n && all.bad == 0 && same == n, "%s n %d: %d choices (%d bad), %d as alone with seed + index", url,
          n, all.n, all.bad, same);
    CHECK(differ >= 1, "%s n %d: the choices sampled their own texts ('%s' / '%s')", url, n, all.text[0], all.text[1]);
    CHECK(all.prompt == alone[0].prompt && all.completion == sum && all.total == all.prompt + sum,
          "%s n %d: usage prompt %lld (alone %lld) completion %lld (the choices' sum %lld) total %lld", url, n,
          (long long)all.prompt, (long long)alone[0].prompt, (long long)all.completion, (long long)sum,
          (long long)all.total);
    with(b, sizeof b, body, n, 11, 1);
    post(port, url, b, 1, chat, &st);
    int ok = st.n == n && st.bad == 0 && st.done == 1 && st.ids == 1 && st.usage_chunks == 1;
    for (int i = 0; ok && i < n; i++)
        ok = st.finishes[i] == 1 && !strcmp(st.text[i], all.text[i]) && !strcmp(st.finish[i], all.finish[i]);
    CHECK(ok && st.prompt == all.prompt && st.completion == all.completion,
          "%s n %d streamed: %d choices, %d bad, %d [DONE], %d ids, %d usage chunks (completion %lld of %lld), the "
          "whole answer's texts",
          url, n, st.n, st.bad, st.done, st.ids, st.usage_chunks, (long long)st.completion, (long long)all.completion);
}

/* n is checked: 0 and more than the server's bound are refused. */
static void refusals(int port) {
    static const char *const bad[] = {"{\"prompt\":\"Hi\",\"n\":0}", "{\"prompt\":\"Hi\",\"n\":17}",
                                      "{\"prompt\":\"Hi\",\"n\":1.5}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        http_resp r;
        int rc = http_do(port, "POST", "/v1/completions", KEY, bad[i], &r);
        CHECK(rc == 0 && r.status == 400 && r.body && strstr(r.body, "\"param\":\"n\""), "%s: %d %s", bad[i], r.status,
              r.body ? r.body : "");
        http_resp_free(&r);
    }
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const char *tmp = test_tmpdir("serve_choices");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", tmp);
    if (serve_model_dir(dir) != 0) return test_summary();
    static const char *const args[] = {"--slots", "4",      "--api-key", "sk-test", "--max-tokens-cap",
                                       "16",      "--name", "tiny",      NULL};
    serve_proc sv = serve_start(dir, args);
    if (sv.port) {
        const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":12,"
                           "\"thinking\":false,\"temperature\":1.5}";
        choices(sv.port, "/v1/chat/completions", chat, 2, 1);
        choices(sv.port, "/v1/completions",
                "{\"prompt\":\"The weather in Paris\",\"max_tokens\":10,\"temperature\":1.5}", 3, 0);
        CHECK(metric(sv.port, "\nk3c_engine_prefills_shared_total ") == 2 * (2 - 1) + 2 * (3 - 1),
              "each request's choices prefilled its prompt once: %g forked",
              metric(sv.port, "\nk3c_engine_prefills_shared_total "));
        refusals(sv.port);
    }
    serve_stop(&sv);
    return test_summary();
}
