/* k3c.h — the public API of libk3c, the Kimi-K3-class sparse MoE engine in C: errors, arena, safetensors and checkpoint
 * reading, the model config, the model (open / forward / backward / free), tokenizer and generation. Each room users
 * call has its own header beside it: k3c/train.h (training runs, data, ranks), k3c/serve.h (the inference engine, the
 * server), k3c/tok.h (tokenizer extras, chat formats), k3c/post.h (post-training), k3c/vision.h (the vision tower),
 * k3c/exp.h (experiments), k3c/plan.h (`k3c plan`), k3c/check.h (golden checks), k3c/device.h (backends: the GPU). */
#ifndef K3C_H
#define K3C_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define K3C_VERSION "0.1.0"

/* ---------------------------------------------------------------- errors
 * Library functions return 0 on success or a negative k3c_status and, when `err` is non-NULL, leave a message
 * naming the file / tensor / field and the reason. Nothing below cli/ prints or exits. */
typedef enum {
    K3C_OK = 0,
    K3C_EINVAL = -1, /* bad argument or malformed input */
    K3C_EIO = -2,    /* file system */
    K3C_ENOMEM = -3,
    K3C_EFORMAT = -4, /* malformed file contents (safetensors, json, shard, vocab, ...) */
    K3C_ECONFIG = -5, /* config missing / contradictory field */
    K3C_ENOTFOUND = -6,
    K3C_EUNSUPPORTED = -7,
    K3C_ENUMERIC = -8, /* non-finite or out-of-range numbers */
    K3C_EDEVICE = -9,  /* CUDA / NCCL / MPI failure */
} k3c_status;

typedef struct {
    int code;
    char msg[1024];
} k3c_err;

