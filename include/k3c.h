/* k3c.h — the public API of libk3c, the Kimi-K3-class sparse MoE engine in C: errors, arena, safetensors and checkpoint
 * reading, the model config, the model (open / forward / backward / free), tokenizer, generation and training. */
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

/* ---------------------------------------------------------------- model (docs/MODEL.md §1, §3–§9)
 * A Kimi-Linear / Kimi-K3 model: config → layer plan → parameters under checkpoint names → forward to logits and loss →
 * backward to every parameter gradient. Every function exists for float32 (_f32) and float64 (_f64) parameters. */
typedef struct k3c_model k3c_model; /* defined in the library (src/model/model.h) */

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

#define K3C_MODEL_API(real, S)                                                                                              \
    /* Creates a model with zeroed parameters (and gradients when with_grad). */                                            \
    int k3c_model_create_##S(const k3c_config *cfg, int with_grad, k3c_model *m, k3c_err *err);                             \
    /* The same holding only the residency's part (expert and pipeline parallelism, k3c_params_build_resident): init      \
       gives it the values the whole model's init does, load reads it and skips the rest, save writes only it. */ \
    int k3c_model_create_resident_##S(const k3c_config *cfg, int with_grad, const k3c_residency *r, k3c_model *m,           \
                                      k3c_err *err);                                                                        \
    /* Random initialisation for training from scratch (seed; std = initializer_range). Writes w from the host: call   \
       it (and k3c_model_load) before k3c_model_use_backend moves the model to a device. */    \
    void k3c_model_init_##S(k3c_model *m, uint64_t seed, double std);                                                       \
    /* Loads every tensor of a checkpoint dir (F32/BF16/F16/F64; MXFP4 experts decoded exactly). Every parameter must   \
       be present and every tensor known; mismatches are errors naming the tensor. */   \
    int k3c_model_load_##S(k3c_model *m, const k3c_checkpoint *ck, k3c_err *err);                                           \
    /* Writes <dir>/model.safetensors (F32, checkpoint names, per-expert tensors) atomically. */                            \
    int k3c_model_save_##S(const k3c_model *m, const char *path, k3c_err *err);                                             \
    /* The same for the table entries [e0, e1) only (a pipeline stage's shard of a sharded checkpoint). */                  \
    int k3c_model_save_range_##S(const k3c_model *m, const char *path, int e0, int e1, k3c_err *err);                       \
    /* The same; experts_only: the stacked routed-expert entries alone (the experts an EP rank holds). */                   \
    int k3c_model_save_entries_##S(const k3c_model *m, const char *path, int e0, int e1, int experts_only,                  \
                                   k3c_err *err);                                                                           \
    void k3c_model_free_##S(k3c_model *m);                                                                                  \
    /* config.json + checkpoint of a directory → a loaded model. */                                                       \
    int k3c_model_open_##S(const char *dir, int with_grad, k3c_model *m, k3c_err *err);                                     \
    /* Moves w and g into memory of backend `be` (a const k3c_backend_##S *, ops/backend.h; NULL = the CPU) and runs \
       every later forward and backward there. The host reads and writes them through be->download / be->upload. */      \
    int k3c_model_use_backend_##S(k3c_model *m, const void *be, k3c_err *err);                                              \
    /* The backend the model runs on (its own, or the CPU reference of this precision). */                                  \
    const struct k3c_backend_##S *k3c_model_backend_##S(const k3c_model *m);                                                \
    /* Copies bytes of the model's backend memory (e.g. the logits a forward returned) into host memory; waits for the \
       backend. */    \
    int k3c_model_download_##S(const k3c_model *m, void *host_dst, const void *src, size_t bytes, k3c_err *err);            \
    /* An activation arena of `bytes` (k3c_model_plan_bytes or more) in the backend's memory; release it with         \
       k3c_model_arena_free. */     \
    int k3c_model_arena_init_##S(const k3c_model *m, size_t bytes, k3c_arena *a, k3c_err *err);                             \
    void k3c_model_arena_free_##S(const k3c_model *m, k3c_arena *a);                                                        \
    /* Bytes of activations a forward+backward over T tokens needs. */                                                      \
    size_t k3c_model_plan_bytes_##S(const k3c_model *m, int64_t T, int n_docs);                                             \
    /* Forward to logits [T, V] (written to *logits_out if non-NULL, pointing into the arena) and the mean loss.       \
       `arena` must hold k3c_model_plan_bytes; activations stay there for the backward. */    \
    int k3c_model_forward_##S(k3c_model *m, const k3c_model_batch *b, k3c_arena *arena, k3c_acts **acts, double *loss,      \
                              real **logits_out, k3c_err *err);                                                             \
    /* Backward of the loss of the last forward: ADDS every parameter gradient into m->g (dloss = 1 · scale). */           \
    int k3c_model_backward_##S(k3c_model *m, k3c_acts *acts, double scale, k3c_err *err);

