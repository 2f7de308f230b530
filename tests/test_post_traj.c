/* test_post_traj.c — SFT trajectories (src/post/traj.c): every token's loss mask on the golden XTML examples against
 * a second, string-based derivation, hand-written masked spans (XTML and K2), JSONL validation and packing. */
#include "test.h"

#include "post/post.h"
#include "tok/tok.h"

static k3c_tok *load_kimi(const char *table) {
    k3c_err err = {0};
    k3c_tok *t = NULL;
    CHECK_OK(k3c_tok_load_kimi(test_shared("golden/kimi_tokenizer/tiktoken.model"),
                               test_shared("golden/kimi_tokenizer/special_tokens.json"), table, &t, &err),
             &err);
    return t;
}

/* The masked text of a trajectory: decoded ids where mask = 1, and where mask = 0. */
static void split_text(const k3c_tok *t, const int32_t *ids, const uint8_t *mask, int64_t n, k3c_sbuf *on,
                       k3c_sbuf *off) {
    for (int64_t i = 0; i < n; i++) {
        const unsigned char *b;
        size_t len;
        k3c_err err = {0};
        if (k3c_tok_token_bytes(t, ids[i], &b, &len, &err)) continue;
        k3c_sbuf_append(mask[i] ? on : off, (const char *)b, len);
    }
    k3c_sbuf_append(on, "", 0);
    k3c_sbuf_append(off, "", 0);
}

/* Second derivation, on the rendered string: an assistant message trains from after
 * `<|open|>message role="assistant"...<|sep|><|open|>CHANNEL<|sep|>` through its `<|end_of_msg|>`. */
static void char_mask(const char *s, size_t n, uint8_t *m) {
    memset(m, 0, n);
    const char *hdr = "<|open|>message role=\"assistant\"", *sep = "<|sep|>", *eom = "<|end_of_msg|>";
    for (const char *p = strstr(s, hdr); p; p = strstr(p + 1, hdr)) {
        const char *a = strstr(p, sep);
        a = a ? strstr(a + strlen(sep), sep) : NULL;
        if (!a) break;
        a += strlen(sep);
        const char *e = strstr(a, eom);
        e = e ? e + strlen(eom) : s + n;
        memset(m + (a - s), 1, e - a);
    }
}

static void test_golden_masks(const k3c_tok *tok) {
    char *data = NULL;
    size_t n = 0;
    k3c_err err = {0};
    CHECK_OK(k3c_read_file(test_shared("golden/xtml/examples.jsonl"), &data, &n, &err), &err);
    int cases = 0, trained = 0;
    for (size_t at = 0; data && at < n;) {
        const char *line = data + at, *nl = memchr(line, '\n', n - at);
        size_t len = nl ? (size_t)(nl - line) : n - at;
        at += len + 1;
        if (!len) continue;
        k3c_json *g = NULL;
        CHECK_OK(k3c_json_parse(line, len, "examples.jsonl", &g, &err), &err);
        if (!g) continue;
        const char *id = k3c_json_get(g, "id")->string;
        k3c_chat_prompt p;
        CHECK_OK(k3c_chat_render(k3c_json_get(g, "messages"), k3c_json_get(g, "tools"), k3c_json_get(g, "options"), &p,
                                 &err),
                 &err);
        uint8_t *sm = malloc(p.nseg), *cm = malloc(p.len + 1);
        k3c_traj_segment_mask(&p, K3C_CHAT_XTML, sm);
        char_mask(p.text, p.len, cm);
        /* Encode segment by segment; each token's mask vs the character mask over all its bytes. */
        size_t off = 0, bad = 0, ntok = 0, ones = 0;
        for (size_t i = 0; i < p.nseg; i++) {
            k3c_tok_ids ids = {0};
            CHECK_OK(k3c_tok_encode(tok, p.text + p.segs[i].off, p.segs[i].len,
                                    p.segs[i].markup ? K3C_TOK_ALLOW_SPECIAL : 0, &ids, &err),
                     &err);
            for (size_t k = 0; k < ids.n; k++) {
                const unsigned char *b;
                size_t bl;
                k3c_tok_token_bytes(tok, ids.ids[k], &b, &bl, &err);
                for (size_t c = 0; c < bl; c++) bad += cm[off + c] != sm[i];
                off += bl;
                ntok++;
                ones += sm[i];
            }
            k3c_tok_ids_free(&ids);
        }
        CHECK(off == p.len && bad == 0, "%s: %zu of %zu bytes masked differently (%zu tokens)", id, bad, p.len, ntok);
        cases++;
        trained += ones > 0;
        free(sm);
        free(cm);
        k3c_chat_prompt_free(&p);
        k3c_json_free(g);
    }
    free(data);
    CHECK(cases == 8 && trained == 4, "%d golden cases, %d with trained tokens (want 8, 4)", cases, trained);
}

