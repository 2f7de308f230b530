/* k3c.h — the one public header of k3c, the Kimi-K3-class sparse MoE engine in C.
 * Base services (errors, tensors, arena, rng, timing, progress), safetensors, and the model config (spec/CHECKPOINTS.md). */
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

/* ---------------------------------------------------------------- dtypes */
typedef enum { K3C_F64, K3C_F32, K3C_BF16, K3C_F16, K3C_I64, K3C_I32, K3C_U8, K3C_DTYPE_COUNT } k3c_dtype;

size_t k3c_dtype_size(k3c_dtype t);
const char *k3c_dtype_name(k3c_dtype t);               /* safetensors spelling: "F32", "BF16", ... */
int k3c_dtype_parse(const char *name, k3c_dtype *out); /* 0 or K3C_EFORMAT */

float k3c_bf16_to_f32(uint16_t h);
uint16_t k3c_f32_to_bf16(float f); /* round to nearest even; NaN stays NaN */
float k3c_f16_to_f32(uint16_t h);
uint16_t k3c_f32_to_f16(float f);
/* Converts n elements of any floating dtype (F64 F32 BF16 F16) to float / double. */
int k3c_convert_to_f32(k3c_dtype t, const void *src, float *dst, size_t n);
int k3c_convert_to_f64(k3c_dtype t, const void *src, double *dst, size_t n);

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
void *k3c_aligned_alloc(size_t bytes); /* 64-aligned, zeroed; free with k3c_aligned_free */
void k3c_aligned_free(void *p);

/* ---------------------------------------------------------------- rng
 * Counter-based (Philox-4x32-10): value i of stream `seed` is a pure function of (seed, i), so initialisation is
 * reproducible regardless of thread count and a checkpoint only needs (seed, counter). */
typedef struct {
    uint64_t seed;
    uint64_t counter;
} k3c_rng;

void k3c_philox(uint64_t seed, uint64_t counter, uint32_t out[4]);
uint64_t k3c_rng_u64(k3c_rng *r);
double k3c_rng_uniform(k3c_rng *r);               /* [0, 1) with 53 random bits */
double k3c_rng_normal(k3c_rng *r);                /* standard normal (Box-Muller on two uniforms) */
double k3c_uniform_at(uint64_t seed, uint64_t i); /* stateless: the i-th uniform of stream seed */
double k3c_normal_at(uint64_t seed, uint64_t i);

/* ---------------------------------------------------------------- threads, time, logging, progress */
int k3c_num_threads(void);
void k3c_set_num_threads(int n);
double k3c_now(void); /* monotonic seconds */

/* A one-line progress bar: "label [#####.....] 12/100 45.0 tok/s ETA 0:02:13 | extra". Silent unless `out` is a
 * terminal (or force is set); the last state is always available through k3c_progress_line. */
typedef struct {
    char label[32];
    int64_t total, done;
    double t0, last_draw;
    double units;          /* items counted for the rate (e.g. tokens) */
    const char *unit_name; /* e.g. "tok" */
    int enabled;
    FILE *out;
} k3c_progress;
void k3c_progress_init(k3c_progress *p, const char *label, int64_t total, const char *unit_name, FILE *out, int force);
void k3c_progress_update(k3c_progress *p, int64_t done, double units, const char *extra);
void k3c_progress_finish(k3c_progress *p, const char *extra);
int k3c_progress_line(const k3c_progress *p, const char *extra, char *buf, size_t n);

/* Atomic file writes: write to "<path>.tmp.<pid>", fsync, rename over path, fsync the directory. */
int k3c_write_file_atomic(const char *path, const void *data, size_t n, k3c_err *err);
/* Reads a whole file (NUL-terminated for convenience); free with free(). */
int k3c_read_file(const char *path, char **data, size_t *n, k3c_err *err);

/* ---------------------------------------------------------------- safetensors (spec/CHECKPOINTS.md §1.2) */
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

/* ---------------------------------------------------------------- config (spec/CHECKPOINTS.md §2–4) */
#define K3C_MAX_LAYERS 512

typedef enum { K3C_MIXER_KDA = 0, K3C_MIXER_MLA = 1 } k3c_mixer;
typedef enum { K3C_FFN_DENSE = 0, K3C_FFN_MOE = 1 } k3c_ffn;
typedef enum { K3C_ACT_SILU = 0, K3C_ACT_SITU = 1 } k3c_act;
typedef enum { K3C_GATE_SOFTPLUS = 0, K3C_GATE_LOWER_BOUND = 1 } k3c_kda_gate;

typedef struct {
    int present;
    int64_t patch_size, hidden, intermediate, heads, layers, qkv_hidden;
    int64_t mm_hidden, text_hidden, merge_kernel[2];
    int64_t pos_emb_h, pos_emb_w, pos_emb_t;
    double ln_eps;
} k3c_vision_config;

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

#ifdef __cplusplus
}
#endif
#endif