K3C_MODEL_API(float, f32)
K3C_MODEL_API(double, f64)

/* ---------------------------------------------------------------- vision (docs/VISION.md)
 * The MoonViT-V2 tower and patchmergerv2 projector of a kimi_k3 checkpoint (vision_config, tensors vision_tower.* and
 * mm_projector.*): packed pixel patches → merged tokens [N, 4·D] → image embeddings [N, text hidden]. */
typedef struct {
    int64_t t, h, w; /* frames, patch rows, patch columns of one packed item (an int64 [n, 3] grid_thws row) */
} k3c_grid_thw;
typedef struct k3c_vision k3c_vision; /* parameters (src/vision/vision.h) */
typedef struct k3c_vision_acts_f32 k3c_vision_acts_f32;
typedef struct k3c_vision_acts_f64 k3c_vision_acts_f64;

/* Patches of n packed items (Σ t·h·w), or −1 with err filled if an entry is not positive. */
int64_t k3c_grid_tokens(const k3c_grid_thw *g, int n, k3c_err *err);
/* Merged tokens (Σ (h/kh)(w/kw), frames pooled), or −1 if an item's grid is not a multiple of the merge kernel. */
int64_t k3c_vision_merged_tokens(const k3c_vision_config *vc, const k3c_grid_thw *g, int n, k3c_err *err);

#define K3C_VISION_API(real, S)                                                                                           \
    /* A tower with zeroed parameters (and gradients when with_grad) for vc (vc->present). */                             \
    int k3c_vision_create_##S(const k3c_vision_config *vc, int with_grad, k3c_vision **out, k3c_err *err);                \
    /* Random initialisation for training from scratch: matrices truncated normal with std √(2/fan_in) (the           \
       release's MLP2 / projector init), the position table standard normal, norm weights 1. */ \
    void k3c_vision_init_##S(k3c_vision *v, uint64_t seed);                                                               \
    /* Loads every vision_tower.* / mm_projector.* tensor of a checkpoint (any float dtype); a missing, misshapen or   \
       unknown vision tensor is an error naming it. Text tensors are ignored. */  \
    int k3c_vision_load_##S(k3c_vision *v, const k3c_checkpoint *ck, k3c_err *err);                                       \
    /* Moves the parameters (and gradients) into backend `be`'s memory (a const k3c_backend_##S *, ops/backend.h;      \
       NULL = the CPU) and runs every later forward and backward there; init and load come first. Afterwards the    \
       forward's merged / embeds pointers and k3c_vision_weights / _grads are that backend's memory. */  \
    int k3c_vision_use_backend_##S(k3c_vision *v, const void *be, k3c_err *err);                                          \
    /* <dir>/config.json (its vision_config) + the checkpoint's vision tensors. */                                        \
    int k3c_vision_open_##S(const char *dir, int with_grad, k3c_vision **out, k3c_err *err);                              \
    /* Forward of packed items: pixels [L, 3, p, p] (L = k3c_grid_tokens) → *acts (every stage, for the backward;     \
       free with k3c_vision_acts_free). merged / embeds (may be NULL) get [N, 4·D] / [N, E] pointers into it. */ \
    int k3c_vision_forward_##S(const k3c_vision *v, const real *pixels, const k3c_grid_thw *g, int n,                     \
                               k3c_vision_acts_##S **acts, const real **merged, const real **embeds, int64_t *N,          \
                               k3c_err *err);                                                                             \
    /* Backward of a forward given d_embeds [N, E]: ADDS every parameter gradient into the tower's gradients and,     \
       when d_pixels is not NULL, the pixel gradient into d_pixels [L, 3·p·p]. */   \
    int k3c_vision_backward_##S(k3c_vision *v, const k3c_vision_acts_##S *acts, const real *d_embeds, real *d_pixels,     \
                                k3c_err *err);                                                                            \
    void k3c_vision_acts_free_##S(k3c_vision_acts_##S *acts);

K3C_VISION_API(float, f32)
K3C_VISION_API(double, f64)
void k3c_vision_free(k3c_vision *v);
/* The tower's tensors (release names, the tower's precision) as one safetensors file, written atomically. */
int k3c_vision_save(const k3c_vision *v, const char *path, k3c_err *err);
/* Beside a text model saved as <dir>/model.safetensors: <dir>/vision.safetensors and a model.safetensors.index.json
 * naming both, so the directory opens as one checkpoint (text model, tower and projector). */
int k3c_vision_save_beside(const k3c_vision *v, const char *dir, k3c_err *err);
/* Images: 8-bit RGB, rows top to bottom (h × w × 3). Decoding matches Pillow's open(...).convert("RGB"): palettes and
 * gray expanded, alpha dropped, 16-bit samples cut to their high byte; CMYK JPEGs are refused. */
