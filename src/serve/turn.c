/* turn.c — ids → text → chat deltas for one assistant turn (turn.h), and the blocking run `k3c chat` uses. */
#include "serve/turn.h"

#include "base/check.h"
#include "tok/tok.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void msg_add_call(k3c_turn_msg *m, const char *name, const char *args) {
    if (m->ncalls == m->cap) {
        size_t nc = m->cap ? 2 * m->cap : 4;
        char **a = realloc(m->call_name, nc * sizeof *a), **b = a ? realloc(m->call_args, nc * sizeof *b) : NULL;
        if (a) m->call_name = a;
        if (b) m->call_args = b;
        if (!a || !b) {
            m->nomem = 1;
            return;
        }
        m->cap = nc;
    }
    char *n = strdup(name), *g = strdup(args);
    if (!n || !g) {
        free(n);
        free(g);
        m->nomem = 1;
        return;
    }
    m->call_name[m->ncalls] = n;
    m->call_args[m->ncalls++] = g;
}

static void turn_delta(void *ctx, const k3c_chat_delta *d) {
    k3c_turn *t = ctx;
    if (d->kind == K3C_CHAT_DELTA_REASONING) k3c_sbuf_append(&t->msg.reasoning, d->text, d->len);
    if (d->kind == K3C_CHAT_DELTA_CONTENT) k3c_sbuf_append(&t->msg.content, d->text, d->len);
    if (d->kind == K3C_CHAT_DELTA_CALL) msg_add_call(&t->msg, d->name, d->arguments);
    if (t->on_delta) t->on_delta(t->ctx, d);
}

static void turn_text(void *ctx, const char *s, size_t n) {
    k3c_turn *t = ctx;
    if (!t->parser) {
        t->on_text(t->ctx, s, n);
        return;
    }
    /* The parser reads past output that breaks the markup; it fails only out of memory, and the turn reports that. */
    if (k3c_chat_parser_feed(t->parser, s, n, NULL)) t->msg.nomem = 1;
}

int k3c_turn_init(k3c_turn *t, const k3c_tok *tok, const k3c_chat_parse_opts *chat, const char *const *stops, int nstop,
                  k3c_chat_delta_fn on_delta, k3c_text_fn on_text, void *ctx, k3c_err *err) {
    memset(t, 0, sizeof *t);
    t->on_delta = on_delta;
    t->on_text = on_text;
    t->ctx = ctx;
    k3c_sbuf_init(&t->msg.reasoning);
    k3c_sbuf_init(&t->msg.content);
    int rc = k3c_stopper_init(&t->stop, tok, stops, nstop, chat ? K3C_STOP_SPECIALS : 0, turn_text, t, err);
    if (!rc && chat) rc = k3c_chat_parser_new(chat, turn_delta, t, &t->parser, err);
    if (rc) k3c_turn_free(t);
    return rc;
}

/* 1 if id is one of the chat formats' control tokens, the specials the chat parser reads. */
static int chat_marker(const k3c_tok *tok, int32_t id) {
    const unsigned char *b;
    size_t nb;
    if (k3c_tok_token_bytes(tok, id, &b, &nb, NULL)) return 0;
    for (int i = 0; i < K3C_CHAT_N_SPECIALS; i++)
        if (strlen(k3c_chat_specials[i]) == nb && !memcmp(b, k3c_chat_specials[i], nb)) return 1;
    return 0;
}

int k3c_turn_token(k3c_turn *t, int32_t id, int is_stop, k3c_err *err) {
    if (is_stop) return 1;
    /* Any other special (an image token, a tokenizer's own extras) means nothing in a reply: it has no text. */
    if (t->parser && k3c_tok_is_special(t->stop.tok, id) && !chat_marker(t->stop.tok, id)) return 0;
    int rc = k3c_stopper_feed(&t->stop, id, err);
    if (rc >= 0 && (t->msg.nomem || !t->msg.reasoning.ok || !t->msg.content.ok))
        return k3c_errf(err, K3C_ENOMEM, "chat turn: out of memory");
    return rc;
}