static k3c_traj traj_of(const k3c_tok *tok, const char *json, int format, int thinking, k3c_err *err, int *rc) {
    k3c_json *j = NULL;
    k3c_traj t = {0};
    *rc = k3c_json_parse(json, strlen(json), "case", &j, err);
    k3c_traj_opts o = {.format = format, .thinking = thinking};
    if (!*rc) *rc = k3c_traj_from_json(j, tok, &o, &t, err);
    k3c_json_free(j);
    return t;
}

static const char *CONV =
    "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Weather in "
    "Paris?\"},{\"role\":\"assistant\",\"reasoning_content\":\"Use the tool.\",\"content\":\"\",\"tool_calls\":[{"
    "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
    "{\"role\":\"tool\",\"content\":\"18C\"},{\"role\":\"state\",\"content\":\"day 2\"},{\"role\":\"assistant\","
    "\"content\":\"18C.\"}]}";

static void test_hand_spans(const k3c_tok *tok, const k3c_tok *tok2) {
    k3c_err err = {0};
    int rc;
    k3c_traj t = traj_of(tok, CONV, K3C_CHAT_XTML, 1, &err, &rc);
    CHECK_OK(rc, &err);
    k3c_sbuf on, off;
    k3c_sbuf_init(&on);
    k3c_sbuf_init(&off);
    split_text(tok, t.ids, t.mask, t.n, &on, &off);
    const char *want_on =
        "Use the tool.<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
        "<|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument key=\"city\" type=\"string\"<|sep|>Paris"
        "<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
        "<|close|>think<|sep|><|open|>response<|sep|>18C.<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>";
    CHECK(!strcmp(on.buf, want_on), "XTML trained text\n got: %s\nwant: %s", on.buf, want_on);
    CHECK(strstr(off.buf, "<|open|>message role=\"system\" name=\"state\"<|sep|>day 2") != NULL,
          "state snapshot rendered as a masked system message: %s", off.buf);
    CHECK(strstr(off.buf, "18C<|close|>") && strstr(off.buf, "Weather in Paris?") && strstr(off.buf, "Be brief."),
          "tool result, user and system text masked");
    k3c_traj_free(&t);
    on.len = off.len = 0;

    t = traj_of(tok2, CONV, K3C_CHAT_K2, 0, &err, &rc);
    CHECK_OK(rc, &err);
    split_text(tok2, t.ids, t.mask, t.n, &on, &off);
    const char *want_k2 = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                          "<|tool_call_argument_begin|>{\"city\":\"Paris\"}<|tool_call_end|><|tool_calls_section_end|>"
                          "<|im_end|>18C.<|im_end|>";
    CHECK(!strcmp(on.buf, want_k2), "K2 trained text\n got: %s\nwant: %s", on.buf, want_k2);
    k3c_traj_free(&t);
    k3c_sbuf_free(&on);
    k3c_sbuf_free(&off);
}

