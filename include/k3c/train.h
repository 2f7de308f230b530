/* k3c/train.h — the public API of training runs: the run config (data sources, staged context,
 * optimizer, balancing, checkpoints) and the trainer. docs/TRAINING.md. */
#ifndef K3C_TRAIN_H
#define K3C_TRAIN_H

#include "k3c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- training (docs/TRAINING.md §1)
 * A run: the run config (model, data sources, staged context, optimizer, balancing, checkpoints) and the trainer that
 * executes it with checkpoints that resume bit-exactly. */
#define K3C_RUN_MAX_STAGES 16
#define K3C_RUN_MAX_SOURCES 16

typedef struct {
    char name[64];
    int64_t seq_len;         /* longest document piece (the stage's context length) */
    int64_t tokens_per_step; /* tokens per optimizer step */
    int64_t steps;
    double lr, min_lr_ratio; /* peak lr of the stage's schedule and its floor */
    int64_t warmup;
    int schedule;                        /* k3c_sched_kind */
    double mixture[K3C_RUN_MAX_SOURCES]; /* weight per data source (run order); all 0 = uniform */
} k3c_stage;

/* The run's parallel layout ("parallel" in the run config): degrees of data, expert, tensor, pipeline and context
 * parallelism; their product is the number of ranks (docs/PARALLEL.md). All zero: no block (dp = the world size).
 * micro_batches: pipeline micro-batches per step (0: pp). */
typedef struct {
    int64_t dp, ep, tp, pp, cp;
    int64_t micro_batches;
} k3c_parallel;
/* p as read from the run config (all zero: no "parallel" block, then dp = the world size). Checks, naming `file`: every
 * degree ≥ 1, dp·ep·tp·pp·cp = world, ep divides the routed experts, tp divides every head count, pp divides the
 * layers; then K3C_EUNSUPPORTED for what is not built yet (tp; cp with pp). *out gets the resolved layout. */
int k3c_parallel_resolve(const k3c_parallel *p, const k3c_config *cfg, int world, const char *file, k3c_parallel *out,
                         k3c_err *err);

typedef enum {
    K3C_BALANCE_QUANTILE = 0,
    K3C_BALANCE_BIAS = 1,
    K3C_BALANCE_AUX = 2,
    K3C_BALANCE_NONE = 3
} k3c_balancing;

typedef struct {
    char path[1024];         /* the config file (errors name it) */
    char model_config[1024]; /* HF config.json of the model to train */
    char vocab[1024];        /* tokenizer (tiktoken file, + .specials.json), copied into checkpoints */
    char pattern[16];        /* pre-tokeniser: "cl100k" or "kimi" */
    char out_dir[1024];
    int n_sources;
    char source_name[K3C_RUN_MAX_SOURCES][64];
    char source_dir[K3C_RUN_MAX_SOURCES][1024];
    int n_stages;
    k3c_stage stage[K3C_RUN_MAX_STAGES];
    uint64_t seed;
    double init_std;
    int kda_chunk; /* 16, 64 or 0 (token recurrence) */
    int threads;   /* 0 = OpenMP default */
    int recompute; /* 1 = recompute every layer's activations in the backward ("recompute": "all") */
    int64_t recompute_slice; /* > 0: the recomputed layers run in slices of this many tokens ("recompute_slice") */
    int64_t head_chunk;      /* > 0: lm_head and the loss run in chunks of this many tokens ("head_chunk") */
    /* optimizer */
    char matrix_optimizer[16]; /* "muon" or "adamw" */
    char muon_precision[16];   /* "auto" (the CPU and --gemm fp32: fp32; else bf16), "fp32" or "bf16" (GPU only) */
    double weight_decay, beta1, beta2, eps, grad_clip, qk_clip_tau;
    /* balancing (docs/TRAINING.md §1.6): quantile balancing ("exact" = "quantile", "histogram"), DeepSeek-V3's
     * auxiliary-loss-free bias step ("bias", step bias_gamma), the Switch / GShard auxiliary loss ("aux", coefficient
     * aux_alpha), or none ("none" = "off": the router bias stays frozen) */
    int balancing;                /* k3c_balancing */
    int qb_mode;                  /* K3C_BALANCE_QUANTILE: the k3c_qb_mode; else -1 */
    double bias_gamma, aux_alpha; /* the bias step γ ("bias") and the loss coefficient α ("aux") */
    int64_t log_every, eval_every, eval_batches, checkpoint_every, keep_checkpoints;
    k3c_parallel parallel;
    /* "parallel": {"force": true}: the parallel step even with one rank (ZeRO-1 and the expert exchange over the
     * one-rank communicator), to exercise its code paths on one process or one GPU (docs/PARALLEL.md "Launch") */
    int parallel_force;
    /* the step guard ("guard": {...}, docs/TRAINING.md §8.1): skip a step whose loss exceeds spike_factor x the median
     * of the last `window` losses (0: no spike test) or is not finite; after max_skips in a row (0: never) roll back to
     * the last good checkpoint with the learning rate multiplied by lr_factor */
    double guard_spike_factor, guard_lr_factor;
    int64_t guard_window, guard_max_skips;
} k3c_run_config;

