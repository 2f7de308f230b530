/* k3c/serve.h — the public API of the inference engine: continuous batching over decode states,
 * requests, events and the prefix cache. docs/ENGINE.md. */
#ifndef K3C_SERVE_H
#define K3C_SERVE_H

#include "k3c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- inference engine (docs/ENGINE.md)
 * Continuous batching on the CPU: submitted sequences join between steps, each step runs one forward over a prompt
 * chunk or the last token of every active sequence (weight products batched over all rows, MoE rows grouped by
 * expert), samples each with its own settings, and finished sequences leave. Per sequence the engine keeps the decode
 * state (KDA recurrent state and conv tails, MLA latent cache); with snapshot_every it also keeps prefix snapshots of
 * that state, and a new prompt resumes from the longest snapshot that is a prefix of it. */
typedef struct k3c_engine k3c_engine;

typedef struct {
    int max_seqs;           /* sequences decoding at once (0 = 8); more wait in a queue */
    int64_t max_ctx;        /* tokens per sequence, prompt + output (0 = the config's max_position_embeddings) */
    int64_t prefill_chunk;  /* prompt tokens per step, all sequences together (0 = 256; at least max_seqs rows) */
    int64_t snapshot_every; /* prefix snapshots at prompt ends and every this many tokens (0 = no prefix cache) */
    int max_snapshots;      /* snapshots kept, least recently used evicted first (0 = 64) */
    int threads;            /* OpenMP threads (0 = the default) */
    int max_queue; /* sequences waiting beyond the free slots at most (0 = no bound, -1 = none); more are K3C_ENOMEM */
} k3c_engine_opts;

/* A constraint on what a sequence may generate (constrained decoding: docs/SERVING.md "Constrained decoding"). Called on
 * the stepping thread: mask sets the logits of the ids that may not come next to -inf (left: the ids the sequence may
 * still generate, this one included, so a constraint can keep a way to finish open), accept takes the sampled id.
 * Both return 0, or a negative k3c_status that ends the sequence with K3C_FINISH_ERROR. Once submitted, the engine
 * owns it and calls release (when not NULL) as the sequence leaves; a refused submit leaves it to the caller. */
typedef struct k3c_constraint {
    void *ctx;
    int (*mask)(void *ctx, float *logits, int64_t V, int64_t left);
    int (*accept)(void *ctx, int32_t id);
    void (*release)(void *ctx);
} k3c_constraint;

#define K3C_MAX_STOP_IDS 16
typedef struct {
    k3c_sampler sampler;
    int64_t max_new; /* tokens to generate at most (> 0) */
    int n_stop;      /* generation ends once one of stop_ids is sampled (it is reported, with finish STOP) */
    int32_t stop_ids[K3C_MAX_STOP_IDS];
    /* Optional input-embedding overrides (image tokens; docs/VISION.md "Serving images"): the n_embeds rows of embeds
       [n_embeds, hidden] replace the token embeddings of prompt positions embed_pos (strictly ascending, < n); both
       are copied at submit. Such a prompt reads and stores prefix snapshots only before its first overridden
       position, so two images behind the same placeholder ids never share a cached state. */
    int64_t n_embeds;
    const int32_t *embed_pos;
    const float *embeds;
    /* Seconds the sequence may wait for a slot, and may run once in one (0: no limit); past either it ends with
       K3C_FINISH_QUEUE_TIMEOUT / K3C_FINISH_TIMEOUT, checked at the start of each step. */
    double max_queue_s, max_gen_s;
    k3c_constraint *constraint; /* NULL: none */
} k3c_request;

typedef enum {
    K3C_FINISH_NONE = 0,      /* the sequence continues */
    K3C_FINISH_STOP,          /* a stop id was sampled (or, in the scheduler, the consumer stopped at a stop string) */
    K3C_FINISH_LENGTH,        /* max_new tokens, or the context (max_ctx) is full */
    K3C_FINISH_TIMEOUT,       /* ran longer than max_gen_s (no token in this event) */
    K3C_FINISH_QUEUE_TIMEOUT, /* waited for a slot longer than max_queue_s (nothing generated, no token) */
    K3C_FINISH_CANCELLED,     /* the scheduler's: cancelled, or the scheduler shut down */
    K3C_FINISH_ERROR,         /* the scheduler's: the engine failed */
} k3c_finish;

/* OpenAI's spelling: "stop", "length", "timeout", "queue_timeout", "cancelled", "error" (NONE: "none"). */
const char *k3c_finish_name(k3c_finish f);

