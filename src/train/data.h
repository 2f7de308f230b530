/* data.h — the training data pipeline: token shards (a checksummed binary format), `k3c data prepare` (text / JSONL
 * corpora → shards), and the packed loader (cu_seqlens batches, mixtures, resumable state). Spec: docs/TRAINING.md §2, §7.1. */
#ifndef K3C_TRAIN_DATA_H
#define K3C_TRAIN_DATA_H

#include "base/base.h"
#include "tok/tok.h"

/* ================================================================ shards
 * One file, little-endian:
 *   0   char[8]  magic "K3CSHARD"
 *   8   u32      version (K3C_SHARD_VERSION)
 *   12  u32      token width in bytes: 2 when vocab_size <= 65536, else 4
 *   16  u64      vocab_size (every token is < vocab_size)
 *   24  u64      n_docs
 *   32  u64      n_tokens
 *   40  u64[3]   reserved, zero
 *   64  u64[n_docs + 1]   doc offsets into the tokens: 0 = off[0] <= off[1] <= ... <= off[n_docs] = n_tokens
 *   ..  u16|u32[n_tokens] tokens
 *   ..  u64      FNV-1a 64 of every byte before it
 * Documents never straddle shards; document d is tokens[off[d] .. off[d+1]). */
#define K3C_SHARD_MAGIC "K3CSHARD"
#define K3C_SHARD_VERSION 1u
#define K3C_SHARD_HEADER_BYTES 64
#define K3C_SHARD_EXT ".k3cshard"

/* the checksum is k3c_fnv1a64 (base/base.h) */

/* Writes one shard atomically (temp file, fsync, rename, fsync of the directory). tokens[n_tokens], offsets[n_docs+1].
 * The input is validated like a read (offsets monotone from 0 to n_tokens, every token in [0, vocab_size)). */
int k3c_shard_write(const char *path, const int32_t *tokens, int64_t n_tokens, const uint64_t *offsets, int64_t n_docs,
                    int64_t vocab_size, k3c_err *err);

/* An mmapped, fully validated shard (size, magic, version, width, offsets, tokens < vocab, checksum). Read-only. */
typedef struct {
    char path[1024];
    uint32_t version, token_bytes;
    int64_t vocab_size, n_docs, n_tokens;
    const uint64_t *offsets;     /* n_docs + 1, inside the mapping */
    const unsigned char *tokens; /* n_tokens * token_bytes, inside the mapping */
    void *map;
    size_t map_len;
} k3c_shard;

int k3c_shard_open(const char *path, k3c_shard **out, k3c_err *err);
void k3c_shard_close(k3c_shard *s);
static inline int64_t k3c_shard_doc_len(const k3c_shard *s, int64_t d) {
    return (int64_t)(s->offsets[d + 1] - s->offsets[d]);
}
/* Copies n tokens of document d starting at token `from` of the document to dst as int32 (bounds are the caller's). */
void k3c_shard_copy(const k3c_shard *s, int64_t d, int64_t from, int64_t n, int32_t *dst);

/* ================================================================ shard sets: a prepared directory
 * DIR/manifest.json names the source, the vocabulary and, per split ("train", "val"), its shards in order with their
 * document and token counts. A set is one split: its shards opened and checked against the manifest; documents are
 * numbered across the shards in manifest order. */
typedef struct {
    char dir[1024];
    char source[64];            /* the manifest's source name */
    char vocab[1024];           /* the vocabulary the shards were encoded with */
    int64_t vocab_size, eod_id; /* eod_id -1 when documents carry no end token */
    int n_shards;
    k3c_shard **shards;
    int64_t *doc_base; /* n_shards + 1: first global document of each shard */
    int64_t n_docs, n_tokens;
} k3c_shard_set;

/* split: "train" or "val". A split with no shards opens as an empty set. */
int k3c_shard_set_open(const char *dir, const char *split, k3c_shard_set **out, k3c_err *err);
void k3c_shard_set_close(k3c_shard_set *s);
/* The shard and local index of global document d (0 <= d < n_docs). */
void k3c_shard_set_locate(const k3c_shard_set *s, int64_t d, const k3c_shard **sh, int64_t *local);
int64_t k3c_shard_set_doc_len(const k3c_shard_set *s, int64_t d);

/* ================================================================ prepare: corpora → shards (`k3c data prepare`) */
typedef enum { K3C_DATA_FORMAT_AUTO = 0, K3C_DATA_FORMAT_TEXT = 1, K3C_DATA_FORMAT_JSONL = 2 } k3c_data_format;
/* How a text file is cut into documents: runs of non-blank lines, the whole file, or every non-blank line. */
typedef enum { K3C_DOC_SPLIT_BLANK = 0, K3C_DOC_SPLIT_FILE = 1, K3C_DOC_SPLIT_LINE = 2 } k3c_doc_split;

int k3c_data_format_parse(const char *name, int *out, k3c_err *err); /* "auto" "text" "jsonl" */
int k3c_doc_split_parse(const char *name, int *out, k3c_err *err);   /* "blank" "file" "line" */

typedef struct {
    const char *vocab_path; /* tiktoken file; "<vocab>.specials.json" is loaded when present */
    k3c_tok_pattern pattern;
    const char *const
        *inputs; /* files or directories (every regular file below, in sorted order); .gz is decompressed */
    int n_inputs;
    const char *out_dir;     /* created if missing */
    const char *source;      /* NULL = the out_dir's last component */
    int format;              /* k3c_data_format: auto = JSONL for *.jsonl / *.ndjson (optionally .gz), else text */
    int doc_split;           /* k3c_doc_split, for text files */
    const char *jsonl_field; /* NULL = "text" */
    const char *eod;         /* spelling of the special appended to every document; NULL = "<|endoftext|>", "" = none */
    double val_fraction;  /* each document goes to val with this probability (a pure function of seed and its index) */
    int64_t shard_tokens; /* a shard is closed before it would pass this many tokens; 0 = 16M */
    uint64_t seed;
    /* optional progress: bytes of input consumed so far (of total), tokens written so far */
    void (*progress)(void *ctx, int64_t bytes_done, int64_t bytes_total, int64_t tokens);
    void *progress_ctx;
    int strict_utf8; /* 1 = a document that is not valid UTF-8 is an error; 0 = encoded byte by byte and counted */
} k3c_prepare_opts;

typedef struct {
    int n_files;
    int64_t bytes;              /* input bytes after decompression */
    int64_t docs[2], tokens[2]; /* [0] train, [1] val */
    int shards[2];
    int64_t vocab_size, eod_id;
    double seconds;
    int64_t invalid_utf8_docs; /* documents that are not valid UTF-8 (strict_utf8 = 0) */
    /* where the first one is: "FILE: byte N" (text files) or "FILE:LINE: byte N of the text" (JSONL) */
    char invalid_utf8_first[4352];
} k3c_prepare_result;

/* Encodes every document (in parallel over documents, OpenMP), appends the end-of-document token, splits documents
 * into train / val (deterministic in seed; at least one val document when val_fraction > 0 and there are >= 2), writes
 * DIR/{train,val}-NNNNN.k3cshard and DIR/manifest.json (written last). */
int k3c_data_prepare(const k3c_prepare_opts *o, k3c_prepare_result *res, k3c_err *err);

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
