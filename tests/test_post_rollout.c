/* test_post_rollout.c — multi-turn rollouts (src/post/rollout.c) with a scripted policy: the token stream decodes to
 * exactly the renderer's conversation, sampled tokens are masked 1 and observations 0 (the same trained text as the
 * SFT mask of that conversation), tool calls reach the environment, and budgets, malformed output and unknown tools
 * end or mark the episode as they should. */
#include "test.h"

#include "post/post.h"
#include "tok/tok.h"

typedef struct {
    const k3c_tok *tok;
    const char *turn[8];
    int n, at;
} script;

static int scripted(void *ctx, int32_t *seq, int64_t n, int64_t max_new, int32_t stop, int64_t *got, k3c_err *err) {
    script *s = ctx;
    const char *t = s->turn[s->at < s->n ? s->at : s->n - 1];
    s->at++;
    k3c_tok_ids ids = {0};
    int rc = k3c_tok_encode(s->tok, t, strlen(t), K3C_TOK_ALLOW_SPECIAL, &ids, err);
    int64_t k = 0;
    while (!rc && k < (int64_t)ids.n && k < max_new) {
        seq[n + k] = ids.ids[k];
        if (ids.ids[k++] == stop) break;
    }
    *got = k;
    k3c_tok_ids_free(&ids);
    return rc;
}

static char *text_of(const k3c_tok *t, const int32_t *ids, const uint8_t *mask, int64_t n, int want) {
    k3c_sbuf b;
    k3c_sbuf_init(&b);
    for (int64_t i = 0; i < n; i++) {
        const unsigned char *p;
        size_t len;
        if ((want < 0 || mask[i] == want) && !k3c_tok_token_bytes(t, ids[i], &p, &len, NULL))
            k3c_sbuf_append(&b, (const char *)p, len);
    }
    k3c_sbuf_append(&b, "", 0);
    return b.buf;
}

#define CALL(expr)                                                                                                     \
    "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"calculator\" index=\"1\"<|sep|><|open|>argument " \
    "key=\"expression\" type=\"string\"<|sep|>" expr                                                                   \
    "<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"                                                \
    "<|close|>message<|sep|><|end_of_msg|>"

static void test_round_trip(const k3c_tok *tok) {
    k3c_env *e;
    k3c_err err = {0};
    CHECK_OK(k3c_env_new("arith_tool", 9, 0, 0, &e, &err), &err);
    char *conv = NULL;
    CHECK_OK(k3c_env_reference(e, &conv, &err), &err);
    k3c_json *j = NULL;
    CHECK_OK(k3c_json_parse(conv, strlen(conv), "ref", &j, &err), &err);
    const k3c_json *msgs = k3c_json_get(j, "messages");
    const char *args =
        k3c_json_get(k3c_json_get(&k3c_json_get(&msgs->items[2], "tool_calls")->items[0], "function"), "arguments")
            ->string;
    const char *answer = k3c_json_get(&msgs->items[4], "content")->string;
    char expr[64] = "", t1[1024], t2[256];
    sscanf(args, "{\"expression\":\"%63[^\"]\"}", expr);
    snprintf(t1, sizeof t1, CALL("%s"), expr);
    snprintf(t2, sizeof t2, "%s<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>", answer);
    script s = {tok, {t1, t2}, 2, 0};
    k3c_policy pol = {scripted, &s};
    k3c_rollout_opts o = {.max_turns = 4, .max_tokens = 4096, .max_new_per_turn = 256, .thinking = 0};
    k3c_episode ep;
    CHECK_OK(k3c_rollout(e, tok, &pol, &o, &ep, &err), &err);
    CHECK(ep.reward.reward == 1 && ep.turns == 2 && ep.tool_calls == 1 && ep.format_valid && !ep.truncated,
          "reward %g turns %d calls %d format %d truncated %d (%s %s)", ep.reward.reward, ep.turns, ep.tool_calls,
          ep.format_valid, ep.truncated, ep.reward.info, ep.info);
    /* The stream is the conversation as the renderer writes it, and trains on the same text as its SFT mask. */
    k3c_traj t;
    k3c_traj_opts to = {.format = 0, .thinking = 0};
    CHECK_OK(k3c_traj_from_json(j, tok, &to, &t, &err), &err);
    char *all = text_of(tok, ep.ids, ep.mask, ep.n, -1), *want = text_of(tok, t.ids, t.mask, t.n, -1);
    CHECK(!strcmp(all, want), "episode text\n got: %s\nwant: %s", all, want);
    char *on = text_of(tok, ep.ids, ep.mask, ep.n, 1), *won = text_of(tok, t.ids, t.mask, t.n, 1);
    CHECK(!strcmp(on, won), "trained text\n got: %s\nwant: %s", on, won);
    CHECK(ep.n_prompt > 0 && ep.mask[ep.n_prompt - 1] == 0 && ep.mask[ep.n_prompt] == 1, "prompt masked");
    free(all), free(want), free(on), free(won);
    k3c_traj_free(&t);
    k3c_episode_free(&ep);
    k3c_json_free(j);
    free(conv);
    k3c_env_free(e);
}

