/* k3c/vision.h — the public API of the vision tower: MoonViT-V2 + patchmergerv2 (create, load,
 * forward / backward, save), image decoding and preprocessing, image prompts and targets, image-text training data and
 * `k3c vision train`. docs/VISION.md. */
#ifndef K3C_VISION_H
#define K3C_VISION_H

#include "k3c.h"
#include "k3c/train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- vision (docs/VISION.md)
 * The MoonViT-V2 tower and patchmergerv2 projector of a kimi_k3 checkpoint (vision_config, tensors vision_tower.* and
 * mm_projector.*): packed pixel patches → merged tokens [N, 4·D] → image embeddings [N, text hidden]. */
typedef struct {
    int64_t t, h, w; /* frames, patch rows, patch columns of one packed item (an int64 [n, 3] grid_thws row) */
} k3c_grid_thw;
typedef struct k3c_vision_acts_f32 k3c_vision_acts_f32;
typedef struct k3c_vision_acts_f64 k3c_vision_acts_f64;

/* Patches of n packed items (Σ t·h·w), or −1 with err filled if an entry is not positive. */
int64_t k3c_grid_tokens(const k3c_grid_thw *g, int n, k3c_err *err);
/* Merged tokens (Σ (h/kh)(w/kw), frames pooled), or −1 if an item's grid is not a multiple of the merge kernel. */
int64_t k3c_vision_merged_tokens(const k3c_vision_config *vc, const k3c_grid_thw *g, int n, k3c_err *err);

/* A tower with zeroed parameters (and gradients when with_grad) for vc (vc->present). */
int k3c_vision_create_f32(const k3c_vision_config *vc, int with_grad, k3c_vision **out, k3c_err *err);
int k3c_vision_create_f64(const k3c_vision_config *vc, int with_grad, k3c_vision **out, k3c_err *err);
/* Random initialisation for training from scratch: matrices truncated normal with std √(2/fan_in) (the
 * release's MLP2 / projector init), the position table standard normal, norm weights 1. */
void k3c_vision_init_f32(k3c_vision *v, uint64_t seed);
void k3c_vision_init_f64(k3c_vision *v, uint64_t seed);
/* Loads every vision_tower.* / mm_projector.* tensor of a checkpoint (any float dtype); a missing, misshapen or
 * unknown vision tensor is an error naming it. Text tensors are ignored. */
int k3c_vision_load_f32(k3c_vision *v, const k3c_checkpoint *ck, k3c_err *err);
int k3c_vision_load_f64(k3c_vision *v, const k3c_checkpoint *ck, k3c_err *err);
/* Moves the parameters (and gradients) into backend `be`'s memory (a backend's table;
 * NULL = the CPU) and runs every later forward and backward there; init and load come first. Afterwards the
 * forward's merged / embeds pointers and k3c_vision_weights / _grads are that backend's memory. */
int k3c_vision_use_backend_f32(k3c_vision *v, const struct k3c_backend_f32 *be, k3c_err *err);
int k3c_vision_use_backend_f64(k3c_vision *v, const struct k3c_backend_f64 *be, k3c_err *err);
/* <dir>/config.json (its vision_config) + the checkpoint's vision tensors. */
int k3c_vision_open_f32(const char *dir, int with_grad, k3c_vision **out, k3c_err *err);
int k3c_vision_open_f64(const char *dir, int with_grad, k3c_vision **out, k3c_err *err);
/* Forward of packed items: pixels [L, 3, p, p] (L = k3c_grid_tokens) → *acts (every stage, for the backward;
 * free with k3c_vision_acts_free). merged / embeds (may be NULL) get [N, 4·D] / [N, E] pointers into it. */
int k3c_vision_forward_f32(const k3c_vision *v, const float *pixels, const k3c_grid_thw *g, int n,
                           k3c_vision_acts_f32 **acts, const float **merged, const float **embeds, int64_t *N,
                           k3c_err *err);
int k3c_vision_forward_f64(const k3c_vision *v, const double *pixels, const k3c_grid_thw *g, int n,
                           k3c_vision_acts_f64 **acts, const double **merged, const double **embeds, int64_t *N,
                           k3c_err *err);
/* Backward of a forward given d_embeds [N, E]: ADDS every parameter gradient into the tower's gradients and,
 * when d_pixels is not NULL, the pixel gradient into d_pixels [L, 3·p·p]. */
int k3c_vision_backward_f32(k3c_vision *v, const k3c_vision_acts_f32 *acts, const float *d_embeds, float *d_pixels,
                            k3c_err *err);
int k3c_vision_backward_f64(k3c_vision *v, const k3c_vision_acts_f64 *acts, const double *d_embeds, double *d_pixels,
                            k3c_err *err);
void k3c_vision_acts_free_f32(k3c_vision_acts_f32 *acts);
void k3c_vision_acts_free_f64(k3c_vision_acts_f64 *acts);
void k3c_vision_free(k3c_vision *v);
/* The tower's tensors (release names, the tower's precision) as one safetensors file, written atomically (a tower on
 * a device is downloaded first). */
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
 * by summed log-probability. Weights are written back to dir (model.safetensors, vision.safetensors, index). Every
 * step's op runs on the backend, the update through the step's tail of the trainer (docs/TRAINING.md). */
typedef struct {
    const char *dir, *data, *eval;
    int64_t steps, batch, max_tokens, eval_max; /* eval_max: eval samples scored at most (0 = all) */
    double lr, tower_lr, weight_decay, grad_clip;
    uint64_t seed;
    int log_every;
    FILE *log;                            /* progress lines (NULL: quiet) */
    const struct k3c_backend_f32 *backend; /* where the model and the tower train (k3c_device_backend; NULL: the CPU) */
} k3c_vtrain_opts;
typedef struct {
    double first_loss, last_loss, accuracy, chance, train_s, eval_s;
    int64_t n_train, n_eval, bad_train, bad_eval, tokens;
} k3c_vtrain_result;
int k3c_vision_train(const k3c_vtrain_opts *o, k3c_vtrain_result *res, k3c_err *err);

#ifdef __cplusplus
}
#endif
#endif