/* Sets err (if non-NULL) and returns code, so callers can `return k3c_errf(err, K3C_EIO, "...")`. */
int k3c_errf(k3c_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Prefixes an existing message with context ("loading x: " + old message); returns err->code. */
int k3c_err_wrap(k3c_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *k3c_status_name(int code);

/* A growable string that text and JSON writers append to (src/base/json.h); every append is a no-op after an
 * allocation failure (ok = 0). A parsed JSON value is a k3c_json (by name only; src/base/json.h reads and walks it). */
typedef struct k3c_sbuf {
    char *buf;
    size_t len, cap;
    int ok;
} k3c_sbuf;
void k3c_sbuf_init(k3c_sbuf *s);
void k3c_sbuf_free(k3c_sbuf *s);
typedef struct k3c_json k3c_json;

/* ---------------------------------------------------------------- dtypes */
typedef enum { K3C_F64, K3C_F32, K3C_BF16, K3C_F16, K3C_I64, K3C_I32, K3C_U8, K3C_DTYPE_COUNT } k3c_dtype;

size_t k3c_dtype_size(k3c_dtype t);
const char *k3c_dtype_name(k3c_dtype t);               /* safetensors spelling: "F32", "BF16", ... */
int k3c_dtype_parse(const char *name, k3c_dtype *out); /* 0 or K3C_EFORMAT */

#define K3C_MAX_DIMS 8 /* safetensors tensors have at most this many dimensions */

/* ---------------------------------------------------------------- arena / workspace
 * One block, bump allocation with 64-byte alignment, marks to release back to, peak tracking. */
typedef struct {
    unsigned char *base;
    size_t cap, used, peak;
    int owns;
} k3c_arena;

int k3c_arena_init(k3c_arena *a, size_t cap, k3c_err *err);
void k3c_arena_init_from(k3c_arena *a, void *mem, size_t cap); /* caller-owned memory (must be 64-aligned) */
void *k3c_arena_alloc(k3c_arena *a, size_t bytes);             /* NULL when full; memory is not zeroed */
void *k3c_arena_calloc(k3c_arena *a, size_t bytes);
size_t k3c_arena_mark(const k3c_arena *a);
void k3c_arena_reset(k3c_arena *a, size_t mark);
void k3c_arena_free(k3c_arena *a);
/* ---------------------------------------------------------------- threads (OpenMP) */
int k3c_num_threads(void);
void k3c_set_num_threads(int n);

/* ---------------------------------------------------------------- safetensors (docs/FORMATS.md §1.2) */
typedef struct {
    const char *name;
    k3c_dtype dtype;
    int ndim;
    int64_t shape[K3C_MAX_DIMS];
    const void *data; /* points into the mmapped file */
    size_t nbytes;
    const char *file; /* the shard this tensor lives in */
} k3c_st_tensor;

typedef struct k3c_safetensors k3c_safetensors; /* one mmapped, validated file */
int k3c_st_open(const char *path, k3c_safetensors **out, k3c_err *err);
void k3c_st_close(k3c_safetensors *st);
int k3c_st_count(const k3c_safetensors *st);
const k3c_st_tensor *k3c_st_at(const k3c_safetensors *st, int i);
const k3c_st_tensor *k3c_st_find(const k3c_safetensors *st, const char *name);
const char *k3c_st_metadata(const k3c_safetensors *st, const char *key); /* NULL if absent */

/* A checkpoint directory: model.safetensors, or model.safetensors.index.json + shards (all validated). */
typedef struct k3c_checkpoint k3c_checkpoint;
int k3c_ckpt_open(const char *dir, k3c_checkpoint **out, k3c_err *err);
void k3c_ckpt_close(k3c_checkpoint *c);
int k3c_ckpt_count(const k3c_checkpoint *c);
const k3c_st_tensor *k3c_ckpt_at(const k3c_checkpoint *c, int i);
const k3c_st_tensor *k3c_ckpt_find(const k3c_checkpoint *c, const char *name);

/* Copies a tensor to float / double, converting from any floating dtype; checks the element count. */
int k3c_st_read_f32(const k3c_st_tensor *t, float *dst, size_t n, k3c_err *err);
int k3c_st_read_f64(const k3c_st_tensor *t, double *dst, size_t n, k3c_err *err);
/* Reads the I32 tensor `name` of shape [B, T] or [T] (B = 1) of a safetensors file into a malloc'd copy (free()). */
int k3c_st_read_ids(const char *path, const char *name, int32_t **ids, int64_t *B, int64_t *T, k3c_err *err);

typedef struct {
    const char *name;
    k3c_dtype dtype;
    int ndim;
    int64_t shape[K3C_MAX_DIMS];
    const void *data;
} k3c_st_entry;
/* Writes one safetensors file atomically. meta: NULL or alternating key, value strings ending with NULL. */
int k3c_st_write(const char *path, const k3c_st_entry *entries, int n, const char *const *meta, k3c_err *err);

/* ---------------------------------------------------------------- config (docs/FORMATS.md §2–4) */
#define K3C_MAX_LAYERS 512

typedef enum { K3C_MIXER_KDA = 0, K3C_MIXER_MLA = 1 } k3c_mixer;
typedef enum { K3C_FFN_DENSE = 0, K3C_FFN_MOE = 1 } k3c_ffn;
typedef enum { K3C_ACT_SILU = 0, K3C_ACT_SITU = 1, K3C_ACT_GELU = 2 } k3c_act; /* SwiGLU, SiTU-GLU, GeGLU */
typedef enum { K3C_GATE_SOFTPLUS = 0, K3C_GATE_LOWER_BOUND = 1 } k3c_kda_gate;

typedef struct {
    int present;
    int64_t patch_size, hidden, intermediate, heads, layers, qkv_hidden;
    int64_t mm_hidden, text_hidden, merge_kernel[2];
    int64_t pos_emb_h, pos_emb_w, pos_emb_t;
    double ln_eps;
    int interp;           /* pos_emb_interpolation_mode: K3C_VISION_BILINEAR (the release) or K3C_VISION_BICUBIC */
    int64_t media_pad_id; /* top-level media_placeholder_token_id (<|media_pad|>), -1 if absent */
} k3c_vision_config;
enum { K3C_VISION_BILINEAR = 0, K3C_VISION_BICUBIC = 1 };

typedef struct {
    char model_type[32];    /* "kimi_linear" or "kimi_k3" (the top-level type) */
    char tensor_prefix[32]; /* "" (kimi_linear) or "language_model." (kimi_k3) */
    int64_t vocab_size, hidden_size, num_layers, intermediate_size, max_positions;
    int64_t bos_token_id, eos_token_id, pad_token_id; /* -1 if absent */
    double rms_norm_eps;
    double mla_norm_eps; /* q_a / kv_a layernorm: 1e-6 for kimi_linear, rms_norm_eps for kimi_k3 */
    int tie_word_embeddings;

    /* layer plan: one entry per decoder layer */
    uint8_t mixer[K3C_MAX_LAYERS]; /* k3c_mixer */
    uint8_t ffn[K3C_MAX_LAYERS];   /* k3c_ffn */

    /* KDA */
    int64_t kda_heads, kda_head_dim, conv_kernel;
    int kda_gate;            /* k3c_kda_gate */
    double gate_lower_bound; /* g_min (e.g. -5) when kda_gate == LOWER_BOUND */
    int kda_full_rank_gate;  /* output gate: g_proj (1) or g_a_proj/g_b_proj (0) */

    /* MLA */
    int64_t mla_heads, mla_kv_heads, q_lora_rank /* 0 = single q_proj */, kv_lora_rank;
    int64_t qk_nope_dim, qk_rope_dim, v_head_dim;
    int mla_output_gate;

    /* MoE */
    int64_t num_experts, top_k, num_shared_experts, moe_intermediate_size;
    int64_t latent_dim; /* routed_expert_hidden_size; 0 = experts on the full width */
    int latent_norm;
    int renormalize;
    double routed_scaling_factor;
    int64_t num_expert_group, topk_group, first_k_dense, moe_layer_freq;

    /* activation */
    int act; /* k3c_act */
    double situ_beta, situ_linear_beta;

    /* Block AttnRes: block size in decoder layers, 0 = plain residuals */
    int64_t attn_res_block;

    /* quantization */
    int experts_mxfp4;
    int64_t mxfp4_group;

    k3c_vision_config vision;
} k3c_config;

/* Reads and validates <dir>/config.json (or a path to a .json file). */
int k3c_config_load(const char *path, k3c_config *cfg, k3c_err *err);
int k3c_config_parse(const char *json, size_t n, const char *name_for_errors, k3c_config *cfg, k3c_err *err);
/* Writes a kimi_linear / kimi_k3 config.json that k3c_config_load reads back to an equal struct. */
int k3c_config_save(const k3c_config *cfg, const char *path, k3c_err *err);
/* Checks internal consistency (dimensions positive, plan complete, ...). */
int k3c_config_validate(const k3c_config *cfg, const char *name_for_errors, k3c_err *err);
int k3c_config_num_mla(const k3c_config *cfg);
int k3c_config_num_moe(const k3c_config *cfg);
/* Appends cfg as config.json in the released spelling (what k3c_config_save writes); validates cfg first. */
int k3c_config_to_json(const k3c_config *cfg, k3c_sbuf *out, k3c_err *err);
/* The mixer plan ("KKKM KKKM M": K = KDA, M = MLA) or, with ffn set, the FFN plan ("DEEE ...": D = dense, E = MoE),
 * grouped in fours. Truncated with "..." when buf is too small. */
void k3c_config_plan_string(const k3c_config *cfg, int ffn, char *buf, size_t n);
/* The checkpoint tensors cfg names (docs/FORMATS.md §5), one call per tensor and routed expert: name, layer (-1:
 * global), shape as stored unquantised, and whether the release stores it as MXFP4 (weight_packed + weight_scale).
 * fn NULL: only *count. A non-zero return of fn stops the walk and is returned. */
typedef int (*k3c_tensor_fn)(void *ctx, const char *name, int layer, int ndim, const int64_t *shape, int mxfp4);
int k3c_config_tensors(const k3c_config *cfg, k3c_tensor_fn fn, void *ctx, int64_t *count, k3c_err *err);

/* ---------------------------------------------------------------- model (docs/MODEL.md §1, §3–§9)
 * A Kimi-Linear / Kimi-K3 model: config → layer plan → parameters under checkpoint names → forward to logits and loss →
 * backward to every parameter gradient. Every function exists for float32 (_f32) and float64 (_f64) parameters. */
typedef struct k3c_model k3c_model; /* defined in the library (src/model/model.h) */
/* A backend's op table (its memory, its ops: the CPU reference, or a device opened with k3c/device.h), by name only. */
struct k3c_backend_f32;
struct k3c_backend_f64;

/* The part of a model one rank holds (docs/PARALLEL.md "Residency"): the routed experts [expert0, expert0 + experts)
 * of every MoE layer (expert parallelism) and the layers [layer0, layer1), with the embedding when layer0 is 0 and the
 * output mix, final norm and lm_head when layer1 is the last (a pipeline stage). Every other parameter keeps its name
 * and shape but holds no elements here. With tp_size > 1 (tensor parallelism) every tensor the TP group splits holds
 * share tp_rank of tp_size only: its rows (heads, intermediate or vocabulary rows) or its columns (the row-parallel
 * projections). k3c_residency_whole: all of it (tp_size 0 or 1: whole tensors). */
typedef struct {
    int64_t expert0, experts;
    int layer0, layer1;
    int tp_rank, tp_size;
} k3c_residency;
k3c_residency k3c_residency_whole(const k3c_config *cfg);

/* A batch: T tokens packed as documents (cu_seqlens: n_docs + 1 offsets). targets[t] = the id to predict at t (−1 =
 * not counted); NULL targets = next token inside each document. */
typedef struct {
    int64_t T;
    int n_docs;
    const int32_t *ids;
    const int32_t *cu_seqlens;
    const int32_t *targets;
    double loss_norm; /* divisor of the summed loss (0 = the number of counted targets in this batch) */
    /* Optional input-embedding overrides (image tokens; docs/VISION.md "Prompt and merge"): the n_embeds rows of
       embeds [n_embeds, hidden] (host memory of the model's precision: float for _f32, double for _f64) replace the
       token embeddings at positions embed_pos[0..n_embeds) (strictly ascending, < T). The backward writes their
       gradient into d_embeds (host, same shape, overwritten; NULL = not needed) and adds nothing to the embedding
       table's rows for those positions. embed_pos and d_embeds must stay valid until the backward. */
    int64_t n_embeds;
    const int32_t *embed_pos;
    const void *embeds;
    void *d_embeds;
    /* Optional per-position loss weights, host [T] (NULL = all 1): loss = Σ_counted w_t · CE_t / divisor, and the
       backward scales each position's logit gradient by w_t (the RL update's −∂L/∂logp; docs/POST.md). */
    const float *weight;
} k3c_model_batch;

/* Per-step activations, planned up front from the batch shape (k3c_model_plan_bytes) and carved from one arena. */
typedef struct k3c_acts k3c_acts;

/* Creates a model with zeroed parameters (and gradients when with_grad). */
int k3c_model_create_f32(const k3c_config *cfg, int with_grad, k3c_model *m, k3c_err *err);
int k3c_model_create_f64(const k3c_config *cfg, int with_grad, k3c_model *m, k3c_err *err);
/* The same holding only the residency's part (expert and pipeline parallelism, k3c_params_build_resident): init
 * gives it the values the whole model's init does, load reads it and skips the rest, save writes only it. */
int k3c_model_create_resident_f32(const k3c_config *cfg, int with_grad, const k3c_residency *r, k3c_model *m,
                                  k3c_err *err);
int k3c_model_create_resident_f64(const k3c_config *cfg, int with_grad, const k3c_residency *r, k3c_model *m,
                                  k3c_err *err);
/* Random initialisation for training from scratch (seed; std = initializer_range). Writes w from the host: call
 * it (and k3c_model_load) before k3c_model_use_backend moves the model to a device. */
void k3c_model_init_f32(k3c_model *m, uint64_t seed, double std);
void k3c_model_init_f64(k3c_model *m, uint64_t seed, double std);
/* Loads every tensor of a checkpoint dir (F32/BF16/F16/F64; MXFP4 experts decoded exactly). Every parameter must
 * be present and every tensor known; mismatches are errors naming the tensor. */
int k3c_model_load_f32(k3c_model *m, const k3c_checkpoint *ck, k3c_err *err);
int k3c_model_load_f64(k3c_model *m, const k3c_checkpoint *ck, k3c_err *err);
/* Writes <dir>/model.safetensors (F32, checkpoint names, per-expert tensors) atomically. */
int k3c_model_save_f32(const k3c_model *m, const char *path, k3c_err *err);
int k3c_model_save_f64(const k3c_model *m, const char *path, k3c_err *err);
/* The same for the table entries [e0, e1) only (a pipeline stage's shard of a sharded checkpoint). */
int k3c_model_save_range_f32(const k3c_model *m, const char *path, int e0, int e1, k3c_err *err);
int k3c_model_save_range_f64(const k3c_model *m, const char *path, int e0, int e1, k3c_err *err);
/* The same; experts_only: the stacked routed-expert entries alone (the experts an EP rank holds). */
int k3c_model_save_entries_f32(const k3c_model *m, const char *path, int e0, int e1, int experts_only,
                               k3c_err *err);
int k3c_model_save_entries_f64(const k3c_model *m, const char *path, int e0, int e1, int experts_only,
                               k3c_err *err);
void k3c_model_free_f32(k3c_model *m);
void k3c_model_free_f64(k3c_model *m);
/* config.json + checkpoint of a directory → a loaded model. */
int k3c_model_open_f32(const char *dir, int with_grad, k3c_model *m, k3c_err *err);
int k3c_model_open_f64(const char *dir, int with_grad, k3c_model *m, k3c_err *err);
/* The same into a model of its own (for callers that know k3c_model by name only); free with k3c_model_close. */
int k3c_model_load_dir_f32(const char *dir, int with_grad, k3c_model **out, k3c_err *err);
int k3c_model_load_dir_f64(const char *dir, int with_grad, k3c_model **out, k3c_err *err);
void k3c_model_close_f32(k3c_model *m);
void k3c_model_close_f64(k3c_model *m);
/* The model's config, and the KDA implementation its forwards use: chunk 64 (the default) or 16, 0 = the token
 * recurrence. */
const k3c_config *k3c_model_config(const k3c_model *m);
void k3c_model_set_kda_chunk(k3c_model *m, int chunk);
/* Moves w and g into memory of backend `be` (a backend's table, e.g. k3c_cuda_open's; NULL = the CPU) and runs
 * every later forward and backward there. The host reads and writes them through be->download / be->upload. */
int k3c_model_use_backend_f32(k3c_model *m, const struct k3c_backend_f32 *be, k3c_err *err);
int k3c_model_use_backend_f64(k3c_model *m, const struct k3c_backend_f64 *be, k3c_err *err);
/* The backend the model runs on (its own, or the CPU reference of this precision). */
const struct k3c_backend_f32 *k3c_model_backend_f32(const k3c_model *m);
const struct k3c_backend_f64 *k3c_model_backend_f64(const k3c_model *m);
/* Copies bytes of the model's backend memory (e.g. the logits a forward returned) into host memory; waits for the
 * backend. */
int k3c_model_download_f32(const k3c_model *m, void *host_dst, const void *src, size_t bytes, k3c_err *err);
int k3c_model_download_f64(const k3c_model *m, void *host_dst, const void *src, size_t bytes, k3c_err *err);
/* An activation arena of `bytes` (k3c_model_plan_bytes or more) in the backend's memory; release it with
 * k3c_model_arena_free. */
int k3c_model_arena_init_f32(const k3c_model *m, size_t bytes, k3c_arena *a, k3c_err *err);
int k3c_model_arena_init_f64(const k3c_model *m, size_t bytes, k3c_arena *a, k3c_err *err);
void k3c_model_arena_free_f32(const k3c_model *m, k3c_arena *a);
void k3c_model_arena_free_f64(const k3c_model *m, k3c_arena *a);
/* Bytes of activations a forward+backward over T tokens needs. */
size_t k3c_model_plan_bytes_f32(const k3c_model *m, int64_t T, int n_docs);
size_t k3c_model_plan_bytes_f64(const k3c_model *m, int64_t T, int n_docs);
/* Forward to logits [T, V] (written to *logits_out if non-NULL, pointing into the arena) and the mean loss.
 * `arena` must hold k3c_model_plan_bytes; activations stay there for the backward. */
int k3c_model_forward_f32(k3c_model *m, const k3c_model_batch *b, k3c_arena *arena, k3c_acts **acts, double *loss,
                          float **logits_out, k3c_err *err);
int k3c_model_forward_f64(k3c_model *m, const k3c_model_batch *b, k3c_arena *arena, k3c_acts **acts, double *loss,
                          double **logits_out, k3c_err *err);
/* Backward of the loss of the last forward: ADDS every parameter gradient into m->g (dloss = 1 · scale). */
int k3c_model_backward_f32(k3c_model *m, k3c_acts *acts, double scale, k3c_err *err);
int k3c_model_backward_f64(k3c_model *m, k3c_acts *acts, double scale, k3c_err *err);

typedef struct k3c_vision k3c_vision; /* a vision tower (include/k3c/vision.h) */

/* ---------------------------------------------------------------- tokenizer (docs/FORMATS.md §8)
 * Byte-level BPE in the tiktoken format with a separate special-token table and the cl100k or Kimi pre-tokeniser.
 * A k3c_tok is read-only once loaded: any number of threads may encode and decode with it. */
typedef enum {
    K3C_TOK_PATTERN_KIMI = 0,   /* tokenization_kimi.py pat_str (K2, K3, Kimi Linear) */
    K3C_TOK_PATTERN_CL100K = 1, /* tiktoken cl100k_base (GPT-4) */
} k3c_tok_pattern;

int k3c_tok_pattern_parse(const char *name, k3c_tok_pattern *out); /* "kimi" / "cl100k"; 0 or K3C_EINVAL */
const char *k3c_tok_pattern_name(k3c_tok_pattern p);
typedef struct k3c_tok k3c_tok;

enum {
    /* ranks may have gaps and come in any order (default: line k holds rank k, as in every released file); the largest
     * rank may exceed the number of lines by at most 2^20 */
    K3C_TOK_LOAD_ALLOW_GAPS = 1,
};

/* Reads a tiktoken rank file (`base64(bytes) SP rank` per line; blank lines skipped). Errors name the file and line:
 * bad base64, empty token, missing or malformed rank, line without a space, duplicate token or rank, ranks out of order
 * (unless K3C_TOK_LOAD_ALLOW_GAPS), and a vocabulary missing one of the 256 single bytes. */
int k3c_tok_load(const char *path, k3c_tok_pattern pat, int flags, k3c_tok **out, k3c_err *err);
void k3c_tok_free(k3c_tok *t);
/* A vocabulary file plus the special tokens of its sidecar "<path>.specials.json" when that exists (what k3c_tok_save
 * writes); on failure *out is NULL. */
int k3c_tok_load_with_specials(const char *path, k3c_tok_pattern pat, int flags, k3c_tok **out, k3c_err *err);
/* The tokenizer a k3c model or checkpoint directory carries: K3C_TOK_DIR_VOCAB (+ its sidecar) pre-tokenised with the
 * pattern K3C_TOK_DIR_SPEC names ({"pattern": "cl100k" | "kimi"}; cl100k when the file is absent). pattern, when not
 * NULL, overrides the file. */
#define K3C_TOK_DIR_VOCAB "tiktoken.model"
#define K3C_TOK_DIR_SPEC "k3c_tokenizer.json"
int k3c_tok_load_dir(const char *dir, const char *pattern, k3c_tok **out, k3c_err *err);
int32_t k3c_tok_n_vocab(const k3c_tok *t); /* largest id (rank or special) + 1: the model's vocab size */
int32_t k3c_tok_special_id(const k3c_tok *t, const char *str); /* -1 if not a special token */
int k3c_tok_is_special(const k3c_tok *t, int32_t id);
/* The bytes of one id (rank or special); K3C_EINVAL for an unknown id. Useful for streaming decoders. */
int k3c_tok_token_bytes(const k3c_tok *t, int32_t id, const unsigned char **bytes, size_t *len, k3c_err *err);
/* A growable id list; zero-initialise, append with the encoders, release with k3c_tok_ids_free. */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} k3c_tok_ids;
void k3c_tok_ids_free(k3c_tok_ids *v);
int k3c_tok_ids_push(k3c_tok_ids *v, int32_t id);

enum {
    K3C_TOK_ALLOW_SPECIAL = 1, /* special-token spellings in the text become their ids (else they are plain text) */
    K3C_TOK_NO_CHUNKING = 2,   /* plain tiktoken: ignore the release chunking even when it is on */
    K3C_TOK_STRICT_UTF8 = 4,   /* refuse text that is not valid UTF-8: K3C_EFORMAT naming the first bad byte's offset */
};

/* Appends the ids of text[0..n) to out. Memory is bounded whatever the text: a pre-token longer than 1 MiB is merged
 * in stretches cut where no token can span, which gives exactly the ids of merging it whole; only a piece with no such
 * place in 1 MiB (megabytes of one repeated character) is cut regardless. Invalid UTF-8 is encoded byte by byte
 * unless K3C_TOK_STRICT_UTF8; k3c_utf8_check finds it first for callers that want to warn. */
int k3c_tok_encode(const k3c_tok *t, const void *text, size_t n, int flags, k3c_tok_ids *out, k3c_err *err);
/* The exact bytes of ids in a new malloc'd buffer (*len bytes plus a NUL for convenience; free with free()). Unknown
 * ids are K3C_EINVAL naming the id and its position. */
int k3c_tok_decode(const k3c_tok *t, const int32_t *ids, size_t n, char **bytes, size_t *len, k3c_err *err);

/* ---------------------------------------------------------------- generation */
#define K3C_MAX_LOGPROBS 20 /* top alternatives a sampled token can report (OpenAI's limit) */

/* Next-token choice from logits with a counter-based random stream, so a (seed, position) pair always draws the same
 * token. Order (as Hugging Face's processors): penalties, then greedy (temperature 0) or temperature → top-k → top-p →
 * min-p → draw. Every field after `seed` means "off" when zero. */
typedef struct {
    double temperature; /* 0 = greedy */
    double top_p;       /* 1 = no nucleus cut */
    uint64_t seed;
    int64_t top_k;             /* keep the k most likely tokens; 0 = off */
    double min_p;              /* keep tokens at least min_p × as likely as the most likely; 0 = off */
    double repetition_penalty; /* HF: each id seen in the prompt or the output, once: logit > 0 ? logit / r : logit · r;
                                  0 or 1 = off */
    double presence_penalty; /* OpenAI, over the OUTPUT ids: logit −= presence · [count > 0] + frequency · count */
    double frequency_penalty;
    int logprobs; /* report the log-probabilities of this many most likely tokens (0..K3C_MAX_LOGPROBS) */
} k3c_sampler;

/* The ids a sequence has seen, for the penalties. */
typedef struct {
    const int32_t *prompt;
    int64_t n_prompt;
    const int32_t *output;
    int64_t n_output;
} k3c_history;

/* A sampled token with its log-probability and the top alternatives, all under the model's raw distribution
 * (log-softmax of the logits before penalties and temperature, as vLLM reports them). */
typedef struct {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_id[K3C_MAX_LOGPROBS];
    float top_logprob[K3C_MAX_LOGPROBS];
} k3c_sampled;

/* Picks a token id from logits[V] without history (no penalties); `position` selects the random draw.
 * work: V floats + V ints of scratch. */
int32_t k3c_sample(const k3c_sampler *s, const float *logits, int64_t V, uint64_t position, float *work_p,
                   int32_t *work_idx);
/* Bytes of scratch k3c_sample_seq needs for a vocabulary of V. */
size_t k3c_sample_workspace(int64_t V);
/* Picks a token id with every setting of s; h (may be NULL) feeds the penalties; out (may be NULL) receives the
 * logprobs. ws: k3c_sample_workspace(V) bytes, 4-aligned. */
int32_t k3c_sample_seq(const k3c_sampler *s, const float *logits, int64_t V, uint64_t position, const k3c_history *h,
                       k3c_sampled *out, void *ws);
/* K3C_EINVAL naming the first setting out of range. */
int k3c_sampler_check(const k3c_sampler *s, k3c_err *err);

/* A model opened for serving: the checkpoint's weights as stored, nothing converted (docs/ENGINE.md "Weights"). */
typedef struct k3c_weights k3c_weights; /* weight views (src/serve/weights.h) */
typedef struct {
    k3c_weights *weights; /* the safetensors mmap'd read-only: bf16 / float32 matrices and MXFP4 experts as views into
                             the files, or their copy in a device's memory (k3c_serve_use_backend) */
    k3c_tok *tok;         /* the directory's tokenizer (k3c_tok_load_dir), or NULL when not asked for */
    k3c_vision *vision;   /* float32 vision tower + projector when config.json has a vision_config, else NULL */
} k3c_serve;

/* Opens <dir>: config.json + checkpoint (one file or an index + shards, verified against checksums.json where the
 * trainer wrote one) and, when with_tok, the tokenizer (pattern NULL: the one k3c_tokenizer.json names). On failure
 * nothing stays open. */
int k3c_serve_open(const char *dir, int with_tok, const char *pattern, k3c_serve *s, k3c_err *err);
/* Moves the weights into the memory of backend (NULL or the CPU's: they stay where they are) as stored, bf16 and MXFP4 included, and releases the host mapping; the engine then runs there. */
int k3c_serve_use_backend(k3c_serve *s, const struct k3c_backend_f32 *backend, k3c_err *err);
void k3c_serve_close(k3c_serve *s);
/* The config the weights were built for. */
const k3c_config *k3c_weights_config(const k3c_weights *w);
/* Bytes of backend memory an uploaded copy holds (0 for weights mmap'd on the host). */
size_t k3c_weights_device_bytes(const k3c_weights *w);

/* Called with every generated id (i counts from 0); a non-zero return stops the generation (not an error). */
typedef int (*k3c_token_fn)(void *ctx, int32_t id, int64_t i);
/* The same with the token's logprob and top alternatives (sampler.logprobs of them). */
typedef int (*k3c_sampled_fn)(void *ctx, const k3c_sampled *t, int64_t i);

typedef struct {
    k3c_sampler sampler;
    int64_t max_new;       /* ids to generate at most */
    int32_t stop_id;       /* -1: none; else generation ends once it is sampled (it is appended, not passed on) */
    k3c_token_fn on_token; /* NULL: no streaming */
    void *ctx;
    k3c_sampled_fn on_sampled; /* NULL, or called instead of on_token */
} k3c_gen_opts;

/* Appends up to o->max_new sampled ids to the prompt on the inference engine (prefill, then one decode step per token
 * over the kept state), wherever the weights live: seq holds n_prompt ids and has room for n_prompt + max_new;
 * *n_seq receives the final length. Sample draws are keyed by position, so a (seed, prompt) pair always gives the same
 * continuation. */
int k3c_generate(const k3c_weights *w, int32_t *seq, int64_t n_prompt, const k3c_gen_opts *o, int64_t *n_seq,
                 k3c_err *err);
/* The same over the parameters of a float32 model on any backend (views; the model being trained, e.g. an RL policy). */
int k3c_model_generate(const k3c_model *m, int32_t *seq, int64_t n_prompt, const k3c_gen_opts *o, int64_t *n_seq,
                       k3c_err *err);

#ifdef __cplusplus
}
#endif
#endif
