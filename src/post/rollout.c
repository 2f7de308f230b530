/* rollout.c — multi-turn episodes for RL: the prompt rendered through XTML, the policy samples an assistant turn, its
 * tool calls are parsed and answered by the environment, the answers appended as observation tokens (mask 0) with
 * the next generation prompt, until the model answers without a call or a turn / token budget runs out; the sampled
 * ids are kept as sampled (never re-encoded). TRAINING.md §3.3, §5.3. */
#include "post/post.h"

#include "tok/tok.h"

#include <stdlib.h>
#include <string.h>

static int reserve(k3c_episode *ep, int64_t n, k3c_err *err) {
    if (ep->n + n > ep->cap) {
        int64_t cap = (ep->n + n) * 2 + 256;
        int32_t *a = realloc(ep->ids, cap * sizeof *a);
        if (a) ep->ids = a;
        uint8_t *m = a ? realloc(ep->mask, cap) : NULL;
        if (m) ep->mask = m;
        if (!a || !m) return k3c_errf(err, K3C_ENOMEM, "rollout: out of memory");
        ep->cap = cap;
    }
    return K3C_OK;
}

static int append(k3c_episode *ep, const int32_t *ids, int64_t n, uint8_t mask, k3c_err *err) {
    int rc = reserve(ep, n, err);
    if (rc) return rc;
    memcpy(ep->ids + ep->n, ids, n * sizeof *ids);
    memset(ep->mask + ep->n, mask, n);
    ep->n += n;
    return K3C_OK;
}

/* Renders messages (JSON text) with the generation prompt and appends their tokens with mask 0. */
static int append_rendered(k3c_episode *ep, const k3c_tok *tok, const char *messages, const char *tools, int thinking,
                           k3c_err *err) {
    k3c_json *m = NULL, *t = NULL;
    int rc = k3c_json_parse(messages, strlen(messages), "messages", &m, err);
    if (!rc && tools) rc = k3c_json_parse(tools, strlen(tools), "tools", &t, err);
    k3c_json yes = {.type = K3C_JSON_BOOL, .boolean = 1}, th = {.type = K3C_JSON_BOOL, .boolean = thinking};
    k3c_json items[2] = {yes, th};
    char *keys[2] = {"add_generation_prompt", "thinking"};
    k3c_json opts = {.type = K3C_JSON_OBJECT, .n = 2, .items = items, .keys = keys};
    k3c_chat_prompt p = {0};
    if (!rc) rc = k3c_chat_render(m, t, &opts, &p, err);
    k3c_tok_segment *segs = rc ? NULL : calloc(p.nseg ? p.nseg : 1, sizeof *segs);
    if (!rc && !segs) rc = k3c_errf(err, K3C_ENOMEM, "rollout: out of memory");
    for (size_t i = 0; !rc && i < p.nseg; i++)
        segs[i] = (k3c_tok_segment){p.text + p.segs[i].off, p.segs[i].len, p.segs[i].markup};
    k3c_tok_ids ids = {0};
    if (!rc) rc = k3c_tok_encode_segments(tok, segs, p.nseg, &ids, NULL, err);
    if (!rc) rc = append(ep, ids.ids, (int64_t)ids.n, 0, err);
    k3c_tok_ids_free(&ids);
    free(segs);
    k3c_chat_prompt_free(&p);
    k3c_json_free(m);
    k3c_json_free(t);
    return rc;
}

/* The environment's answers to this turn's calls as tool messages (JSON text), in call order. */
static int answer_calls(k3c_env *env, const k3c_chat_result *r, k3c_sbuf *msgs, k3c_err *err) {
    k3c_sbuf_printf(msgs, "%s", "[");
    for (size_t i = 0; i < r->ncalls; i++) {
        char *obs = NULL;
        int rc = k3c_env_step(env, r->calls[i].name, r->calls[i].arguments, &obs, err);
        if (rc) return rc;
        k3c_sbuf_printf(msgs, "%s{\"role\":\"tool\",\"name\":", i ? "," : "");
        k3c_sbuf_json_string(msgs, r->calls[i].name, strlen(r->calls[i].name));
        k3c_sbuf_printf(msgs, "%s", ",\"content\":");
        k3c_sbuf_json_string(msgs, obs, strlen(obs));
        k3c_sbuf_printf(msgs, "%s", "}");
        free(obs);
    }
    k3c_sbuf_printf(msgs, "%s", "]");
    return msgs->ok ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "rollout: out of memory");
}

/* One assistant turn: sample (mask 1), parse, check the format; res receives the parse (the caller frees it).
 * K3C_ENOTFOUND when the token budget is spent. */
