/* turn.h — one assistant turn from generated ids to what a client sees: ids → text (stop strings, whole characters;
 * stop.h) → for chat, the incremental chat parser's reasoning / content / tool-call deltas (tok/xtml.h). Shared by
 * `k3c serve` and `k3c chat`, together with the model-dependent choices: chat format and end-of-turn ids. */
#ifndef K3C_SERVE_TURN_H
#define K3C_SERVE_TURN_H

#include "serve/sched.h"
#include "serve/stop.h"
#include "tok/xtml.h"

/* The assistant message as the deltas built it (what a non-streamed response returns). */
typedef struct {
    k3c_sbuf reasoning, content;
    char **call_name, **call_args;
    size_t ncalls, cap;
    int nomem;
} k3c_turn_msg;

typedef struct {
    k3c_stopper stop;
    k3c_chat_parser *parser; /* NULL: a plain completion, text goes to on_text */
    k3c_chat_delta_fn on_delta;
    k3c_text_fn on_text;
    void *ctx;
    k3c_turn_msg msg; /* chat: the message so far */
} k3c_turn;

/* chat NULL: completion (special tokens are not spelled out; text goes to on_text). Else the parser's deltas go to
 * on_delta (NULL: only collected in t->msg). Output that breaks the markup (a model's slip, e.g. a tool-call end
 * without its start, a channel the prompt did not open) is not an error: the parser reads past it (chat->strict should
 * be 0), and no markup ever reaches the message as text. */
int k3c_turn_init(k3c_turn *t, const k3c_tok *tok, const k3c_chat_parse_opts *chat, const char *const *stops, int nstop,
                  k3c_chat_delta_fn on_delta, k3c_text_fn on_text, void *ctx, k3c_err *err);
/* One generated id (is_stop: an end-of-turn id, not shown). Returns 1 when generation should end (a stop string),
 * 0 to go on, negative on failure (an id the tokenizer does not know, out of memory). */
int k3c_turn_token(k3c_turn *t, int32_t id, int is_stop, k3c_err *err);
/* Releases held-back text and closes the parser. */
int k3c_turn_finish(k3c_turn *t, k3c_err *err);
void k3c_turn_free(k3c_turn *t);

/* K3 XTML for kimi_k3 configs, the K2 envelope for kimi_linear. */
k3c_chat_format k3c_turn_format(const k3c_config *cfg);
/* The ids that end a turn: the format's end-of-message marker, [EOS] / <|endoftext|> / [EOT] when the tokenizer has
 * them, and the config's eos_token_id when it is a special token. Returns the count (at most max). */
int k3c_turn_stop_ids(const k3c_tok *tok, const k3c_config *cfg, int32_t *ids, int max);

/* Runs prompt[0..n) with req to the end on the calling thread (submit, then take the events): for `k3c chat`. The turn
 * receives the tokens; *why the finish reason, *n_gen the ids generated. */
int k3c_turn_run(k3c_sched *s, const int32_t *prompt, int64_t n, const k3c_request *req, k3c_turn *t, k3c_finish *why,
                 int64_t *n_gen, k3c_err *err);

#endif