int k3c_turn_finish(k3c_turn *t, k3c_err *err) {
    k3c_stopper_finish(&t->stop);
    if (t->parser && k3c_chat_parser_finish(t->parser, NULL)) t->msg.nomem = 1;
    if (t->msg.nomem || !t->msg.reasoning.ok || !t->msg.content.ok)
        return k3c_errf(err, K3C_ENOMEM, "chat turn: out of memory");
    return 0;
}

void k3c_turn_free(k3c_turn *t) {
    k3c_stopper_free(&t->stop);
    k3c_chat_parser_free(t->parser);
    k3c_sbuf_free(&t->msg.reasoning);
    k3c_sbuf_free(&t->msg.content);
    for (size_t i = 0; i < t->msg.ncalls; i++) {
        free(t->msg.call_name[i]);
        free(t->msg.call_args[i]);
    }
    free(t->msg.call_name);
    free(t->msg.call_args);
    memset(t, 0, sizeof *t);
}

int k3c_turn_chat_thinking(const char *dir, int *thinking, k3c_err *err) {
    *thinking = -1;
    char path[4200];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    if (access(path, F_OK) != 0) return K3C_OK;
    k3c_json *j;
    CHECK_RC(k3c_json_parse_file(path, &j, err));
    k3c_json_ctx c = {path, err};
    const k3c_json *chat = NULL;
    int on = 0, present = 0;
    int rc = j->type == K3C_JSON_OBJECT ? k3c_json_get_obj(&c, K3C_SPOT(j, "", "chat"), &chat)
                                        : k3c_errf(err, K3C_EFORMAT, "%s: expected an object", path);
    if (!rc && chat)
        rc = k3c_json_get_bool(&c, K3C_JSON_OPT, K3C_SPOT(chat, "chat.", "thinking"), K3C_NOSPOT, &on, &present);
    if (!rc && present) *thinking = on;
    k3c_json_free(j);
    return rc;
}

k3c_chat_format k3c_turn_format(const k3c_config *cfg) {
    return strcmp(cfg->model_type, "kimi_linear") == 0 ? K3C_CHAT_K2 : K3C_CHAT_XTML;
}

int k3c_turn_stop_ids(const k3c_tok *tok, const k3c_config *cfg, int32_t *ids, int max) {
    static const char *const names[] = {"<|end_of_msg|>", "<|im_end|>", "[EOS]", "<|endoftext|>", "[EOT]"};
    int n = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names && n < max; i++) {
        int32_t id = k3c_tok_special_id(tok, names[i]);
        if (id >= 0) ids[n++] = id;
    }
    int32_t eos = (int32_t)cfg->eos_token_id;
    int dup = 0;
    for (int i = 0; i < n; i++) dup |= ids[i] == eos;
    if (n < max && !dup && eos >= 0 && k3c_tok_is_special(tok, eos)) ids[n++] = eos;
    return n;
}

/* ---------------------------------------------------------------- blocking run */

int k3c_turn_run(k3c_sched *s, const int32_t *prompt, int64_t n, const k3c_request *req, k3c_turn *t, k3c_finish *why,
                 int64_t *n_gen, k3c_err *err) {
    k3c_sched_job *job;
    CHECK_RC(k3c_sched_submit(s, prompt, n, req, &job, err));
    k3c_engine_event ev;
    int rc = 0;
    *n_gen = 0;
    *why = K3C_FINISH_NONE;
    while (*why == K3C_FINISH_NONE) {
        k3c_sched_wait(job, &ev);
        int stop = 0;
        if (ev.token.id >= 0) {
            ++*n_gen;
            stop = k3c_turn_token(t, ev.token.id, ev.finish == K3C_FINISH_STOP, err);
        }
        if (stop < 0) {
            rc = err ? err->code : K3C_EINVAL;
            break;
        }
        *why = stop ? K3C_FINISH_STOP : (k3c_finish)ev.finish; /* an end-of-turn id or a stop string ends it */
    }
    k3c_sched_cancel(job); /* a no-op when the engine ended it */
    if (!rc && *why == K3C_FINISH_ERROR) rc = k3c_errf(err, K3C_EINVAL, "%s", k3c_sched_error(job));
    k3c_sched_release(job);
    return rc ? rc : k3c_turn_finish(t, err);
}