typedef struct {
    int w, h;
    uint8_t *rgb;
} k3c_image;
int k3c_image_read(const char *path, k3c_image *img, k3c_err *err);                               /* PNG or JPEG */
int k3c_image_decode(const void *data, size_t n, const char *name, k3c_image *img, k3c_err *err); /* from memory */
void k3c_image_free(k3c_image *img);
/* Pillow's Image.resize((w, h), BICUBIC) on 8-bit RGB, in its fixed-point arithmetic (docs/VISION.md). */
int k3c_image_resize_bicubic(const k3c_image *src, int w, int h, k3c_image *dst, k3c_err *err);

/* The media preprocessing settings (the release's media_proc_cfg; defaults: patch 14, merge 2, in_patch_limit 16384,
 * patch_limit_on_one_side 512, mean = std = 0.5). */
typedef struct {
    int64_t patch_size, merge, in_patch_limit, patch_limit_on_one_side;
    double mean[3], std[3];
} k3c_media_cfg;
k3c_media_cfg k3c_media_cfg_default(void);
/* The NaViT resize rule: the image is scaled (never up) so its patches fit in_patch_limit and each side fits
 * patch_limit_on_one_side patches, then padded right / bottom to multiples of patch × merge. */
typedef struct {
    int new_w, new_h, pad_w, pad_h; /* resized size, then zero padding */
    int64_t grid_h, grid_w;         /* patch grid of the padded image */
    int64_t tokens;                 /* merged tokens = <|media_pad|> count */
} k3c_resize_plan;
int k3c_navit_resize(const k3c_media_cfg *c, int w, int h, k3c_resize_plan *plan, k3c_err *err);
/* Frames of one image (t = 1) or clip (equal sizes) → pixels [t·gh·gw, 3, p, p] (malloc'd, free()) normalised
 * (x/255 − mean)/std, frame-major then patch rows; *grid = (t, gh, gw); plan (may be NULL) the resize applied. */
int k3c_vision_preprocess(const k3c_media_cfg *c, const k3c_image *frames, int t, float **pixels, k3c_grid_thw *grid,
                          k3c_resize_plan *plan, k3c_err *err);

/* `k3c vision encode`: the float32 tower of model_dir on the pixels [L, 3, p, p] (any float dtype) and grid_thws
 * (I64 or I32 [n, 3]) tensors of `input`; writes `out` (atomically) with merged [N, 4·D] and image_embeds [N, E], F32. */
int k3c_vision_encode_file(const char *model_dir, const char *input, const char *pixels_name, const char *grid_name,
                           const char *out, int64_t *N_out, k3c_err *err);
/* The same from image files (PNG / JPEG), each preprocessed alone (mc NULL = the defaults, patch and merge from the
 * model) and packed in order; `out` also gets pixel_values and grid_thws. plans / sizes (may be NULL) receive each
 * image's resize and original size (for its prompt). */
typedef struct {
    int w, h;
} k3c_image_size;
int k3c_vision_encode_images(const char *model_dir, const char *const *paths, int n, const k3c_media_cfg *mc,
                             const char *out, k3c_resize_plan *plans, k3c_image_size *sizes, k3c_err *err);

/* Parameters of a tower (elements), and its parameters / gradients as the precision's reals (backend memory). */
size_t k3c_vision_param_count(const k3c_vision *v);
void *k3c_vision_weights(k3c_vision *v);
void *k3c_vision_grads(k3c_vision *v);

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

/* ---------------------------------------------------------------- image tokens (docs/VISION.md "Prompt and merge")
 * An image enters the prompt as <|media_begin|>image {W}x{H}<|media_content|> + N × <|media_pad|> + <|media_end|>,
 * W × H its original size, N its merged tokens (k3c_resize_plan.tokens); the N <|media_pad|> rows of the input
 * embeddings are replaced by the image embeddings in order (k3c_model_batch.n_embeds / embed_pos / embeds). */
int k3c_vision_image_prompt(int W, int H, int64_t n_tokens, char **out, size_t *len, k3c_err *err); /* malloc'd */
/* The same prompt tokenized (the four media specials must exist in tok), appended to out. */
int k3c_vision_image_ids(const k3c_tok *tok, int W, int H, int64_t n_tokens, k3c_tok_ids *out, k3c_err *err);
/* Positions t with ids[t] == pad_id written to pos (may be NULL to count); returns their number. */
int64_t k3c_vision_pad_positions(const int32_t *ids, int64_t T, int32_t pad_id, int32_t *pos);
/* Next-token targets inside each document (cu: n_docs + 1 offsets, NULL = one document) with no loss on image tokens:
 * −1 where the input or the target is pad_id, and at each document's last position. */
int k3c_vision_targets(const int32_t *ids, int64_t T, const int32_t *cu, int n_docs, int32_t pad_id, int32_t *targets,
                       k3c_err *err);