static k3c_episode run(const k3c_tok *tok, const char *kind, script *s, const k3c_rollout_opts *o) {
    k3c_env *e = NULL;
    k3c_err err = {0};
    k3c_episode ep = {0};
    CHECK_OK(k3c_env_new(kind, 4, 0, 1, &e, &err), &err);
    k3c_policy pol = {scripted, s};
    if (e) CHECK_OK(k3c_rollout(e, tok, &pol, o, &ep, &err), &err);
    k3c_env_free(e);
    return ep;
}

static void test_endings(const k3c_tok *tok) {
    k3c_rollout_opts o = {.max_turns = 3, .max_tokens = 4096, .max_new_per_turn = 24, .thinking = 1};
    script s = {tok,
                {"I keep thinking, and thinking, and thinking, and thinking, and thinking, and thinking, and thinking, "
                 "and thinking, and thinking, and never stop thinking at all."},
                1,
                0};
    k3c_episode ep = run(tok, "arith", &s, &o);
    CHECK(ep.truncated && ep.turns == 1 && ep.reward.reward == 0 && !ep.format_valid && ep.n - ep.n_prompt == 24,
          "cut at the turn budget: truncated %d, %lld sampled", ep.truncated, (long long)(ep.n - ep.n_prompt));
    k3c_episode_free(&ep);
    o.max_new_per_turn = 256;

    s = (script){tok, {"<|open|>banana<|sep|>x<|close|>banana<|sep|><|end_of_msg|>"}, 1, 0};
    ep = run(tok, "arith", &s, &o);
    CHECK(!ep.format_valid && ep.turns == 1 && strstr(ep.info, "unknown XTML element"), "malformed: %s", ep.info);
    k3c_episode_free(&ep);

    /* A call to an undeclared tool: the environment answers with an error, the episode goes on. */
    s = (script){
        tok,
        {"x<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|><|open|>call "
         "tool=\"search\" index=\"1\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>"
         "<|end_of_msg|>",
         "y<|close|>think<|sep|><|open|>response<|sep|>#### 1<|close|>response<|sep|><|close|>message<|sep|>"
         "<|end_of_msg|>"},
        2,
        0};
    ep = run(tok, "arith_tool", &s, &o);
    char *obs = text_of(tok, ep.ids, ep.mask, ep.n, 0);
    CHECK(ep.turns == 2 && ep.format_ok_turns == 1 && !ep.format_valid &&
              strstr(obs, "error: unknown tool \"search\"") && strstr(ep.info, "unknown tool"),
          "unknown tool: turns %d, ok %d, %s", ep.turns, ep.format_ok_turns, ep.info);
    free(obs);
    k3c_episode_free(&ep);

    /* A policy that always calls: stopped by max_turns. */
    s = (script){tok, {"a<|close|>think<|sep|><|open|>response<|sep|>" CALL("1+1")}, 1, 0};
    ep = run(tok, "arith_tool", &s, &o);
    CHECK(ep.turns == 3 && ep.tool_calls == 3 && ep.format_valid, "max_turns: %d turns", ep.turns);
    k3c_episode_free(&ep);
    o.max_tokens = ep.n_prompt + 10;
    ep = run(tok, "arith_tool", &s, &o);
    CHECK(ep.truncated && ep.n <= o.max_tokens + 0 && ep.turns == 1, "episode token budget: n %lld", (long long)ep.n);
    k3c_episode_free(&ep);
}

int main(void) {
    k3c_err err = {0};
    k3c_tok *tok = NULL;
    CHECK_OK(k3c_tok_load_kimi(test_shared("golden/kimi_tokenizer/tiktoken.model"),
                               test_shared("golden/kimi_tokenizer/special_tokens.json"), "kimi_k3", &tok, &err),
             &err);
    if (tok) {
        test_round_trip(tok);
        test_endings(tok);
    }
    k3c_tok_free(tok);
    return test_summary();
}
