/* data.h — the training data pipeline: the packed loader (cu_seqlens batches, mixtures, resumable state) over the token
 * shards and `k3c data prepare` of the public k3c/train.h. Spec: docs/TRAINING.md §2, §7.1. */
#ifndef K3C_TRAIN_DATA_H
#define K3C_TRAIN_DATA_H

#include "base/base.h"
#include "tok/tok.h"
#include "k3c/train.h"

/* ================================================================ the packed loader (docs/TRAINING.md §2)
 * A step asks for exactly T tokens with pieces of at most S tokens. Documents are taken whole or in pieces: a piece
 * is min(S, rest of the document, room left in the step); each piece is its own sequence for the model (KDA state,
 * conv tails and the MLA mask reset at its start). A document cut by the end of a step continues in the next one. */
#define K3C_LOADER_MAX_SOURCES 16
#define K3C_LOADER_STATE_MAGIC 0x4b33434c4f414452ull /* "K3CLOADR" */
#define K3C_LOADER_STATE_VERSION 1u

typedef struct {
    int64_t T;
    int32_t *ids;          /* [T] */
    int32_t *targets;      /* [T]: ids[i+1] inside a piece, -1 at the last token of every piece */
    int32_t *cu_seqlens;   /* [n_docs + 1] (capacity T + 1): piece starts, cu_seqlens[n_docs] = T */
    int32_t *piece_source; /* [n_docs]: the source index of each piece */
    int32_t n_docs;        /* pieces in this batch */
} k3c_batch;

int k3c_batch_alloc(k3c_batch *b, int64_t T, k3c_err *err); /* 1 <= T <= INT32_MAX - 1 */
void k3c_batch_free(k3c_batch *b);

typedef struct {
    const char *name; /* NULL = the manifest's source name; names must be distinct */
    const char *dir;  /* a directory written by k3c_data_prepare */
} k3c_data_source;

/* Per source: the epoch, the position in that epoch's permutation, and tokens already emitted of that document. */
typedef struct {
    int64_t epoch, pos, offset;
} k3c_loader_cursor;

/* The whole loader state: plain data, safe to store as bytes. */
typedef struct {
    uint64_t magic;   /* K3C_LOADER_STATE_MAGIC */
    uint32_t version; /* K3C_LOADER_STATE_VERSION */
    int32_t n_sources;
    uint64_t seed;
    uint64_t counter;      /* mixture draws so far: draw i is k3c_uniform_at(mix seed, i) */
    uint64_t sources_hash; /* FNV-1a of the source names in order, so a state cannot be restored into other sources */
    int64_t steps, tokens; /* batches and tokens produced */
    int32_t cur_source;    /* the source whose document is being emitted; -1 = draw a source for the next document */
    int32_t pad_;
    k3c_loader_cursor cursor[K3C_LOADER_MAX_SOURCES];
} k3c_loader_state;

typedef struct k3c_loader k3c_loader;

/* Opens the train and val splits of every source (all validated, one vocab size). weights: NULL or n entries >= 0
 * (all zero = uniform); a source with weight > 0 needs train tokens. */
int k3c_loader_open(const k3c_data_source *src, int n, const double *weights, uint64_t seed, k3c_loader **out,
                    k3c_err *err);
void k3c_loader_close(k3c_loader *ld);
/* New mixture weights (e.g. a new stage); cursors are kept. A document in progress is finished first. */
int k3c_loader_set_weights(k3c_loader *ld, const double *weights, k3c_err *err);

int k3c_loader_n_sources(const k3c_loader *ld);
const char *k3c_loader_source_name(const k3c_loader *ld, int i);
int64_t k3c_loader_vocab_size(const k3c_loader *ld);
const k3c_shard_set *k3c_loader_split(const k3c_loader *ld, int source, int val);

/* Fills b with the next T = b->T tokens, pieces <= S. */
int k3c_loader_next(k3c_loader *ld, int64_t S, k3c_batch *b, k3c_err *err);

void k3c_loader_get_state(const k3c_loader *ld, k3c_loader_state *st);
/* Validates (magic, version, sources, cursor ranges) and installs st; the next batch continues bit-exactly. */
int k3c_loader_set_state(k3c_loader *ld, const k3c_loader_state *st, k3c_err *err);
/* The state as a JSON object (malloc'd, NUL-terminated) and back; cursors are matched to sources by name. */
int k3c_loader_state_to_json(const k3c_loader *ld, char **json, k3c_err *err);
int k3c_loader_state_from_json(k3c_loader *ld, const char *json, size_t n, k3c_err *err);

/* Validation: a fixed order (sources in order, documents in shard order), the same batches on every pass; when the
 * split is used up it starts again from its first document, so every batch is full. */
typedef struct {
    int32_t source; /* -1 = every source's val split, one after another */
    int32_t cur;    /* source being read */
    int64_t doc, offset;
} k3c_val_iter;

void k3c_loader_val_begin(const k3c_loader *ld, int source, k3c_val_iter *it);
int64_t k3c_loader_val_tokens(const k3c_loader *ld, int source); /* source -1 = all */
/* K3C_ENOTFOUND when the selected val splits hold no tokens. */
int k3c_loader_val_next(const k3c_loader *ld, k3c_val_iter *it, int64_t S, k3c_batch *b, k3c_err *err);

#endif