/* ---------------------------------------------------------------- image-text training (docs/VISION.md "Training data")
 * A JSONL line {"text": "...<image>...", "images": ["a.png", ...], "answer": "..."}: each <image> marker (in order)
 * becomes that image's prompt (paths relative to the JSONL file), "answer" (optional) follows the text and then alone
 * carries the loss; without it every text token does. Image tokens never carry loss. */
typedef struct {
    int32_t *ids, *targets; /* [n]: the sample's ids and next-token targets (-1: no loss) */
    int64_t n, answer_at;   /* answer_at: the answer's first id (0 when there is no answer) */
    int n_img;
    k3c_grid_thw *grid; /* [n_img] */
    float *pixels;      /* [n_patches, 3·p·p] every image's patches, in order */
    int64_t n_patches, n_img_tokens;
    char *answer; /* NULL when none */
} k3c_vsample;
typedef struct {
    k3c_vsample *s;
    size_t n;
    int n_bad;    /* lines skipped */
    char *report; /* "file:line: reason (line skipped)\n" per bad line, NULL when none */
} k3c_vdata;
/* Reads every line; a malformed line (bad JSON or field, marker count, missing / unreadable image, longer than
 * max_tokens) is reported and skipped; no usable line at all is an error. */
int k3c_vdata_load(const char *path, const k3c_tok *tok, const k3c_vision_config *vc, int64_t max_tokens,
                   k3c_vdata *out, k3c_err *err);
void k3c_vsample_free(k3c_vsample *s);
void k3c_vdata_free(k3c_vdata *d);

/* `k3c vision train`: the text model and the tower of `dir` (config.json with a vision_config, its tokenizer; weights
 * when present, else a seeded init) trained together on data, AdamW on the tower and the model's optimizer on the
 * model; held-out accuracy on eval (when given): each sample's answer against every distinct answer of the eval set,
 * by summed log-probability. Weights are written back to dir (model.safetensors, vision.safetensors, index). */
typedef struct {
    const char *dir, *data, *eval;
    int64_t steps, batch, max_tokens, eval_max; /* eval_max: eval samples scored at most (0 = all) */
    double lr, tower_lr, weight_decay, grad_clip;
    uint64_t seed;
    int log_every;
    FILE *log; /* progress lines (NULL: quiet) */
} k3c_vtrain_opts;
typedef struct {
    double first_loss, last_loss, accuracy, chance, train_s, eval_s;
    int64_t n_train, n_eval, bad_train, bad_eval, tokens;
} k3c_vtrain_result;
int k3c_vision_train(const k3c_vtrain_opts *o, k3c_vtrain_result *res, k3c_err *err);

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

/* A model opened for serving. */
typedef struct {
    k3c_model *model;   /* float32 weights, no gradients */
    k3c_tok *tok;       /* the directory's tokenizer (k3c_tok_load_dir), or NULL when not asked for */
    k3c_vision *vision; /* float32 vision tower + projector when config.json has a vision_config, else NULL */
} k3c_serve;

/* Opens <dir>: config.json + checkpoint and, when with_tok, the tokenizer (pattern NULL: the one k3c_tokenizer.json
 * names). On failure nothing stays open. */
int k3c_serve_open(const char *dir, int with_tok, const char *pattern, k3c_serve *s, k3c_err *err);
void k3c_serve_close(k3c_serve *s);

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

/* Appends up to o->max_new sampled ids to the prompt: seq holds n_prompt ids and has room for n_prompt + max_new;
 * *n_seq receives the final length. A float32 model on the CPU runs on the inference engine (prefill, then one
 * decode step per token over the kept state); a model on another backend recomputes the prefix per token. Sample
 * draws are keyed by position, so a (seed, prompt) pair always gives the same continuation. */
int k3c_generate(k3c_model *m, int32_t *seq, int64_t n_prompt, const k3c_gen_opts *o, int64_t *n_seq, k3c_err *err);

/* ---------------------------------------------------------------- inference engine (docs/ENGINE.md)
 * Continuous batching on the CPU: submitted sequences join between steps, each step runs one forward over a prompt
 * chunk or the last token of every active sequence (weight products batched over all rows, MoE rows grouped by
 * expert), samples each with its own settings, and finished sequences leave. Per sequence the engine keeps the decode
 * state (KDA recurrent state and conv tails, MLA latent cache); with snapshot_every it also keeps prefix snapshots of
 * that state, and a new prompt resumes from the longest snapshot that is a prefix of it. */
typedef struct k3c_engine k3c_engine;
typedef struct k3c_weights k3c_weights; /* weight views (src/serve/weights.h) */

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
    /* optimizer */
    char matrix_optimizer[16]; /* "muon" or "adamw" */
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

/* ---------------------------------------------------------------- post-training (docs/POST.md; TRAINING.md §3, §5)
 * Trajectories: JSONL conversations rendered through XTML (or the K2 envelope) to token ids with a loss mask that is 1
 * exactly on what the model writes (assistant reasoning, content, tool-call markup, end markers). */
