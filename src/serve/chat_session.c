/* chat_session.c — a conversation on the calling thread (`k3c chat`): each request goes through the request layer's
 * validation and chat rendering and through the scheduler as `k3c serve`'s requests do. docs/SERVING.md. */
#include "serve/request.h"
#include "serve/turn.h"

#include <stdlib.h>
#include <string.h>

struct k3c_chat_session {
    k3c_sched *sched;
    k3c_api_limits lim;
    int32_t stop_ids[K3C_MAX_STOP_IDS];
    int n_stop;
};

int k3c_chat_session_open(const k3c_serve *sv, k3c_chat_session **out, k3c_err *err) {
    *out = NULL;
    if (!sv->tok) return k3c_errf(err, K3C_EINVAL, "chat: the model was opened without its tokenizer");
    k3c_chat_session *c = calloc(1, sizeof *c);
    if (!c) return k3c_errf(err, K3C_ENOMEM, "chat: out of memory");
    int rc = k3c_sched_new(sv->weights, 1, 0, &c->sched, err);
    if (rc) {
        free(c);
        return rc;
    }
    const k3c_config *cfg = k3c_weights_config(sv->weights);
    const int64_t nv = k3c_tok_n_vocab(sv->tok), ctx = k3c_sched_max_ctx(c->sched);
    c->lim = (k3c_api_limits){.tok = sv->tok,
                              .format = k3c_turn_format(cfg),
                              .model_name = "k3c",
                              .n_vocab = nv < cfg->vocab_size ? nv : cfg->vocab_size,
                              .max_context = ctx,
                              .max_tokens_cap = ctx,
                              .vision = sv->vision,
                              .max_images = K3C_API_MAX_IMAGES,
                              .max_image_bytes = K3C_API_MAX_IMAGE_BYTES,
                              .max_image_pixels = K3C_API_MAX_IMAGE_PIXELS};
    c->n_stop = k3c_turn_stop_ids(sv->tok, cfg, c->stop_ids, K3C_MAX_STOP_IDS);
    *out = c;
    return 0;
}

void k3c_chat_session_close(k3c_chat_session *c) {
    if (!c) return;
    k3c_sched_free(c->sched);
    free(c);
}

/* The assistant message (content, reasoning, tool calls) as a chat message object. */
static void message_json(k3c_sbuf *h, const k3c_turn_msg *m) {
    k3c_sbuf_append(h, "{\"role\":\"assistant\",\"content\":", 30);
    k3c_sbuf_json_string(h, m->content.buf ? m->content.buf : "", m->content.len);
    if (m->reasoning.len) {
        k3c_sbuf_append(h, ",\"reasoning_content\":", 21);
        k3c_sbuf_json_string(h, m->reasoning.buf, m->reasoning.len);
    }
    if (m->ncalls) k3c_sbuf_append(h, ",\"tool_calls\":[", 15);
    for (size_t i = 0; i < m->ncalls; i++) {
        k3c_sbuf_printf(h, "%s{\"id\":\"call_%zu\",\"type\":\"function\",\"function\":{\"name\":", i ? "," : "", i);
        k3c_sbuf_json_string(h, m->call_name[i], strlen(m->call_name[i]));
        k3c_sbuf_append(h, ",\"arguments\":", 13);
        k3c_sbuf_json_string(h, m->call_args[i], strlen(m->call_args[i]));
        k3c_sbuf_append(h, "}}", 2);
    }
    k3c_sbuf_append(h, m->ncalls ? "]}" : "}", m->ncalls ? 2 : 1);
}

int k3c_chat_session_turn(k3c_chat_session *c, const char *body, size_t n, k3c_chat_delta_fn on_delta, void *ctx,
                          k3c_sbuf *reply, k3c_finish *why, int64_t *n_gen, k3c_err *err) {
    k3c_api_req q;
    k3c_api_error e;
    *why = K3C_FINISH_STOP;
    *n_gen = 0;
    if (k3c_api_parse(K3C_API_CHAT, body, n, &c->lim, &q, &e)) {
        k3c_api_req_free(&q);
        return k3c_errf(err, K3C_EINVAL, "%s%s%s", e.param[0] ? e.param : "", e.param[0] ? ": " : "", e.message);
    }
    k3c_turn t;
    int rc = k3c_turn_init(&t, c->lim.tok, &q.parse, q.stop, q.nstop, on_delta, NULL, ctx, err);
    k3c_request g = q.gen;
    g.n_stop = c->n_stop;
    memcpy(g.stop_ids, c->stop_ids, sizeof g.stop_ids);
    if (!rc) rc = k3c_turn_run(c->sched, q.prompt.ids, (int64_t)q.prompt.n, &g, &t, why, n_gen, err);
    if (!rc) message_json(reply, &t.msg);
    k3c_turn_free(&t);
    k3c_api_req_free(&q);
    return rc;
}
