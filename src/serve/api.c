/* api.c — the endpoints of `k3c serve` (server.h): routing, the API key, /v1/models, /health, /metrics, /tokenize,
 * /detokenize, and chat / text completions run on the scheduler, answered whole or streamed as server-sent events. */
#include "serve/server.h"

#include "serve/anthropic.h"

#include "model/model.h"
#include "tok/tok.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- replies */

static int reply_error(api_reply *r, const k3c_api_error *e) {
    r->status = e->status;
    r->content_type = "application/json";
    if (r->anthropic)
        k3c_anth_error_json(&r->body, e);
    else
        k3c_api_error_json(&r->body, e);
    return 0;
}

static int fail(api_reply *r, int status, const char *type, const char *code, const char *fmt, const char *arg) {
    k3c_api_error e;
    k3c_api_fail(&e, status, type, code, NULL, fmt, arg);
    return reply_error(r, &e);
}

static void reply_json(api_reply *r, int status) {
    r->status = status;
    r->content_type = "application/json";
}

/* ---------------------------------------------------------------- a generation call */

enum { ROUTE_MESSAGES = 100 }; /* beside the k3c_api_kind values */

/* One choice of a generation: its sequence in the engine (job), its parser and what it said. The n choices of a call
 * share its id, its prompt and its stream; each has its own sampling seed. */
typedef struct {
    api_stream *c;
    k3c_sched_job *job;
    k3c_turn turn;
    k3c_api_meta meta;   /* its index, and a stream's state of this choice */
    k3c_sbuf text;       /* a completion answered whole */
    k3c_api_logprobs lp; /* when asked for: meta.lp points here */
    k3c_finish why;
    int done, call_done, stop_string; /* ended; its one call allowed came; a stop string ended it */
} api_choice;

/* One generation. The engine thread only posts its events to the jobs; the HTTP thread that reads the call takes them
 * (under mu) and turns them into text, chat deltas and server-sent events. When there is nothing to take it arms the
 * jobs' one-shot wakes and parks the connection until the engine has more. */
struct api_stream {
    k3c_server *s;
    pthread_mutex_t mu;
    atomic_int refs; /* atomic, not under mu: the HTTP layer takes one while holding its own lock (lock order) */
    int done, streaming, include_usage, chat, failed, gone;
    int one_call;  /* parallel_tool_calls false: a choice ends with its first call */
    int anthropic; /* /v1/messages (one choice) */
    k3c_anth_meta am;
    char stop_seq[256]; /* the request's only stop string (Anthropic's stop_sequence), else "" */
    k3c_sbuf out;       /* SSE bytes not yet read by the HTTP layer */
    size_t out_off;
    api_choice *ch;
    int n_ch, n_done;
    k3c_finish why;          /* a failed call: the finish of the choice that failed it */
    int64_t n_prompt, n_gen; /* the prompt once, the tokens of every choice */
    k3c_err err;
};