typedef struct {
    int64_t seq;       /* the id k3c_engine_submit returned */
    k3c_sampled token; /* the sampled id (-1 in an event without a token), its logprob and the top alternatives
                          (sampler.logprobs of them) */
    int finish;        /* k3c_finish: not NONE on the sequence's last event; its id is then released */
} k3c_engine_event;

typedef struct {
    size_t state_bytes;          /* one sequence's state at max_ctx: KDA + conv tails + latent cache */
    size_t kda_state_bytes;      /* of which the KDA states and conv tails (independent of length) */
    size_t latent_bytes_per_tok; /* latent cache per token, all MLA layers */
    int64_t prefix_hits, prefix_tokens_reused, snapshots;
    int64_t prefills_shared;   /* sequences that forked from another's prefill of the same prompt (n samples) */
    int queued, running;       /* sequences waiting for a slot, sequences in one */
    uint64_t steps, step_seqs; /* forwards run, and the sequences they ran summed (step_seqs / steps: the mean batch) */
    int batch_max;             /* the most sequences one step ran */
} k3c_engine_stats;

/* An engine over the float32 parameters of an opened CPU model (views; the model must outlive the engine). */
int k3c_engine_open(const k3c_model *m, const k3c_engine_opts *o, k3c_engine **out, k3c_err *err);
/* The same over caller-built weight views (e.g. mmap'd release checkpoints), which must outlive the engine. */
int k3c_engine_open_weights(const k3c_weights *w, const k3c_engine_opts *o, k3c_engine **out, k3c_err *err);
/* Queues a prompt (copied); *seq receives its id (> 0). Bad settings, an empty prompt, ids outside the vocabulary or
 * a prompt that leaves no room in max_ctx are K3C_EINVAL and queue nothing; a full queue (max_queue) is K3C_ENOMEM.
 * Submit, cancel, pending and stats may be called from any thread while one thread steps. */
int k3c_engine_submit(k3c_engine *e, const int32_t *prompt, int64_t n, const k3c_request *r, int64_t *seq,
                      k3c_err *err);
/* One step: ends the sequences past their time limits, admits waiting ones, runs one forward and appends one event per
 * sequence that sampled a token or timed out (cap ≥ max_seqs; waiting sequences past their limit are reported while
 * there is room, the rest at the next step). *n_ev = 0 when nothing is left to do. On an error the sequences of the
 * step are dropped (their state is undefined), each reported by a K3C_FINISH_ERROR event, and the engine stays
 * usable. Steps run on one thread at a time. */
int k3c_engine_step(k3c_engine *e, k3c_engine_event *ev, int cap, int *n_ev, k3c_err *err);
/* Drops a waiting or active sequence (no further events once the step in progress, if any, has returned);
 * K3C_ENOTFOUND for an unknown or finished id. */
int k3c_engine_cancel(k3c_engine *e, int64_t seq, k3c_err *err);
int k3c_engine_pending(const k3c_engine *e); /* sequences waiting or active */
void k3c_engine_get_stats(const k3c_engine *e, k3c_engine_stats *s);
void k3c_engine_close(k3c_engine *e);

/* ================================================================ what `k3c serve`, `k3c chat` and `k3c generate`
 * use beyond the engine: the stopper (stop strings over decoded text), the HTTP server, a checkpoint's chat settings
 * and a conversation on the calling thread. The chat formats' deltas are k3c/tok.h's. */
#include "k3c/tok.h"

/* ---------------------------------------------------------------- the stopper (src/serve/stop.c)
 * An incremental detokeniser that never emits half a UTF-8 character and ends generation on stop strings, holding
 * back text that could still become one. */
#define K3C_STOP_MAX 16 /* stop strings per request */

/* Receives emitted text: valid UTF-8 (bytes the tokens spelled that are not are replaced by U+FFFD), never a part of a
 * stop string, never the start of a character whose other bytes have not been generated yet. */
typedef void (*k3c_text_fn)(void *ctx, const char *text, size_t len);

enum {
    K3C_STOP_SPECIALS = 1, /* special tokens are spelled out (the chat parser needs its markers); else skipped */
};

typedef struct {
    const k3c_tok *tok;
    int flags;
    int nstop;
    char *stop[K3C_STOP_MAX];
    size_t stop_len[K3C_STOP_MAX];
    k3c_sbuf pending; /* decoded, not yet emitted */
    int stopped;      /* a stop string appeared: everything from it on is dropped */
    k3c_text_fn on_text;
    void *ctx;
} k3c_stopper;