typedef struct {
    int32_t *ids;
    uint8_t *mask; /* 1 = the model wrote this token (train on it), 0 = prompt / system / user / tool / observation */
    int64_t n;
    int64_t line; /* the JSONL line it came from (0 = not from a file) */
} k3c_traj;
void k3c_traj_free(k3c_traj *t);

typedef struct {
    int format;         /* k3c_chat_format: 0 = XTML (K3), 1 = K2 envelope (Kimi Linear) */
    int thinking;       /* XTML think channel on assistant turns (the line's own "options" may override) */
    int64_t max_tokens; /* a longer trajectory is a bad line (0 = no limit) */
} k3c_traj_opts;

typedef struct {
    k3c_traj *items;
    size_t n, cap;
    int64_t lines, bad; /* non-blank lines read, lines refused */
    char *report;       /* one "FILE:LINE: FIELD: REASON" line per refused line (NUL-terminated, may be NULL) */
    size_t report_len;
} k3c_traj_set;

/* Reads a JSONL file of conversations, one object per line: {"messages": [...], "tools": [...]?, "options": {...}?,
 * "id"?, "meta"?}. Messages are OpenAI-style (system / user / assistant with content, reasoning_content and
 * tool_calls / tool with tool_call_id) plus {"role": "state", "content": ...} snapshots (rendered as a system message
 * named "state", masked). A malformed line is reported in out->report (file, line, field, reason) and skipped, never
 * trained on; only an unreadable file or no usable line at all is an error. */
int k3c_traj_load_jsonl(const char *path, const k3c_tok *tok, const k3c_traj_opts *o, k3c_traj_set *out, k3c_err *err);
void k3c_traj_set_free(k3c_traj_set *s);

/* A packed SFT batch: whole trajectories laid end to end, each a document (cu_seqlens resets every sequence mixer),
 * targets[t] = ids[t+1] where the next token is in the same trajectory and masked 1, else -1. Feed it to the model
 * as a k3c_model_batch. */
typedef struct {
    int64_t T, cap;
    int n_docs, cap_docs;
    int32_t *ids, *targets, *cu_seqlens;
    int64_t n_counted; /* targets that are not -1 */
} k3c_packed;
/* Packs trajectories t[*next], t[*next+1], ... while they fit in seq_len tokens (at least one, which must fit:
 * K3C_EINVAL naming it otherwise), advancing *next (wrapping to 0 at the end). */
int k3c_traj_pack(const k3c_traj *t, size_t n, size_t *next, int64_t seq_len, k3c_packed *out, k3c_err *err);
void k3c_packed_free(k3c_packed *p);

/* Sandbox: untrusted code (a verifier's unit tests) in a separate process with a private temporary directory (removed
 * afterwards), rlimits (CPU seconds, address space, file size, process count, open files), a wall-clock timeout that
 * kills the whole process group, no network (a new network namespace; seccomp refuses sockets), writes and reads
 * confined to its directory plus the read-only system (Landlock), as user nobody when started as root (the kernel
 * exempts root from the process limit). Whatever the kernel refuses is left out and reported in `protections`. */
enum {
    K3C_SBX_TMPDIR = 1,
    K3C_SBX_RLIMITS = 2,
    K3C_SBX_TIMEOUT = 4,
    K3C_SBX_NETNS = 8,
    K3C_SBX_USERNS = 16,
    K3C_SBX_UID_DROP = 32,
    K3C_SBX_SECCOMP = 64,
    K3C_SBX_LANDLOCK = 128,
};
typedef struct {
    double cpu_s, wall_s; /* RLIMIT_CPU (whole seconds, at least 1) and the wall-clock timeout */
    int64_t mem_bytes;    /* RLIMIT_AS */
    int64_t fsize_bytes;  /* RLIMIT_FSIZE */
    int64_t nproc;        /* RLIMIT_NPROC */
    size_t max_output;    /* stdout + stderr bytes kept (0 = 64 KiB); the rest is drained and `truncated` set */
    char tmp_root[1024];  /* where the private directory is made ("" = /tmp) */
} k3c_sandbox_limits;
typedef struct {
    const char *name; /* a plain file name inside the sandbox directory */
    const char *content;
} k3c_sandbox_file;
typedef struct {
    int exited, exit_code, signal, timed_out, truncated;
    char *out; /* stdout and stderr interleaved, NUL-terminated */
    size_t out_len;
    double wall_s;
    unsigned protections; /* K3C_SBX_* actually in force */
} k3c_sandbox_result;
/* Runs argv (argv[0] an absolute path) in a fresh directory holding `files`, with stdin_text (NULL = empty, at most
 * 60,000 bytes) on standard input. Errors are about the host (directory, fork, exec); the program's own failure is
 * in the result. */