/* Reads a run config JSON strictly: unknown keys, impossible stages (steps ≤ 0, seq_len > tokens_per_step, a mixture
 * naming an unknown source, negative weights, ...) are errors naming the file and field. Relative paths are taken
 * relative to the config file's directory. */
int k3c_run_config_load(const char *path, k3c_run_config *rc, k3c_err *err);

/* Options of one `k3c train` invocation. */
typedef struct {
    int resume;          /* continue from out_dir/latest */
    int64_t max_steps;   /* stop after this many steps in total (0 = run every stage); for tests */
    FILE *progress;      /* progress bar (drawn only when a terminal; NULL = none) */
    FILE *log;           /* per-step lines (NULL = none) */
    const void *backend; /* the k3c_backend_f32 (ops/backend.h) the model runs on; NULL = the CPU reference */
    void *comm;          /* the k3c_comm (src/parallel/comm.h) of every rank of the run; NULL = this process alone. Rank 0
                            writes metrics and checkpoints */
} k3c_train_opts;

typedef struct {
    int64_t steps;
    double last_loss, last_val_loss, tokens_per_s, wall_s;
    double max_load_ratio;  /* max/mean expert load of the last step, worst layer */
    double unigram_entropy; /* nats/token of the training tokens' unigram distribution (the context-free baseline) */
    int64_t skipped, rollbacks; /* the step guard's events in this invocation */
    double lr_scale;            /* the guard's learning-rate factor at the end (1 without rollbacks) */
} k3c_train_result;

/* Runs (or resumes) the training described by rc; writes checkpoints and metrics.jsonl into rc->out_dir (`k3c train`
 * then plots metrics.png). */
int k3c_train_run(const k3c_run_config *rc, const k3c_train_opts *opts, k3c_train_result *res, k3c_err *err);

/* ---------------------------------------------------------------- token shards (docs/TRAINING.md §2, §7.1)
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

/* ---------------------------------------------------------------- shard sets: a prepared directory
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

/* ---------------------------------------------------------------- prepare: corpora → shards (`k3c data prepare`) */
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


/* ---------------------------------------------------------------- the ranks of a run (docs/PARALLEL.md "Communicator")
 * A communicator by name (its collectives: src/parallel/comm.h); k3c_train_opts.comm takes one. */
typedef struct k3c_comm k3c_comm;
int k3c_comm_rank(const k3c_comm *c);
int k3c_comm_size(const k3c_comm *c);
/* 1 when this library was built with MPI (K3C_MPI); the MPI entries below fail with K3C_EUNSUPPORTED otherwise. */
int k3c_comm_mpi_available(void);
/* 1 when the process was started by an MPI launcher (mpirun / mpiexec set OMPI_COMM_WORLD_SIZE or PMI_SIZE). */
int k3c_comm_mpi_launched(void);
/* Finalises MPI if it was initialised and is not yet finalised (after every MPI communicator is freed). */
void k3c_comm_mpi_finalize(void);
/* Ends every rank of the MPI job with exit code `code` (a rank that failed alone would leave the others waiting in a
 * collective); returns only when MPI is not running. */
void k3c_comm_mpi_abort(int code);
/* NCCL (device memory, one GPU per rank; src/parallel/comm_nccl.cu, built by `make nccl`, linked with -lnccl): the
 * unique id travels over `boot` (e.g. the MPI world; then rank and size are boot's) or, boot NULL, through the file
 * `rendezvous` that rank 0 writes (a path every rank sees; NULL with size 1: a one-rank communicator). */
int k3c_comm_nccl(k3c_comm *boot, const char *rendezvous, int rank, int size, int device, k3c_comm **out, k3c_err *err);
/* The world the process runs in: MPI when launched by mpirun and built with MPI, else self. */
int k3c_comm_world(k3c_comm **out, k3c_err *err);
void k3c_comm_free(k3c_comm *c);

#ifdef __cplusplus
}
#endif
#endif