static void test_jsonl(const k3c_tok *tok) {
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "build/tmp/test_post_traj.%d", (int)getpid());
    char cmd[400];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    CHECK(system(cmd) == 0, "mkdir");
    snprintf(path, sizeof path, "%s/t.jsonl", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "%s\n", CONV);                                                /* 1 ok */
    fprintf(f, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}\n");   /* 2 JSON */
    fprintf(f, "\n");                                                        /* 3 blank */
    fprintf(f, "{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}\n"); /* 4 role */
    fprintf(f, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}\n");  /* 5 none */
    fprintf(f,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"tool\",\"content\":\"r\"}]}\n"); /* 6 */
    fprintf(f, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":"
               "\"{oops\"}}]}]}\n");                                                          /* 7 bad arguments */
    fprintf(f, "{\"messages\":[{\"role\":\"assistant\",\"content\":\"ok\"}],\"extra\":1}\n"); /* 8 unknown field */
    fprintf(f,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"2+2?\"},{\"role\":\"assistant\",\"content\":\"4\"}]}\n");
    fclose(f);
    k3c_traj_set s;
    k3c_err err = {0};
    k3c_traj_opts o = {.format = K3C_CHAT_XTML, .thinking = 1};
    CHECK_OK(k3c_traj_load_jsonl(path, tok, &o, &s, &err), &err);
    CHECK(s.n == 2 && s.lines == 8 && s.bad == 6, "kept %zu of %lld lines, %lld refused", s.n, (long long)s.lines,
          (long long)s.bad);
    CHECK(s.n == 2 && s.items[0].line == 1 && s.items[1].line == 9, "line numbers of kept trajectories");
    const char *want[] = {":2: invalid JSON at column",
                          ":4: messages[0].role: unknown role \"robot\"",
                          ":5: messages: no assistant message",
                          ":6: messages[1]: a tool result before any assistant tool call",
                          ":7: messages[0].tool_calls[0].function.arguments: not a JSON object",
                          ":8: extra: unknown field"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        CHECK(s.report && strstr(s.report, want[i]), "report lacks \"%s\":\n%s", want[i], s.report ? s.report : "");

    /* Packing: documents end to end, targets only where the next token is trained, nothing across documents. */
    k3c_packed pk = {0};
    size_t next = 0;
    int64_t L = s.items[0].n + s.items[1].n;
    CHECK_OK(k3c_traj_pack(s.items, s.n, &next, L + 5, &pk, &err), &err);
    CHECK(pk.n_docs == 2 && pk.T == L && pk.cu_seqlens[1] == s.items[0].n && next == 0, "packed 2 docs, T %lld",
          (long long)pk.T);
    int64_t bad = 0, counted = 0;
    for (int d = 0; d < pk.n_docs; d++) {
        const k3c_traj *x = &s.items[d];
        for (int64_t k = 0; k < x->n; k++) {
            int32_t want_t = k + 1 < x->n && x->mask[k + 1] ? x->ids[k + 1] : -1;
            bad += pk.targets[pk.cu_seqlens[d] + k] != want_t || pk.ids[pk.cu_seqlens[d] + k] != x->ids[k];
            counted += want_t >= 0;
        }
    }
    CHECK(bad == 0 && counted == pk.n_counted && counted > 0, "targets: %lld wrong, %lld counted", (long long)bad,
          (long long)counted);
    next = 0;
    CHECK_OK(k3c_traj_pack(s.items, s.n, &next, s.items[0].n, &pk, &err), &err);
    CHECK(pk.n_docs == 1 && next == 1, "a full sequence holds one trajectory");
    CHECK(k3c_traj_pack(s.items, s.n, &next, 3, &pk, &err) == K3C_EINVAL && strstr(err.msg, "line 9"), "too long: %s",
          err.msg);
    k3c_packed_free(&pk);
    k3c_traj_set_free(&s);

    f = fopen(path, "w");
    fprintf(f, "[]\n");
    fclose(f);
    CHECK(k3c_traj_load_jsonl(path, tok, &o, &s, &err) == K3C_EINVAL && strstr(err.msg, "no usable trajectory") &&
              strstr(err.msg, ":1: expected a JSON object"),
          "all lines bad: %s", err.msg);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

int main(void) {
    k3c_tok *tok = load_kimi("kimi_k3"), *tok2 = load_kimi("kimi_k2");
    if (tok && tok2) {
        test_golden_masks(tok);
        test_hand_spans(tok, tok2);
        test_jsonl(tok);
        /* A tokenizer without the chat specials would spell the markup out as text: refused. */
        k3c_err err = {0};
        int rc;
        traj_of(tok2, CONV, K3C_CHAT_XTML, 1, &err, &rc);
        CHECK(rc == K3C_EINVAL && strstr(err.msg, "no special token for the markup \"<|open|>\""), "%s", err.msg);
    }
    k3c_tok_free(tok);
    k3c_tok_free(tok2);
    return test_summary();
}
