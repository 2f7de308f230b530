/* engine.h — internal to src/serve: the decode state of one sequence (KDA recurrent state, short-conv tails, MLA latent
 * cache) and the forward-only pass over a batch of sequence segments that reads and advances it. docs/ENGINE.md. */
#ifndef K3C_SERVE_ENGINE_H
#define K3C_SERVE_ENGINE_H

#include "serve/weights.h"

/* Sizes the state and the step buffers derive from the config. */
typedef struct {
    int L, n_kda, n_mla;
    int idx[K3C_MAX_LAYERS];            /* layer l's index among the layers of its mixer kind */
    int64_t D, V, H, dk, P, W;          /* KDA: heads, head dim, P = H·dk, conv kernel */
    int64_t Hm, nope, rope, dv, rkv, r; /* MLA */
    int64_t kda_floats;                 /* per KDA layer: S [H, dk, dk] then conv tails [3][P, W−1] */
    int64_t lat_w;                      /* per cached token per MLA layer: rkv + rope (normalised latent, shared key) */
    const k3c_backend_f32 *be;          /* where states live: the weights' backend (NULL: the CPU) */
} k3c_eng_dims;

void k3c_eng_dims_of(const k3c_config *c, k3c_eng_dims *d);
/* The backend of d (the CPU table when d->be is NULL). */
const k3c_backend_f32 *k3c_eng_backend(const k3c_eng_dims *d);

/* One sequence's decode state: everything the next token needs from the ones before it, in the backend's memory. */
typedef struct {
    float *kda;  /* n_kda × kda_floats */
    float *mla;  /* n_mla × cap × lat_w: layer j's cache at mla + j·cap·lat_w, token t at + t·lat_w */
    int64_t pos; /* tokens consumed */
    int64_t cap; /* latent cache capacity in tokens */
    const k3c_backend_f32 *be; /* whose memory kda and mla are */
} k3c_eng_state;

/* Bytes of a state holding cap tokens (KDA + conv tails + latent cache). */
size_t k3c_eng_state_bytes(const k3c_eng_dims *d, int64_t cap);
int k3c_eng_state_init(k3c_eng_state *s, const k3c_eng_dims *d, int64_t cap, k3c_err *err);
void k3c_eng_state_free(k3c_eng_state *s);
/* Back to an empty sequence (zero state, pos 0). */
int k3c_eng_state_reset(k3c_eng_state *s, const k3c_eng_dims *d, k3c_err *err);
/* dst ← src (dst->cap ≥ src->pos): the KDA state, conv tails and the cached tokens in use. */
int k3c_eng_state_copy(k3c_eng_state *dst, const k3c_eng_state *src, const k3c_eng_dims *d, k3c_err *err);

/* A run of consecutive tokens of one sequence inside a step: rows row0 .. row0+len−1 of the step's batch. */
typedef struct {
    k3c_eng_state *st;
    int64_t row0, len;
    const float *const *emb; /* NULL, or len row pointers: a non-NULL one [D] replaces that row's token embedding */
} k3c_eng_seg;

/* The step's buffers in the weights' backend memory, planned for up to max_rows rows and logits of up to max_out rows
 * (k3c_eng_ws_init); the engine's ops are the weights' backend's (ops/decode.h), chosen here once. */
typedef struct k3c_eng_ws k3c_eng_ws;
int k3c_eng_ws_init(const k3c_weights *w, int64_t max_rows, int64_t max_out, k3c_eng_ws **out, k3c_err *err);
/* Whether repeated decode steps (every segment one token, every row's logits) are captured and replayed per batch size
 * where the backend can (CUDA graphs; on by default). */
void k3c_eng_ws_use_graphs(k3c_eng_ws *ws, int on);
void k3c_eng_ws_free(k3c_eng_ws *ws);

/* Runs ids[0..n) (host memory; n = Σ len, segments in row order, each state advanced by its len tokens and its cache extended) and
 * writes logits [n_out, V] of the rows out_rows[0..n_out) (NULL: every row, n_out = n) into
 * host memory. A segment of one token runs
 * the KDA recurrence, a longer one the chunked form (CPU) or the recurrence (CUDA); attention is blocked over each sequence's latent cache. A state
 * appears in at most one segment of a step. On an error the states of the step may be partly advanced. */
int k3c_eng_forward(const k3c_weights *w, k3c_eng_ws *ws, const int32_t *ids, const k3c_eng_seg *segs, int nseg,
                    const int64_t *out_rows, int64_t n_out, float *logits, k3c_err *err);

/* The logits row behind event i of the last k3c_engine_step (tests compare them with cold runs). */
const float *k3c_engine_event_logits(const k3c_engine *e, int i);

#endif