int k3c_sandbox_run(const k3c_sandbox_limits *l, const char *const argv[], const k3c_sandbox_file *files, int nfiles,
                    const char *stdin_text, k3c_sandbox_result *r, k3c_err *err);
void k3c_sandbox_result_free(k3c_sandbox_result *r);
/* "tmpdir rlimits timeout netns ..." */
void k3c_sandbox_protections_str(unsigned protections, char *buf, size_t n);

/* Verifiers: pure functions of (response, ground truth) giving a reward in [0, 1] = the weighted mean of named
 * components (TRAINING.md §5.2). */
#define K3C_REWARD_MAX_COMPONENTS 8
typedef struct {
    char name[24];
    double value, weight;
} k3c_reward_component;
typedef struct {
    double reward;
    int n;
    k3c_reward_component c[K3C_REWARD_MAX_COMPONENTS];
    char info[256]; /* why, in words ("3/5 tests", "call 1 (get_weather): $.units: expected one of [...]") */
} k3c_reward;
/* Appends a component and recomputes reward. */
void k3c_reward_add(k3c_reward *r, const char *name, double value, double weight);
/* Exact answer: the text after the last "####" (else after the last "answer:", else all of it), first line; numbers
 * compare by value ("1,234", "$5", "3.50", "1/2"; relative 1e-9), other strings after lower-casing, collapsing
 * whitespace and dropping final punctuation. Component "answer". */
void k3c_verify_answer(const char *response, const char *truth, k3c_reward *out);
/* Format validity of model output in XTML (what follows the generation prompt; in_think: the prompt opened the think
 * channel): "xtml" = it parses and the message is closed; "tool_args" = the fraction of tool calls naming a declared
 * tool whose arguments are an object matching its JSON schema (type, required, properties, additionalProperties,
 * enum, items); 1 when there are no calls. tools_json: the OpenAI tools array (NULL: none declared). Errors only for
 * malformed tools_json. */
int k3c_verify_format(const char *output, size_t n, const char *tools_json, int in_think, k3c_reward *out,
                      k3c_err *err);
/* Python `solution` run in the sandbox against cases_json = [[expression, expected repr], ...]: component "tests" =
 * fraction passed ("loads", weight 0: the solution executed). Results are read only from lines tagged with a nonce
 * (from nonce_seed) the harness reads before the solution runs. */
int k3c_verify_code(const char *solution, const char *cases_json, const k3c_sandbox_limits *l, uint64_t nonce_seed,
                    k3c_reward *out, k3c_err *err);

/* RL objectives (TRAINING.md §3): group-relative advantages and the clipped surrogate, on host arrays. */
#define K3C_RL_EPS_STD 1e-6 /* added to the group std (verl) */
/* Advantages of n_groups groups of G rewards (group-major): r − mean, divided by (std + 1e-6) when std_norm (GRPO;
 * std unbiased as torch.std in verl / TRL: [1, 0, 1, 0] → ±0.866) or not (Dr. GRPO). A group whose rewards are all
 * equal gets advantage 0 and keep[g] = 0 (dropped, DAPO dynamic sampling); a group of one: mean 0, std 1 (verl).
 * keep may be NULL. Returns the number of zero-variance groups. */
int k3c_rl_advantages(const double *rewards, int n_groups, int G, int std_norm, double *adv, uint8_t *keep);
/* DAPO overlong shaping added to a reward: 0 up to max_len − buffer, then linear down to −factor at max_len. */
double k3c_rl_overlong_penalty(int64_t len, int64_t max_len, int64_t buffer, double factor);
/* log p(y) and the entropy of softmax(logits[V]) in float64. */
void k3c_logp_entropy(const float *logits, int64_t V, int32_t y, double *logp, double *entropy);

typedef enum {
    K3C_RL_TOKEN_MEAN = 0, /* DAPO: Σ m l / Σ m over the batch */
    K3C_RL_SEQ_MEAN = 1,   /* GRPO: mean over sequences of each sequence's token mean */
    K3C_RL_CONST_NORM = 2, /* Dr. GRPO: Σ m l / (B · max_len) */
} k3c_rl_agg;
typedef struct {
    double eps_low, eps_high; /* clip(ρ, 1 − eps_low, 1 + eps_high); DAPO clip-higher: 0.2, 0.28 */
    double beta;              /* k3 KL to the reference (0 = none) */
    int agg;                  /* k3c_rl_agg */
    int64_t max_len;          /* K3C_RL_CONST_NORM's L_max */
} k3c_rl_loss_opts;
/* B sequences of tokens laid end to end: sequence i is [off[i], off[i+1]). Per token: log-probs of the sampled token
 * under the policy being trained, the rollout policy (π_old) and the frozen reference (NULL when beta = 0); mask 1 on
 * sampled tokens (0 on prompt and observation tokens). adv: one advantage per sequence. */
