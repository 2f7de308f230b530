/* rollout.c — multi-turn episodes for RL: the prompt rendered through XTML, the policy samples an assistant turn, its
 * tool calls are parsed and answered by the environment, the answers appended as observation tokens (mask 0) with
 * the next generation prompt, until the model answers without a call or a turn / token budget runs out; the sampled
 * ids are kept as sampled (never re-encoded). TRAINING.md §3.3, §5.3. */
#include "post/post.h"

#include "base/check.h"
#include "model/model.h"

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
        float *l = m ? realloc(ep->logp, cap * sizeof *l) : NULL;
        if (l) ep->logp = l;
        if (!a || !m || !l) return k3c_errf(err, K3C_ENOMEM, "rollout: out of memory");
        ep->cap = cap;
    }
    return K3C_OK;
}

static int append(k3c_episode *ep, const int32_t *ids, int64_t n, uint8_t mask, k3c_err *err) {
    int rc = reserve(ep, n, err);
    if (rc) return rc;
    memcpy(ep->ids + ep->n, ids, n * sizeof *ids);
    memset(ep->mask + ep->n, mask, n);
    memset(ep->logp + ep->n, 0, n * sizeof *ep->logp);
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

/* Parses the turn just sampled into ep->ids[start, ep->n) (mask 1) and checks its format; res receives the parse
 * (the caller frees it). */
static void parse_turn(k3c_env *env, const k3c_tok *tok, const k3c_rollout_opts *o, k3c_episode *ep, int64_t start,
                       k3c_chat_result *res) {
    char *text = NULL;
    size_t len = 0;
    k3c_chat_parse_opts po = {K3C_CHAT_XTML, o->thinking, !o->thinking, 1}; /* strict: malformed output scores 0 */
    k3c_err perr = {0};
    ep->turns++;
    /* An id the tokenizer does not know (a model vocabulary padded past the tokenizer's) is malformed output. */
    if (k3c_tok_decode(tok, ep->ids + start, (size_t)(ep->n - start), &text, &len, &perr) ||
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
}

/* Ids the next turn may sample (0: the token budget is spent). */
static int64_t turn_room(const k3c_rollout_opts *o, const k3c_episode *ep) {
    int64_t room = o->max_tokens - ep->n;
    return o->max_new_per_turn < room ? o->max_new_per_turn : room;
}

/* Renders the prompt (+ tools) with the generation prompt: the episode's first tokens. */
static int episode_begin(k3c_env *env, const k3c_tok *tok, const k3c_rollout_opts *o, k3c_episode *ep, k3c_err *err) {
    memset(ep, 0, sizeof *ep);
    ep->eos = k3c_tok_special_id(tok, "<|end_of_msg|>");
    if (ep->eos < 0) return k3c_errf(err, K3C_EINVAL, "rollout: the tokenizer has no <|end_of_msg|>");
    char *msgs = k3c_env_messages(env);
    if (!msgs) return k3c_errf(err, K3C_ENOMEM, "rollout: out of memory");
    int rc = append_rendered(ep, tok, msgs, k3c_env_tools(env), o->thinking, err);
    free(msgs);
    ep->n_prompt = ep->n;
    return rc;
}

/* After a turn sampled into ep->ids[start, ep->n): parse it, keep its content as the final answer so far, and when it
 * closed with calls, append the environment's answers and the next generation prompt. *go_on: another turn follows
 * (turn and token budgets checked; a spent budget marks the episode truncated). */
static int episode_turn_done(k3c_env *env, const k3c_tok *tok, const k3c_rollout_opts *o, k3c_episode *ep,
                             int64_t start, char **final, int *go_on, k3c_err *err) {
    k3c_chat_result res = {0};
    parse_turn(env, tok, o, ep, start, &res);
    free(*final);
    *final = strdup(res.content ? res.content : "");
    int rc = *final ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "rollout: out of memory");
    *go_on = res.finished && res.ncalls > 0;
    ep->truncated = !res.finished; /* cut by a budget, or the model stopped without closing */
    if (!rc && *go_on) {
        ep->tool_calls += (int)res.ncalls;
        k3c_sbuf tm;
        k3c_sbuf_init(&tm);
        rc = answer_calls(env, &res, &tm, err);
        if (!rc) rc = append_rendered(ep, tok, tm.buf, NULL, o->thinking, err);
        k3c_sbuf_free(&tm);
    }
    k3c_chat_result_free(&res);
    if (rc || !*go_on) return rc;
    if (ep->n >= o->max_tokens) ep->truncated = 1;
    if (ep->turns >= o->max_turns)
        *go_on = 0;
    else if (turn_room(o, ep) <= 0)
        *go_on = 0, ep->truncated = 1;
    return K3C_OK;
}

static void episode_end(k3c_env *env, k3c_episode *ep, const char *final) {
    k3c_env_score(env, final ? final : "", &ep->reward);
    ep->format_valid = ep->turns > 0 && ep->format_ok_turns == ep->turns;
}

int k3c_rollout(k3c_env *env, const k3c_tok *tok, const k3c_policy *pol, const k3c_rollout_opts *o, k3c_episode *ep,
                k3c_err *err) {
    int rc = episode_begin(env, tok, o, ep, err);
    char *final = NULL;
    int go_on = o->max_turns > 0;
    if (!rc && go_on && turn_room(o, ep) <= 0) go_on = 0, ep->truncated = 1;
    while (!rc && go_on) {
        int64_t start = ep->n, got = 0, max_new = turn_room(o, ep);
        rc = reserve(ep, max_new, err);
        if (!rc) rc = pol->generate(pol->ctx, ep->ids, start, max_new, ep->eos, &got, err);
        if (rc) break;
        memset(ep->mask + start, 1, got);
        memset(ep->logp + start, 0, got * sizeof *ep->logp);
        ep->n += got;
        rc = episode_turn_done(env, tok, o, ep, start, &final, &go_on, err);
    }
    if (!rc) episode_end(env, ep, final);
    free(final);
    if (rc) k3c_episode_free(ep);
    return rc;
}

void k3c_episode_free(k3c_episode *ep) {
    if (!ep) return;
    free(ep->ids);
    free(ep->mask);
    free(ep->logp);
    ep->ids = NULL;
    ep->mask = NULL;
    ep->logp = NULL;
    ep->n = ep->cap = 0;
}

/* ---------------------------------------------------------------- many episodes on one engine */

typedef struct {
    int64_t seq;   /* the engine's id of the running turn; 0: the episode is over */
    int64_t start; /* where the running turn's ids begin */
    char *final;
} live;

/* Submits the episode so far (prompt, turns, observations) for its next turn; the engine resumes from the longest
 * prefix snapshot of it, so a turn costs its new observation tokens, not the whole episode again. */
static int submit_turn(k3c_engine *eng, const k3c_sampler *sm, const k3c_rollout_opts *o, k3c_episode *ep, live *l,
                       k3c_err *err) {
    k3c_request r = {.sampler = *sm, .max_new = turn_room(o, ep), .n_stop = 1, .stop_ids = {ep->eos}};
    l->start = ep->n;
    int rc = reserve(ep, r.max_new, err);
    return rc ? rc : k3c_engine_submit(eng, ep->ids, ep->n, &r, &l->seq, err);
}

/* An event of episode i: the id is appended (mask 1, its logprob kept); a finished turn is parsed and answered. */
static int on_event(k3c_engine *eng, k3c_env *env, const k3c_sampler *sm, const k3c_tok *tok, const k3c_rollout_opts *o,
                    k3c_episode *ep, live *l, const k3c_engine_event *ev, k3c_err *err) {
    ep->ids[ep->n] = ev->token.id;
    ep->mask[ep->n] = 1;
    ep->logp[ep->n] = ev->token.logprob;
    ep->n++;
    if (ev->finish == K3C_FINISH_NONE) return K3C_OK;
    l->seq = 0;
    int go_on;
    CHECK_RC(episode_turn_done(env, tok, o, ep, l->start, &l->final, &go_on, err));
    if (go_on) return submit_turn(eng, sm, o, ep, l, err);
    episode_end(env, ep, l->final);
    return K3C_OK;
}

static int run_engine(k3c_engine *eng, k3c_env *const *envs, const k3c_sampler *samplers, int n, const k3c_tok *tok,
                      const k3c_rollout_opts *o, k3c_episode *eps, live *ls, k3c_engine_event *ev, int cap,
                      k3c_err *err) {
    int rc = K3C_OK;
    for (int i = 0; !rc && i < n; i++) {
        rc = episode_begin(envs[i], tok, o, &eps[i], err);
        if (rc) break;
        if (o->max_turns > 0 && turn_room(o, &eps[i]) > 0) {
            rc = submit_turn(eng, &samplers[i], o, &eps[i], &ls[i], err);
        } else {
            eps[i].truncated = o->max_turns > 0;
            episode_end(envs[i], &eps[i], NULL);
        }
    }
    while (!rc && k3c_engine_pending(eng) > 0) {
        int n_ev;
        if ((rc = k3c_engine_step(eng, ev, cap, &n_ev, err))) break;
        for (int k = 0; !rc && k < n_ev; k++) {
            int i = 0;
            while (i < n && ls[i].seq != ev[k].seq) i++;
            if (i == n) return k3c_errf(err, K3C_EINVAL, "rollout: an engine event for an unknown sequence");
            rc = on_event(eng, envs[i], &samplers[i], tok, o, &eps[i], &ls[i], &ev[k], err);
        }
    }
    return rc;
}

int k3c_rollout_batch(k3c_model *m, k3c_env *const *envs, const k3c_sampler *samplers, int n, const k3c_tok *tok,
                      const k3c_rollout_opts *o, int threads, k3c_episode *eps, k3c_err *err) {
    memset(eps, 0, sizeof *eps * (size_t)n);
    if (n <= 0) return K3C_OK;
    if (m->precision != K3C_F32)
        return k3c_errf(err, K3C_EUNSUPPORTED, "rollouts: the inference engine reads float32 weights (a float64 model)");
    /* Snapshots every 32 tokens and at prompt ends: a resubmitted episode recomputes at most 31 of its own ids. */
    int slots = n < 64 ? n : 64; /* more wait in the engine's queue */
    k3c_engine_opts eo = {.max_seqs = slots,
                          .max_ctx = o->max_tokens + 1,
                          .snapshot_every = 32,
                          .max_snapshots = 4 * slots + 8,
                          .threads = threads};
    k3c_engine *eng = NULL;
    live *ls = calloc((size_t)n, sizeof *ls);
    k3c_engine_event *ev = calloc((size_t)slots, sizeof *ev);
    int rc = ls && ev ? k3c_engine_open(m, &eo, &eng, err) : k3c_errf(err, K3C_ENOMEM, "rollout: out of memory");
    if (!rc) rc = run_engine(eng, envs, samplers, n, tok, o, eps, ls, ev, slots, err);
    for (int i = 0; ls && i < n; i++) free(ls[i].final);
    for (int i = 0; rc && i < n; i++) k3c_episode_free(&eps[i]);
    k3c_engine_close(eng);
    free(ls);
    free(ev);
    return rc;
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
    int rc = k3c_model_generate(p->m, seq, n, &g, &n_seq, err);
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