static int one_turn(k3c_env *env, const k3c_tok *tok, const k3c_policy *pol, const k3c_rollout_opts *o, k3c_episode *ep,
                    k3c_chat_result *res, k3c_err *err) {
    int64_t room = o->max_tokens - ep->n, max_new = o->max_new_per_turn < room ? o->max_new_per_turn : room;
    int64_t start = ep->n, got = 0;
    if (max_new <= 0) return K3C_ENOTFOUND;
    int rc = reserve(ep, max_new, err);
    if (rc) return rc;
    rc = pol->generate(pol->ctx, ep->ids, start, max_new, ep->eos, &got, err);
    if (rc) return rc;
    memset(ep->mask + start, 1, got);
    ep->n += got;
    char *text = NULL;
    size_t len = 0;
    k3c_chat_parse_opts po = {K3C_CHAT_XTML, o->thinking};
    k3c_err perr = {0};
    ep->turns++;
    /* An id the tokenizer does not know (a model vocabulary padded past the tokenizer's) is malformed output. */
    if (k3c_tok_decode(tok, ep->ids + start, (size_t)got, &text, &len, &perr) ||
        k3c_chat_parse(&po, text, len, res, &perr)) {
        *res = (k3c_chat_result){0};
        snprintf(ep->info, sizeof ep->info, "turn %d: %.200s", ep->turns, perr.msg);
    } else {
        k3c_reward f = {0};
        k3c_json *tools = NULL;
        const char *tj = k3c_env_tools(env);
        if (tj) k3c_json_parse(tj, strlen(tj), "tools", &tools, NULL);
        ep->format_ok_turns += k3c_verify_format_parsed(res, tools, &f);
        if (f.info[0] && !ep->info[0]) snprintf(ep->info, sizeof ep->info, "turn %d: %.200s", ep->turns, f.info);
        k3c_json_free(tools);
    }
    free(text);
    return K3C_OK;
}

int k3c_rollout(k3c_env *env, const k3c_tok *tok, const k3c_policy *pol, const k3c_rollout_opts *o, k3c_episode *ep,
                k3c_err *err) {
    memset(ep, 0, sizeof *ep);
    ep->eos = k3c_tok_special_id(tok, "<|end_of_msg|>");
    if (ep->eos < 0) return k3c_errf(err, K3C_EINVAL, "rollout: the tokenizer has no <|end_of_msg|>");
    char *msgs = k3c_env_messages(env);
    if (!msgs) return k3c_errf(err, K3C_ENOMEM, "rollout: out of memory");
    int rc = append_rendered(ep, tok, msgs, k3c_env_tools(env), o->thinking, err);
    free(msgs);
    ep->n_prompt = ep->n;
    char *final = NULL;
    while (!rc && ep->turns < o->max_turns) {
        k3c_chat_result res = {0};
        rc = one_turn(env, tok, pol, o, ep, &res, err);
        if (rc == K3C_ENOTFOUND) {
            rc = K3C_OK;
            ep->truncated = 1;
            break;
        }
        if (rc) break;
        free(final);
        final = strdup(res.content ? res.content : "");
        int go_on = res.finished && res.ncalls > 0;
        ep->truncated = !res.finished; /* cut by a budget, or the model stopped without closing */
        if (go_on) {
            ep->tool_calls += (int)res.ncalls;
            k3c_sbuf tm;
            k3c_sbuf_init(&tm);
            rc = answer_calls(env, &res, &tm, err);
            if (!rc) rc = append_rendered(ep, tok, tm.buf, NULL, o->thinking, err);
            k3c_sbuf_free(&tm);
        }
        k3c_chat_result_free(&res);
        if (!go_on) break;
        if (ep->n >= o->max_tokens) ep->truncated = 1;
    }
    if (!rc) {
        k3c_env_score(env, final ? final : "", &ep->reward);
        ep->format_valid = ep->turns > 0 && ep->format_ok_turns == ep->turns;
    }
    free(final);
    if (rc) k3c_episode_free(ep);
    return rc;
}

void k3c_episode_free(k3c_episode *ep) {
    if (!ep) return;
    free(ep->ids);
    free(ep->mask);
    ep->ids = NULL;
    ep->mask = NULL;
    ep->n = ep->cap = 0;
}

/* ---------------------------------------------------------------- the model as a policy */

typedef struct {
    k3c_model *m;
    k3c_sampler s;
} model_policy;

static int model_generate(void *ctx, int32_t *seq, int64_t n, int64_t max_new, int32_t stop, int64_t *got,
                          k3c_err *err) {
    model_policy *p = ctx;
    k3c_gen_opts g = {.sampler = p->s, .max_new = max_new, .stop_id = stop};
    int64_t n_seq = n;
    int rc = k3c_generate(p->m, seq, n, &g, &n_seq, err);
    *got = n_seq - n;
    return rc;
}

int k3c_policy_from_model(k3c_model *m, const k3c_sampler *s, k3c_policy *out, k3c_err *err) {
    model_policy *p = malloc(sizeof *p);
    if (!p) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    *p = (model_policy){m, *s};
    *out = (k3c_policy){model_generate, p};
    return K3C_OK;
}

void k3c_policy_free(k3c_policy *p) {
    if (p && p->generate == model_generate) free(p->ctx);
}