typedef struct {
    int B;
    const int64_t *off;
    const double *logp, *logp_old, *logp_ref;
    const uint8_t *mask;
    const double *adv;
} k3c_rl_tokens;
typedef struct {
    double loss;
    double kl;                  /* mean k3 estimate over masked tokens (also when beta = 0, if logp_ref given) */
    double clip_low, clip_high; /* fractions of masked tokens where the lower / upper clip took the gradient away */
    double ratio_mean;
    int64_t n_tokens; /* masked tokens */
} k3c_rl_loss_stats;
/* L = agg over tokens of −min(ρA, clip(ρ)A) + β·(e^{ref−logp} − (ref−logp) − 1), ρ = e^{logp − logp_old}, and
 * dlogp[k] = ∂L/∂logp[k] (NULL: not needed; 0 off the mask). The gradient w.r.t. token k's logits is
 * dlogp[k]·(onehot(y) − softmax): a cross-entropy backward with per-token weight −dlogp[k]. */
int k3c_rl_loss(const k3c_rl_tokens *t, const k3c_rl_loss_opts *o, double *dlogp, k3c_rl_loss_stats *s, k3c_err *err);

/* Environments (docs/POST.md "Environments"): tasks generated in C, deterministic by (seed, split, index), with
 * disjoint train (split 0) and held-out (split 1) sets. Kinds: "arith" (multi-step word problems, answer verifier),
 * "arith_tool" (the same with a calculator tool), "code" (Python string / list functions checked by unit tests in the
 * sandbox), "assistant" (simulated days with calendar, to-dos, notes and a clock; preferences revealed over time;
 * scored on the final state and milestones), "vfs" (goals in a virtual file system with list / read / write / delete
 * / run_check tools; scored on the artifact and key intermediate steps). */
typedef struct k3c_env k3c_env;
int k3c_env_new(const char *kind, uint64_t seed, int split, int64_t index, k3c_env **out, k3c_err *err);
void k3c_env_free(k3c_env *e);
const char *k3c_env_system(const k3c_env *e);
const char *k3c_env_user(const k3c_env *e);
const char *k3c_env_tools(const k3c_env *e); /* the OpenAI tools JSON array, NULL when the task has none */
/* [{"role":"system",...},{"role":"user",...}] as JSON text (malloc'd; NULL when out of memory). */
char *k3c_env_messages(const k3c_env *e);
/* Executes one tool call; *obs (malloc'd) is what the environment answers, "error: ..." for an unknown tool, bad
 * arguments or a call after the end (counted as a bad call, never an error of the rollout). */
int k3c_env_step(k3c_env *e, const char *tool, const char *args_json, char **obs, k3c_err *err);
int k3c_env_done(const k3c_env *e); /* the environment ended the episode (e.g. the last simulated day passed) */
/* Scores the episode from its state and the model's final answer text. */
void k3c_env_score(k3c_env *e, const char *final_answer, k3c_reward *out);
/* An expert solution as one SFT conversation {"messages": [system, user, expert turns...], "tools": [...]} (JSON
 * text, malloc'd), the format k3c_traj_load_jsonl reads. Does not change e. */
int k3c_env_reference(k3c_env *e, char **conversation, k3c_err *err);

/* SFT (`k3c sft --config RUN.json`): fine-tunes a k3c or Hugging Face checkpoint on JSONL trajectories with the loss on
 * the model's own tokens; checkpoints, resume, metrics and options as `k3c train` (k3c_train_opts). */
typedef struct {
    char path[1024];
    char init[1024];      /* checkpoint dir: config.json + safetensors (+ tokenizer unless `tokenizer` is given) */
    char tokenizer[1024]; /* "" = the init dir's tokenizer */
    char pattern[16];     /* "" = the tokenizer's own */
    char data[1024], val_data[1024], out_dir[1024];
    int format, thinking; /* k3c_traj_opts */
    int64_t seq_len, steps, warmup, log_every, eval_every, eval_batches, checkpoint_every, keep_checkpoints;
    double lr, min_lr_ratio;
    int schedule; /* "cosine" (default), "linear", "constant" */
    char matrix_optimizer[16];
    double weight_decay, beta1, beta2, eps, grad_clip;
    uint64_t seed;
    int kda_chunk, threads;
} k3c_sft_config;
/* Strict: unknown keys, a missing init / data / out_dir / steps, negative numbers are errors naming file and field;
 * relative paths are relative to the config file. */
int k3c_sft_config_load(const char *path, k3c_sft_config *c, k3c_err *err);
typedef struct {
    int64_t steps, n_traj, bad_lines;
    double first_loss, last_loss, last_val_loss, tokens_per_s, wall_s;
} k3c_sft_result;
int k3c_sft_run(const k3c_sft_config *c, const k3c_train_opts *o, k3c_sft_result *r, k3c_err *err);