/* Copies the stop strings (each non-empty, at most K3C_STOP_MAX). */
int k3c_stopper_init(k3c_stopper *s, const k3c_tok *tok, const char *const *stops, int nstop, int flags,
                     k3c_text_fn on_text, void *ctx, k3c_err *err);
/* Appends one generated id; returns 1 once a stop string has appeared (the text before it has been emitted; the caller
 * should end generation), 0 to go on, or a negative status (unknown id, out of memory). */
int k3c_stopper_feed(k3c_stopper *s, int32_t id, k3c_err *err);
/* End of generation: emits what was held back (a stop-string prefix that never completed, an unfinished character as
 * U+FFFD). */
void k3c_stopper_finish(k3c_stopper *s);
void k3c_stopper_free(k3c_stopper *s);

/* ---------------------------------------------------------------- the server (docs/SERVING.md)
 * An OpenAI-compatible HTTP server (libmicrohttpd, a few polling threads over epoll) in front of the scheduler. */
typedef struct {
    const char *host;       /* listen address, default 127.0.0.1 */
    int port;               /* 0: any free port (k3c_server_port tells which) */
    int slots;              /* sequences in flight */
    int queue_max;          /* requests waiting for a slot before "overloaded" (503) */
    const char *api_key;    /* NULL: none; else every endpoint but /health and /metrics wants "Bearer KEY" */
    int64_t max_tokens_cap; /* completion tokens per request at most */
    size_t max_body;        /* request body bytes at most (413 beyond) */
    int max_connections;    /* open connections at most (libmicrohttpd refuses more at accept) */
    int max_conns_per_ip;   /* an address's connections beyond this get 503 + Retry-After; beyond twice it, refused */
    int threads;            /* libmicrohttpd's polling threads (epoll); no thread is spent per connection */
    double request_timeout; /* seconds to receive a whole request (header + body) after connecting or the last answer */
    double max_gen_s;       /* seconds a generation may run once in a slot (0: no limit) */
    double max_queue_s;     /* seconds a generation may wait for a slot (0: no limit) */
    const char *model_name; /* what /v1/models lists and requests may name */
    size_t max_image_bytes; /* encoded bytes of one image part at most (413 beyond) */
    int thinking_off;       /* requests default to thinking off (the checkpoint was fine-tuned without thinking) */
} k3c_server_opts;

void k3c_server_opts_default(k3c_server_opts *o);

typedef struct k3c_server k3c_server;

/* Starts listening at once (/health answers 503 until k3c_server_ready). */
int k3c_server_start(const k3c_server_opts *o, k3c_server **out, k3c_err *err);
int k3c_server_port(const k3c_server *s);
/* Hands over the loaded model (owned by the caller, kept open until k3c_server_stop returns) and starts serving. */
int k3c_server_ready(k3c_server *s, k3c_serve *sv, k3c_err *err);
/* Graceful: stops accepting, ends every generation (streams get their closing events), waits for the connections. */
void k3c_server_stop(k3c_server *s);

/* The thinking option a checkpoint was fine-tuned with (trainer_state.json's "chat", which `k3c sft` and `k3c rl`
 * write; docs/POST.md): *thinking 1 or 0, or -1 when the directory records none. A record that is there but malformed
 * is an error naming the file and field. */
int k3c_turn_chat_thinking(const char *dir, int *thinking, k3c_err *err);

/* ---------------------------------------------------------------- a conversation on the calling thread (`k3c chat`)
 * Each request is an OpenAI chat-completion body, validated and rendered by the request layer and run by a scheduler
 * of one slot as `k3c serve` runs it, ending at the model's end-of-turn ids (src/serve/chat_session.c). */
typedef struct k3c_chat_session k3c_chat_session;
/* sv, opened with its tokenizer, must outlive the session. */
int k3c_chat_session_open(const k3c_serve *sv, k3c_chat_session **out, k3c_err *err);
/* Runs the request body[0..n): the reply's deltas go to on_delta(ctx) as they are generated, then the assistant
 * message ({"role": "assistant", "content", "reasoning_content", "tool_calls"}) is appended to reply; *why receives
 * the finish reason, *n_gen the ids generated. A request the request layer refuses is K3C_EINVAL naming the
 * parameter. */
int k3c_chat_session_turn(k3c_chat_session *c, const char *body, size_t n, k3c_chat_delta_fn on_delta, void *ctx,
                          k3c_sbuf *reply, k3c_finish *why, int64_t *n_gen, k3c_err *err);
void k3c_chat_session_close(k3c_chat_session *c);

#ifdef __cplusplus
}
#endif
#endif