static void call_unref(api_stream *c) {
    if (atomic_fetch_sub(&c->refs, 1) != 1) return;
    k3c_metrics_tokens(c->s->metrics, c->n_prompt, c->n_gen);
    for (int i = 0; c->ch && i < c->n_ch; i++) {
        k3c_sched_release(c->ch[i].job);
        k3c_turn_free(&c->ch[i].turn);
        k3c_sbuf_free(&c->ch[i].text);
        k3c_api_logprobs_free(&c->ch[i].lp);
    }
    free(c->ch);
    k3c_sbuf_free(&c->out);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static void on_delta(void *ctx, const k3c_chat_delta *d) {
    api_choice *ch = ctx;
    api_stream *c = ch->c;
    ch->call_done |= c->one_call && d->kind == K3C_CHAT_DELTA_CALL;
    if (c->streaming && c->anthropic)
        k3c_anth_sse_delta(&c->out, &c->am, d);
    else if (c->streaming)
        k3c_sse_chat_delta(&c->out, &ch->meta, d);
}

static void on_text(void *ctx, const char *s, size_t n) {
    api_choice *ch = ctx;
    if (ch->c->streaming)
        k3c_sse_text(&ch->c->out, &ch->meta, s, n);
    else
        k3c_sbuf_append(&ch->text, s, n);
}

/* The error a failed or timed-out call answers with. */
static void call_error(const api_stream *c, k3c_api_error *e) {
    if (c->why == K3C_FINISH_TIMEOUT)
        k3c_api_fail(e, 504, "server_error", "generation_timeout", NULL,
                     "The generation ran past the server's limit of %g s (%lld tokens generated)", c->s->o.max_gen_s,
                     (long long)c->n_gen);
    else if (c->why == K3C_FINISH_QUEUE_TIMEOUT)
        k3c_api_fail(e, 503, "server_error", "queue_timeout", NULL,
                     "The request waited longer than %g s for a free slot; retry later", c->s->o.max_queue_s);
    else
        k3c_api_fail(e, 500, "server_error", NULL, NULL, "generation failed: %s", c->err.msg);
}

static const char *anth_reason(const api_stream *c) {
    return k3c_anth_stop_reason(c->ch[0].why, c->ch[0].turn.msg.ncalls, c->ch[0].stop_string);
}
static const char *anth_stop_seq(const api_stream *c) {
    return c->ch[0].stop_string && c->stop_seq[0] && !c->ch[0].turn.msg.ncalls ? c->stop_seq : NULL;
}

/* A failed choice fails the call (mu held): the other choices leave the engine, a stream gets its error event. */
static void call_fail(api_stream *c, k3c_finish why) {
    c->failed = 1;
    c->why = why;
    c->done = 1;
    for (int i = 0; i < c->n_ch; i++) {
        c->ch[i].done = 1;
        k3c_sched_cancel(c->ch[i].job);
    }
    if (!c->streaming) return;
    k3c_api_error e;
    call_error(c, &e);
    if (c->anthropic)
        k3c_anth_sse_error(&c->out, &e);
    else
        k3c_sse_error(&c->out, &e);
}

/* Choice ch ends with why (mu held): the turn's held-back text, its finish event when streamed; its generation, if
 * still on (the turn stopped at a stop string), leaves the engine. The last choice to end closes the stream. */
static void choice_end(api_stream *c, api_choice *ch, k3c_finish why) {
    ch->why = why;
    ch->done = 1;
    c->n_done++;
    if (why == K3C_FINISH_ERROR && !c->failed) snprintf(c->err.msg, sizeof c->err.msg, "%s", k3c_sched_error(ch->job));
    if (c->failed || why == K3C_FINISH_ERROR || why == K3C_FINISH_TIMEOUT || why == K3C_FINISH_QUEUE_TIMEOUT ||
        k3c_turn_finish(&ch->turn, &c->err)) {
        call_fail(c, why);
        return;
    }
    k3c_sched_cancel(ch->job); /* a no-op when the engine ended it */
    const int last = c->n_done == c->n_ch;
    c->done = last;
    if (c->streaming && c->anthropic) {
        k3c_anth_sse_finish(&c->out, &c->am, anth_reason(c), anth_stop_seq(c), c->n_gen);
    } else if (c->streaming) {
        k3c_sse_choice_finish(&c->out, &ch->meta,
                              c->chat ? k3c_api_chat_finish(why, ch->turn.msg.ncalls) : k3c_finish_name(why));
        if (last) k3c_sse_end(&c->out, &c->ch[0].meta, c->include_usage, c->n_prompt, c->n_gen);
    }
}

/* One event of a choice's job (mu held): its token through the turn (logprobs first: the chunk its text goes out in
 * carries them; an end-of-turn id has no text), then the end. */
static void call_event(api_stream *c, api_choice *ch, const k3c_engine_event *ev) {
    int stop = 0;
    if (ev->token.id >= 0) {
        const int is_stop = ev->finish == K3C_FINISH_STOP;
        c->n_gen++;
        int rc = ch->meta.lp && !is_stop && k3c_api_logprobs_add(ch->meta.lp, &ev->token, &c->err) ? -1 : 0;
        if (!rc) rc = k3c_turn_token(&ch->turn, ev->token.id, is_stop, &c->err);
        if (rc < 0) {
            call_fail(c, K3C_FINISH_ERROR);
            return;
        }
        ch->stop_string = rc > 0 && !is_stop;
        stop = rc > 0 || ch->call_done; /* an end-of-turn id, a stop string, the one call allowed */
    }
    if (stop || ev->finish != K3C_FINISH_NONE) choice_end(c, ch, stop ? K3C_FINISH_STOP : (k3c_finish)ev->finish);
}

/* Takes every event that has come (mu held); when none is left and the call goes on, arms wake (NULL: none) on every
 * choice still running and returns 0; returns 1 once the call has ended or has bytes to send. */
static int call_pump(api_stream *c, k3c_api_wake wake, void *ctx) {
    k3c_engine_event ev;
    for (;;) {
        for (int i = 0; i < c->n_ch; i++)
            while (!c->ch[i].done && k3c_sched_next(c->ch[i].job, &ev, NULL, NULL)) call_event(c, &c->ch[i], &ev);
        if (c->done || (c->streaming && c->out_off < c->out.len)) return 1;
        int got = 0;
        for (int i = 0; !got && i < c->n_ch; i++)
            if (!c->ch[i].done && k3c_sched_next(c->ch[i].job, &ev, wake, ctx)) {
                call_event(c, &c->ch[i], &ev);
                got = 1;
            }
        if (!got) return 0;
    }
}

long k3c_api_stream_read(api_stream *c, char *buf, size_t max, k3c_api_wake wake, void *ctx) {
    pthread_mutex_lock(&c->mu);
    long got = K3C_API_AGAIN;
    if (c->gone) {
        got = -1;
    } else if ((c->out_off < c->out.len) || call_pump(c, wake, ctx)) {
        size_t n = c->out.len - c->out_off < max ? c->out.len - c->out_off : max;
        memcpy(buf, c->out.buf + c->out_off, n);
        c->out_off += n;
        if (c->out_off == c->out.len) c->out_off = c->out.len = 0;
        got = (long)n; /* 0: the end */
    }
    pthread_mutex_unlock(&c->mu);
    return got;
}

void k3c_api_stream_disarm(api_stream *c) {
    for (int i = 0; i < c->n_ch; i++) k3c_sched_disarm(c->ch[i].job);
}

void k3c_api_stream_hold(api_stream *c) { atomic_fetch_add(&c->refs, 1); }

static void cancel_all(api_stream *c) {
    for (int i = 0; i < c->n_ch; i++) k3c_sched_cancel(c->ch[i].job); /* a no-op once ended */
}

void k3c_api_stream_gone(api_stream *c) {
    pthread_mutex_lock(&c->mu);
    c->gone = 1;
    pthread_mutex_unlock(&c->mu);
    cancel_all(c);
}

void k3c_api_stream_close(api_stream *c) {
    cancel_all(c);
    call_unref(c);
}

/* The call's n choices: ids, parsers, logprobs; 0 or -1 with err set. */
static int choices_init(api_stream *c, const k3c_api_req *q, k3c_err *err) {
    const k3c_server *s = c->s;
    const uint64_t unique = atomic_fetch_add(&c->s->serial, 1) ^ (uint64_t)time(NULL) << 20;
    c->n_ch = q->n > 1 ? q->n : 1;
    if (!(c->ch = calloc((size_t)c->n_ch, sizeof *c->ch))) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    for (int i = 0; i < c->n_ch; i++) {
        api_choice *ch = &c->ch[i];
        ch->c = c;
        k3c_sbuf_init(&ch->text);
        k3c_api_meta_init(&ch->meta, c->chat, s->model_name, unique);
        ch->meta.index = i;
        ch->lp.tok = s->lim.tok;
        if (q->logprobs) ch->meta.lp = &ch->lp;
        int rc = k3c_turn_init(&ch->turn, s->lim.tok, c->chat ? &q->parse : NULL, q->stop, q->nstop, on_delta, on_text,
                               ch, err);
        if (rc) return rc;
    }
    return 0;
}

/* Queues the n sequences together (so they take slots at one step), choice i with the seed plus i and its own
 * automaton over the request's grammar (each holding a reference, dropped with its sequence); all or none. */
static int choices_submit(api_stream *c, k3c_api_req *q, k3c_err *err) {
    const k3c_server *s = c->s;
    k3c_request g[K3C_API_MAX_N];
    const int32_t *prompts[K3C_API_MAX_N];
    int64_t lens[K3C_API_MAX_N];
    k3c_sched_job *jobs[K3C_API_MAX_N];
    for (int i = 0; i < c->n_ch; i++) {
        g[i] = q->gen;
        g[i].sampler.seed = q->gen.sampler.seed + (uint64_t)i;
        g[i].n_stop = s->n_stop_ids;
        memcpy(g[i].stop_ids, s->stop_ids, sizeof g[i].stop_ids);
        g[i].max_queue_s = s->o.max_queue_s, g[i].max_gen_s = s->o.max_gen_s;
        prompts[i] = q->prompt.ids, lens[i] = (int64_t)q->prompt.n;
        g[i].constraint = NULL;
    }
    int rc = K3C_OK;
    for (int i = 1; q->grammar && i < c->n_ch; i++) k3c_cgrammar_ref(q->grammar); /* one reference per sample */
    for (int i = 0; q->grammar && !rc && i < c->n_ch; i++) {
        rc = k3c_constraint_new(q->grammar, 1, &g[i].constraint, err);
        if (rc) /* the references of the samples not yet made */
            for (int j = i + 1; j < c->n_ch; j++) k3c_cgrammar_free(q->grammar);
    }
    q->grammar = NULL; /* the constraints hold it now */
    if (!rc) rc = k3c_sched_submit_all(s->sched, c->n_ch, prompts, lens, g, jobs, err);
    for (int i = 0; !rc && i < c->n_ch; i++) c->ch[i].job = jobs[i];
    if (rc) /* refused: still ours */
        for (int i = 0; i < c->n_ch; i++)
            if (g[i].constraint) g[i].constraint->release(g[i].constraint->ctx);
    return rc;
}

/* Starts a generation for a validated request; returns the call or NULL with the error reply set. */
static api_stream *start_call(k3c_server *s, k3c_api_req *q, api_reply *r) {
    api_stream *c = calloc(1, sizeof *c);
    k3c_err err = {0};
    if (!c) {
        fail(r, 500, "server_error", NULL, "%s", "out of memory");
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    k3c_sbuf_init(&c->out);
    c->s = s;
    c->refs = 1;
    c->chat = q->kind == K3C_API_CHAT;
    c->streaming = q->stream;
    c->include_usage = q->include_usage;
    c->one_call = q->one_call;
    c->n_prompt = (int64_t)q->prompt.n;
    if (choices_init(c, q, &err)) {
        call_unref(c);
        fail(r, 500, "server_error", NULL, "%s", err.msg);
        return NULL;
    }
    int rc = choices_submit(c, q, &err);
    if (rc) {
        call_unref(c);
        if (rc == K3C_ENOMEM) {
            fail(r, 503, "server_error", "server_overloaded", "The server is overloaded (%s); retry later", err.msg);
            r->retry_after = 1;
        } else {
            fail(r, 400, "invalid_request_error", NULL, "%s", err.msg);
        }
        return NULL;
    }
    return c;
}

/* The whole answer of a call that ended well: every choice in index order, the usage of all. */
static void answer_json(api_stream *c, k3c_sbuf *b) {
    if (c->anthropic) {
        k3c_anth_message_json(b, &c->am, &c->ch[0].turn.msg, anth_reason(c), anth_stop_seq(c), c->n_prompt, c->n_gen);
        return;
    }
    k3c_api_choices_begin(b, &c->ch[0].meta);
    for (int i = 0; i < c->n_ch; i++) {
        api_choice *ch = &c->ch[i];
        if (c->chat)
            k3c_api_chat_choice(b, &ch->meta, &ch->turn.msg, k3c_api_chat_finish(ch->why, ch->turn.msg.ncalls), !i);
        else
            k3c_api_completion_choice(b, &ch->meta, ch->text.buf ? ch->text.buf : "", ch->text.len,
                                      k3c_finish_name(ch->why), !i);
    }
    k3c_api_choices_end(b, c->n_prompt, c->n_gen);
}

int k3c_api_result(api_stream *c, api_reply *r, k3c_api_wake wake, void *ctx) {
    pthread_mutex_lock(&c->mu);
    const int done = call_pump(c, wake, ctx), gone = c->gone;
    pthread_mutex_unlock(&c->mu);
    if (!done) return 0;
    k3c_sbuf_init(&r->body);
    r->call = NULL;
    r->retry_after = 0;
    r->anthropic = c->anthropic;
    if (gone) {
        r->status = 0; /* nobody to answer */
    } else if (c->failed) {
        k3c_api_error e;
        call_error(c, &e);
        reply_error(r, &e);
        r->retry_after = c->why == K3C_FINISH_QUEUE_TIMEOUT;
    } else {
        reply_json(r, 200);
        answer_json(c, &r->body);
    }
    return 1;
}

/* /v1/messages: the body read as the chat request it stands for (api_anthropic.c). */
static int parse_messages(k3c_server *s, const char *body, size_t n, k3c_api_req *q, k3c_api_error *e) {
    k3c_json *j = NULL;
    k3c_err err = {0};
    memset(q, 0, sizeof *q);
    if (k3c_json_parse(body, n, "body", &j, &err))
        return k3c_api_fail(e, 400, "invalid_request_error", "invalid_json", "",
                            "We could not parse the JSON body of your request (%s)", err.msg);
    k3c_sbuf chat;
    k3c_sbuf_init(&chat);
    int rc = k3c_anthropic_chat_body(j, &chat, e);
    if (!rc) rc = k3c_api_parse_trie(K3C_API_CHAT, chat.buf, chat.len, &s->lim, s->trie, q, e);
    k3c_sbuf_free(&chat);
    k3c_json_free(j);
    return rc;
}

static void generate(k3c_server *s, int kind, const char *body, size_t n, api_reply *r) {
    k3c_api_req q;
    k3c_api_error e;
    const int anth = kind == ROUTE_MESSAGES;
    if (anth ? parse_messages(s, body, n, &q, &e)
             : k3c_api_parse_trie((k3c_api_kind)kind, body, n, &s->lim, s->trie, &q, &e)) {
        reply_error(r, &e);
        k3c_api_req_free(&q);
        return;
    }
    api_stream *c = start_call(s, &q, r);
    if (c && anth) {
        c->anthropic = 1;
        k3c_anth_meta_init(&c->am, s->model_name, atomic_fetch_add(&s->serial, 1) ^ (uint64_t)time(NULL) << 20);
        if (q.nstop == 1) snprintf(c->stop_seq, sizeof c->stop_seq, "%s", q.stop[0]);
        if (c->streaming) k3c_anth_sse_start(&c->out, &c->am, c->n_prompt);
    }
    k3c_api_req_free(&q);
    if (!c) return;
    r->call = c;
    r->streamed = c->streaming;
    if (c->streaming) {
        r->status = 200;
        r->content_type = "text/event-stream";
    }
}

/* ---------------------------------------------------------------- the other endpoints */

static int tokenize(k3c_server *s, k3c_api_kind kind, const char *body, size_t n, api_reply *r) {
    k3c_api_req q;
    k3c_api_error e;
    if (k3c_api_parse(kind, body, n, &s->lim, &q, &e)) {
        reply_error(r, &e);
    } else if (kind == K3C_API_TOKENIZE) {
        reply_json(r, 200);
        k3c_sbuf_append(&r->body, "{\"tokens\":[", 11);
        for (size_t i = 0; i < q.prompt.n; i++) k3c_sbuf_printf(&r->body, "%s%d", i ? "," : "", q.prompt.ids[i]);
        k3c_sbuf_printf(&r->body, "],\"count\":%zu,\"max_model_len\":%lld}", q.prompt.n, (long long)s->lim.max_context);
    } else {
        reply_json(r, 200);
        k3c_sbuf_append(&r->body, "{\"prompt\":", 10);
        char *fixed = NULL; /* token bytes need not be UTF-8: JSON gets U+FFFD for the bad ones */
        size_t fl = 0;
        if (k3c_utf8_replace(q.text, q.text_len, &fixed, &fl, NULL, NULL) == 0)
            k3c_sbuf_json_string(&r->body, fixed, fl);
        free(fixed);
        k3c_sbuf_append(&r->body, "}", 1);
    }
    k3c_api_req_free(&q);
    return 0;
}

static int models(k3c_server *s, api_reply *r) {
    reply_json(r, 200);
    k3c_sbuf_append(&r->body, "{\"object\":\"list\",\"data\":[{\"id\":", 31);
    k3c_sbuf_json_string(&r->body, s->model_name, strlen(s->model_name));
    k3c_sbuf_printf(&r->body, ",\"object\":\"model\",\"created\":0,\"owned_by\":\"k3c\",\"max_model_len\":%lld}]}",
                    (long long)s->lim.max_context);
    return 0;
}

static int authorized(const k3c_server *s, const char *auth) {
    if (!s->api_key[0]) return 1;
    if (!auth || strncmp(auth, "Bearer ", 7)) return 0;
    /* compare every byte whatever the first difference, so timing says nothing about the key */
    size_t a = strlen(auth + 7), b = strlen(s->api_key);
    unsigned diff = a != b;
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned char)(auth[7 + i] ^ s->api_key[i]);
    return diff == 0;
}

typedef struct {
    const char *path, *method;
    int kind; /* -1: not a generation / tokenizer endpoint; ROUTE_MESSAGES: Anthropic's Messages API */
} route;

static const route ROUTES[] = {
    {"/health", "GET", -1},
    {"/metrics", "GET", -1},
    {"/v1/models", "GET", -1},
    {"/v1/chat/completions", "POST", K3C_API_CHAT},
    {"/v1/completions", "POST", K3C_API_COMPLETION},
    {"/v1/messages", "POST", ROUTE_MESSAGES},
    {"/tokenize", "POST", K3C_API_TOKENIZE},
    {"/detokenize", "POST", K3C_API_DETOKENIZE},
};

static int handle(k3c_server *s, const char *method, const char *path, const char *auth, const char *body, size_t n,
                  api_reply *r) {
    const route *rt = NULL;
    for (size_t i = 0; i < sizeof ROUTES / sizeof *ROUTES; i++)
        if (!strcmp(path, ROUTES[i].path)) rt = &ROUTES[i];
    int ready = atomic_load(&s->ready) && !atomic_load(&s->stopping);
    if (!rt) return fail(r, 404, "invalid_request_error", "unknown_url", "Unknown request URL: %s", path);
    r->anthropic = rt->kind == ROUTE_MESSAGES;
    if (strcmp(method, rt->method)) {
        k3c_api_error e;
        k3c_api_fail(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%s %s: use %s", method, path,
                     rt->method);
        return reply_error(r, &e);
    }
    if (!strcmp(path, "/health")) {
        reply_json(r, ready ? 200 : 503);
        k3c_sbuf_printf(&r->body, "{\"status\":\"%s\"}",
                        ready                       ? "ok"
                        : atomic_load(&s->stopping) ? "stopping"
                                                    : "loading");
        return 0;
    }
    if (!strcmp(path, "/metrics")) {
        k3c_engine_stats st = {0};
        if (ready) k3c_sched_get_stats(s->sched, &st);
        r->status = 200;
        r->content_type = "text/plain; version=0.0.4";
        k3c_metrics_render(s->metrics, &r->body, &st, ready);
        k3c_conn_stats cs;
        http_guard_stats(s->guard, &cs);
        k3c_metrics_render_conns(&r->body, &cs);
        return 0;
    }
    if (!authorized(s, auth))
        return fail(r, 401, "authentication_error", "invalid_api_key", "%s",
                    "Incorrect API key provided: send it as 'Authorization: Bearer KEY'");
    if (!strcmp(path, "/v1/models")) return models(s, r);
    if (!ready) {
        r->retry_after = 1;
        return fail(r, 503, "server_error", "model_loading", "%s",
                    atomic_load(&s->stopping) ? "The server is shutting down" : "The model is still loading");
    }
    if (rt->kind == K3C_API_TOKENIZE || rt->kind == K3C_API_DETOKENIZE)
        return tokenize(s, (k3c_api_kind)rt->kind, body, n, r);
    generate(s, rt->kind, body, n, r);
    return 0;
}

void k3c_api_handle(k3c_server *s, const char *method, const char *path, const char *auth, const char *body, size_t n,
                    api_reply *r) {
    k3c_sbuf_init(&r->body);
    r->call = NULL;
    r->streamed = 0;
    r->retry_after = 0;
    r->status = 0;
    r->anthropic = 0;
    handle(s, method, path, auth, body, n, r);
}

/* ---------------------------------------------------------------- model hand-over */

int k3c_server_ready(k3c_server *s, k3c_serve *sv, k3c_err *err) {
    if (!sv->tok)
        return k3c_errf(err, K3C_EINVAL, "serve: the model directory has no tokenizer (%s)", K3C_TOK_DIR_VOCAB);
    const k3c_config *cfg = k3c_weights_config(sv->weights);
    int64_t nv = k3c_tok_n_vocab(sv->tok);
    int rc = k3c_vtrie_new(sv->tok, nv < cfg->vocab_size ? nv : cfg->vocab_size, &s->trie, err);
    if (rc) return rc;
    rc = k3c_sched_new(sv->weights, s->o.slots, s->o.queue_max, &s->sched, err);
    if (rc) return rc;
    s->sv = sv;
    s->lim = (k3c_api_limits){sv->tok,
                              k3c_turn_format(cfg),
                              s->model_name,
                              nv < cfg->vocab_size ? nv : cfg->vocab_size,
                              k3c_sched_max_ctx(s->sched),
                              s->o.max_tokens_cap,
                              sv->vision,
                              K3C_API_MAX_IMAGES,
                              s->o.max_image_bytes,
                              K3C_API_MAX_IMAGE_PIXELS,
                              s->o.thinking_off};
    s->n_stop_ids = k3c_turn_stop_ids(sv->tok, cfg, s->stop_ids, K3C_MAX_STOP_IDS);
    atomic_store(&s->ready, 1);
    return 0;
}