/* Rollouts (RL): multi-turn episodes of a policy in an environment, in XTML. */
typedef struct {
    /* Appends at most max_new sampled ids to seq[0..n) (seq has room for n + max_new), stopping after `stop`;
     * *got = ids appended. */
    int (*generate)(void *ctx, int32_t *seq, int64_t n, int64_t max_new, int32_t stop, int64_t *got, k3c_err *err);
    void *ctx;
} k3c_policy;
/* The model sampling with k3c_generate (free with k3c_policy_free). */
int k3c_policy_from_model(k3c_model *m, const k3c_sampler *s, k3c_policy *out, k3c_err *err);
void k3c_policy_free(k3c_policy *p);
typedef struct {
    int max_turns;            /* assistant turns */
    int64_t max_tokens;       /* the whole episode (prompt + turns + observations) */
    int64_t max_new_per_turn; /* ids sampled per turn */
    int thinking;             /* XTML think channel in the generation prompts */
} k3c_rollout_opts;
typedef struct {
    int32_t *ids;  /* the episode as the model saw it: sampled ids exactly as sampled */
    uint8_t *mask; /* 1 on sampled ids, 0 on the prompt, tool results (observations) and generation prompts */
    float *logp;   /* the sampler's log-probability of each sampled id under the model's raw distribution
                      (k3c_rollout_batch on the engine); 0 elsewhere and from k3c_rollout's policy */
    int64_t n, cap, n_prompt;
    int32_t eos;
    int turns, tool_calls, format_ok_turns, format_valid, truncated;
    k3c_reward reward; /* the environment's score of the final state and answer */
    char info[256];    /* the first format problem, if any */
} k3c_episode;
/* Runs one episode: renders the environment's prompt (+ tools) with the generation prompt, then per turn samples up
 * to max_new_per_turn ids (stop: <|end_of_msg|>), parses them (XTML), and when the turn closed with tool calls, steps
 * the environment with each call and appends the tool messages and the next generation prompt with mask 0. It ends
 * on an answer without calls, an unparsable or unclosed turn, max_turns or max_tokens (truncated = 1), then scores. */
int k3c_rollout(k3c_env *env, const k3c_tok *tok, const k3c_policy *pol, const k3c_rollout_opts *o, k3c_episode *ep,
                k3c_err *err);
/* n episodes at once, envs[i] sampled with samplers[i], each exactly as k3c_rollout would run it: a float32 CPU model
 * decodes them together on one inference engine (continuous batching; a turn that ends with tool calls is answered
 * and the episode resubmitted, resuming from the engine's prefix snapshots) and records each sampled id's logprob;
 * on another backend they run one after another through k3c_generate. On failure no episode is left allocated. */
int k3c_rollout_batch(k3c_model *m, k3c_env *const *envs, const k3c_sampler *samplers, int n, const k3c_tok *tok,
                      const k3c_rollout_opts *o, int threads, k3c_episode *eps, k3c_err *err);
void k3c_episode_free(k3c_episode *ep);

/* RL (`k3c rl --config RUN.json`): per step, group_size rollouts of each of prompts_per_step training tasks of
 * environment `env` decoded together (k3c_rollout_batch), verifier rewards (+ DAPO overlong penalty), group-relative
 * advantages with zero-variance groups dropped, ppo_epochs clipped policy-gradient updates against π_old (+ the k3 KL
 * to the frozen init when beta > 0), each one weighted backward per sequence (k3c_model_batch.weight = −∂L/∂logp);
 * held-out evaluation with greedy decoding. */
typedef struct {
    char path[1024], init[1024], out_dir[1024], env[32];
    int64_t steps, prompts_per_step, group_size, max_tokens, max_new;
    int max_turns, thinking, std_norm; /* std_norm: "advantage": "grpo" (1, default) or "dr_grpo" (0) */
    int format_gate; /* "format_gate" (default true): an episode whose output is not valid XTML scores 0 */
    double temperature, top_p, lr, grad_clip, overlong_penalty;
    int64_t overlong_buffer, eval_every, eval_episodes, checkpoint_every, keep_checkpoints;
    k3c_rl_loss_opts loss; /* "loss_agg": token_mean (default) | seq_mean | const; eps_low, eps_high; beta >= 0 */
    int matrix_optimizer;  /* 0 muon, 1 adamw (default) */
    uint64_t seed;
    int kda_chunk, threads;
    int64_t ppo_epochs; /* policy updates per batch of rollouts (1 = on-policy) */
} k3c_rl_config;
int k3c_rl_config_load(const char *path, k3c_rl_config *c, k3c_err *err);
typedef struct {
    int64_t steps, episodes;
    double first_eval_reward, last_eval_reward, last_eval_format, last_train_reward, wall_s;
} k3c_rl_result;
int k3c_rl_run(const k3c_rl_config *c, const k3c_train_opts *o, k3c_rl_result *r, k3c_err *err);

#ifdef __cplusplus
}
#endif
#endif
