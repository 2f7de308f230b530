/* encode.c — `k3c vision encode` as a library call: packed pixels and grid_thws from a safetensors file through the
 * float32 tower and projector, merged tokens and image embeddings written as a safetensors file.
 * Spec: docs/VISION.md "Command". */
#include "vision/vision.h"

#include <stdlib.h>
#include <string.h>

/* grid_thws: I64 or I32 [n, 3]. */
static int read_grid(const k3c_safetensors *st, const char *path, const char *name, k3c_grid_thw **g, int *n,
                     k3c_err *err) {
    const k3c_st_tensor *t = k3c_st_find(st, name);
    if (!t) return k3c_errf(err, K3C_ENOTFOUND, "%s: no tensor '%s' (the grid)", path, name);
    if ((t->dtype != K3C_I64 && t->dtype != K3C_I32) || t->ndim != 2 || t->shape[1] != 3 || t->shape[0] < 1 ||
        t->shape[0] > (1 << 20))
        return k3c_errf(err, K3C_EFORMAT, "%s: tensor '%s' must be I64 or I32 [n, 3] (t, h, w per item)", path, name);
    *n = (int)t->shape[0];
    *g = malloc((size_t)*n * sizeof **g);
    if (!*g) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    for (int i = 0; i < *n * 3; i++) {
        int64_t x = t->dtype == K3C_I64 ? ((const int64_t *)t->data)[i] : ((const int32_t *)t->data)[i];
        (&(*g)[i / 3].t)[i % 3] = x;
    }
    return K3C_OK;
}

/* pixels: any float dtype, [L, 3, p, p] or [L, 3·p·p], L = the grid's patches. */
static int read_pixels(const k3c_safetensors *st, const char *path, const char *name, int64_t L, int64_t p, float **px,
                       k3c_err *err) {
    const k3c_st_tensor *t = k3c_st_find(st, name);
    if (!t) return k3c_errf(err, K3C_ENOTFOUND, "%s: no tensor '%s' (the pixels)", path, name);
    int ok = t->ndim >= 1 && t->shape[0] == L;
    if (ok && t->ndim == 4)
        ok = t->shape[1] == 3 && t->shape[2] == p && t->shape[3] == p;
    else if (ok && t->ndim == 2)
        ok = t->shape[1] == 3 * p * p;
    else
        ok = 0;
    if (!ok)
        return k3c_errf(err, K3C_EFORMAT,
                        "%s: tensor '%s' must be [%lld, 3, %lld, %lld] (the grid's patches of the config's patch size)",
                        path, name, (long long)L, (long long)p, (long long)p);
    *px = malloc((size_t)(L * 3 * p * p) * sizeof **px);
    if (!*px) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    return k3c_st_read_f32(t, *px, (size_t)(L * 3 * p * p), err);
}

/* Runs v on packed pixels and writes merged, image_embeds (and, when given, the inputs) to out. */
static int encode_write(const k3c_vision *v, const float *px, const k3c_grid_thw *g, int n, int64_t L, const char *out,
                        int with_inputs, int64_t *N_out, k3c_err *err) {
    k3c_vision_acts_f32 *a = NULL;
    const float *merged = NULL, *embeds = NULL;
    int64_t N = 0, *grid = NULL;
    int rc = k3c_vision_forward_f32(v, px, g, n, &a, &merged, &embeds, &N, err);
    if (!rc && with_inputs && !(grid = malloc((size_t)n * 3 * sizeof *grid)))
        rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    if (!rc) {
        const int64_t p = v->cfg.patch_size;
        for (int i = 0; with_inputs && i < n; i++)
            grid[3 * i] = g[i].t, grid[3 * i + 1] = g[i].h, grid[3 * i + 2] = g[i].w;
        const k3c_st_entry ent[4] = {
            {"merged", K3C_F32, 2, {N, v->cfg.merge_kernel[0] * v->cfg.merge_kernel[1] * v->cfg.hidden}, merged},
            {"image_embeds", K3C_F32, 2, {N, v->cfg.text_hidden}, embeds},
            {"pixel_values", K3C_F32, 4, {L, 3, p, p}, px},
            {"grid_thws", K3C_I64, 2, {n, 3}, grid},
        };
        rc = k3c_st_write(out, ent, with_inputs ? 4 : 2, NULL, err);
    }
    if (!rc && N_out) *N_out = N;
    free(grid);
    k3c_vision_acts_free_f32(a);
    return rc;
}

int k3c_vision_encode_file(const char *model_dir, const char *input, const char *pixels_name, const char *grid_name,
                           const char *out, int64_t *N_out, k3c_err *err) {
    k3c_vision *v = NULL;
    k3c_safetensors *st = NULL;
    k3c_grid_thw *g = NULL;
    float *px = NULL;
    int n = 0;
    int64_t L = 0;
    int rc = k3c_vision_open_f32(model_dir, 0, &v, err);
    if (!rc) rc = k3c_st_open(input, &st, err);
    if (!rc) rc = read_grid(st, input, grid_name, &g, &n, err);
    if (!rc && (L = k3c_grid_tokens(g, n, err)) < 0) rc = k3c_err_wrap(err, "%s: %s", input, grid_name);
    if (!rc) rc = read_pixels(st, input, pixels_name, L, v->cfg.patch_size, &px, err);
    if (!rc) rc = encode_write(v, px, g, n, L, out, 0, N_out, err);
    free(px);
    free(g);
    k3c_st_close(st);
    k3c_vision_free(v);
    return rc;
}

int k3c_vision_encode_images(const char *model_dir, const char *const *paths, int n, const k3c_media_cfg *mc,
                             const char *out, k3c_resize_plan *plans, k3c_image_size *sizes, k3c_err *err) {
    if (n < 1) return k3c_errf(err, K3C_EINVAL, "vision encode: no images");
    k3c_vision *v = NULL;
    k3c_grid_thw *g = calloc((size_t)n, sizeof *g);
    float **each = calloc((size_t)n, sizeof *each), *px = NULL;
    int64_t L = 0;
    int rc = !g || !each ? k3c_errf(err, K3C_ENOMEM, "out of memory") : k3c_vision_open_f32(model_dir, 0, &v, err);
    k3c_media_cfg c = mc ? *mc : k3c_media_cfg_default();
    if (!rc) c.patch_size = v->cfg.patch_size, c.merge = v->cfg.merge_kernel[0];
    for (int i = 0; i < n && !rc; i++) { /* each image alone: decode, resize, patchify */
        k3c_image im;
        rc = k3c_image_read(paths[i], &im, err);
        if (!rc && sizes) sizes[i] = (k3c_image_size){im.w, im.h};
        if (!rc && (rc = k3c_vision_preprocess(&c, &im, 1, &each[i], &g[i], plans ? &plans[i] : NULL, err)))
            k3c_err_wrap(err, "%s", paths[i]);
        k3c_image_free(&im);
        if (!rc) L += g[i].t * g[i].h * g[i].w;
    }
    const size_t per = (size_t)(3 * c.patch_size * c.patch_size);
    if (!rc && !(px = malloc((size_t)L * per * sizeof *px))) rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    for (int i = 0, off = 0; i < n && !rc; i++) { /* packed in order */
        const size_t k = (size_t)(g[i].t * g[i].h * g[i].w) * per;
        memcpy(px + off, each[i], k * sizeof *px);
        off += (int)k;
    }
    if (!rc) rc = encode_write(v, px, g, n, L, out, 1, NULL, err);
    for (int i = 0; each && i < n; i++) free(each[i]);
    free(each);
    free(px);
    free(g);
    k3c_vision_free(v);
    return rc;
}
