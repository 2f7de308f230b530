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
    int64_t prefill_chunk;  /* prompt tokens of one sequence per step (0 = 256) */
    int64_t snapshot_every; /* prefix snapshots at prompt ends and every this many tokens (0 = no prefix cache) */
    int max_snapshots;      /* snapshots kept, least recently used evicted first (0 = 64) */
    int threads;            /* OpenMP threads (0 = the default) */
} k3c_engine_opts;

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
} k3c_request;

typedef enum {
    K3C_FINISH_NONE = 0, /* the sequence continues */
    K3C_FINISH_STOP,     /* a stop id was sampled */
    K3C_FINISH_LENGTH,   /* max_new tokens, or the context (max_ctx) is full */
} k3c_finish;

typedef struct {
    int64_t seq;       /* the id k3c_engine_submit returned */
    k3c_sampled token; /* the sampled id, its logprob and the top alternatives (sampler.logprobs of them) */
    int finish;        /* k3c_finish: not NONE on the sequence's last event; its id is then released */
} k3c_engine_event;

typedef struct {
    size_t state_bytes;          /* one sequence's state at max_ctx: KDA + conv tails + latent cache */
    size_t kda_state_bytes;      /* of which the KDA states and conv tails (independent of length) */
    size_t latent_bytes_per_tok; /* latent cache per token, all MLA layers */
    int64_t prefix_hits, prefix_tokens_reused, snapshots;
} k3c_engine_stats;

/* An engine over the float32 parameters of an opened CPU model (views; the model must outlive the engine). */
int k3c_engine_open(const k3c_model *m, const k3c_engine_opts *o, k3c_engine **out, k3c_err *err);
/* The same over caller-built weight views (e.g. mmap'd release checkpoints), which must outlive the engine. */
int k3c_engine_open_weights(const k3c_weights *w, const k3c_engine_opts *o, k3c_engine **out, k3c_err *err);
/* Queues a prompt (copied); *seq receives its id (> 0). Bad settings, an empty prompt, ids outside the vocabulary or
 * a prompt that leaves no room in max_ctx are K3C_EINVAL and queue nothing. */
int k3c_engine_submit(k3c_engine *e, const int32_t *prompt, int64_t n, const k3c_request *r, int64_t *seq,
                      k3c_err *err);
/* One step: admits waiting sequences, runs one forward, appends one event per sequence that sampled a token (at most
 * max_seqs; cap must hold them). *n_ev = 0 when nothing is left to do. On an error the sequences of the step are
 * dropped (their state is undefined) and the engine stays usable. */
int k3c_engine_step(k3c_engine *e, k3c_engine_event *ev, int cap, int *n_ev, k3c_err *err);
/* Drops a waiting or active sequence (no further events); K3C_ENOTFOUND for an unknown or finished id. */
int k3c_engine_cancel(k3c_engine *e, int64_t seq, k3c_err *err);
int k3c_engine_pending(const k3c_engine *e); /* sequences waiting or active */
void k3c_engine_get_stats(const k3c_engine *e, k3c_engine_stats *s);
void k3c_engine_close(k3c_engine *e);

#ifdef __cplusplus
}
#endif
#endif
