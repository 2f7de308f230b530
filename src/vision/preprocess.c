/* preprocess.c — an RGB image (or the frames of a clip) to the tower's input: the release's NaViT resize rule (patch
 * limits, padding to multiples of patch × merge), Pillow's bicubic resampling in its 8-bit fixed-point form, zero
 * padding right and bottom, normalisation (x/255 − mean)/std and patchify. Spec: docs/VISION.md "Preprocessing". */
#include "base/base.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

k3c_media_cfg k3c_media_cfg_default(void) {
    k3c_media_cfg c = {14, 2, 16384, 512, {0.5, 0.5, 0.5}, {0.5, 0.5, 0.5}};
    return c;
}

int k3c_navit_resize(const k3c_media_cfg *c, int w, int h, k3c_resize_plan *r, k3c_err *err) {
    if (w <= 0 || h <= 0 || c->patch_size <= 0 || c->merge <= 0 || c->in_patch_limit <= 0 ||
        c->patch_limit_on_one_side <= 0)
        return k3c_errf(err, K3C_EINVAL, "navit resize: bad sizes (image %dx%d)", w, h);
    const int64_t p = c->patch_size, side = c->patch_limit_on_one_side * p, f = c->merge * p;
    const double pw = fmax(1.0, (double)(w / p)), ph = fmax(1.0, (double)(h / p));
    double scale = fmin(1.0, sqrt((double)c->in_patch_limit / (pw * ph)));
    scale = fmin(scale, fmin((double)side / w, (double)side / h));
    int64_t nw = (int64_t)(w * scale), nh = (int64_t)(h * scale);
    nw = nw < 1 ? 1 : nw > side ? side : nw;
    nh = nh < 1 ? 1 : nh > side ? side : nh;
    r->new_w = (int)nw;
    r->new_h = (int)nh;
    r->pad_w = (int)((f - nw % f) % f);
    r->pad_h = (int)((f - nh % f) % f);
    r->grid_h = (nh + r->pad_h) / p;
    r->grid_w = (nw + r->pad_w) / p;
    if (r->grid_h > c->patch_limit_on_one_side || r->grid_w > c->patch_limit_on_one_side)
        return k3c_errf(err, K3C_EINVAL, "navit resize: %dx%d gives a %lldx%lld patch grid beyond the side limit %lld",
                        w, h, (long long)r->grid_h, (long long)r->grid_w, (long long)c->patch_limit_on_one_side);
    r->tokens = (r->grid_h / c->merge) * (r->grid_w / c->merge);
    return K3C_OK;
}

/* ---------------------------------------------------------------- Pillow's bicubic (Resample.c, 8 bits per channel) */
#define PRECISION_BITS (32 - 8 - 2)

static double bicubic(double x) { /* a = −0.5 */
    const double a = -0.5;
    if (x < 0) x = -x;
    if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
    return 0;
}

/* Per output position: the first source index, the tap count, and fixed-point weights (ksize per position). */
static int coeffs(int in, int out, int **bounds, int **kk, k3c_err *err) {
    const double scale = (double)in / out, fscale = scale < 1 ? 1 : scale, support = 2 * fscale;
    const int ksize = (int)ceil(support) * 2 + 1;
    *bounds = malloc((size_t)out * 2 * sizeof **bounds);
    *kk = calloc((size_t)out * ksize, sizeof **kk);
    double *k = malloc((size_t)ksize * sizeof *k);
    if (!*bounds || !*kk || !k) {
        free(*bounds), free(*kk), free(k);
        *bounds = *kk = NULL;
        return k3c_errf(err, K3C_ENOMEM, "resize: out of memory"), -1;
    }
    for (int o = 0; o < out; o++) {
        const double center = (o + 0.5) * scale, ss = 1.0 / fscale;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        xmin = xmin < 0 ? 0 : xmin;
        xmax = (xmax > in ? in : xmax) - xmin;
        double ww = 0;
        for (int x = 0; x < xmax; x++) ww += k[x] = bicubic((x + xmin - center + 0.5) * ss);
        for (int x = 0; x < xmax; x++) {
            double v = ww != 0 ? k[x] / ww : k[x];
            (*kk)[o * ksize + x] =
                v < 0 ? (int)(-0.5 + v * (1 << PRECISION_BITS)) : (int)(0.5 + v * (1 << PRECISION_BITS));
        }
        (*bounds)[2 * o] = xmin;
        (*bounds)[2 * o + 1] = xmax;
    }
    free(k);
    return ksize;
}

static inline uint8_t clip8(int64_t v) {
    v >>= PRECISION_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

int k3c_image_resize_bicubic(const k3c_image *src, int w, int h, k3c_image *dst, k3c_err *err) {
    memset(dst, 0, sizeof *dst);
    if (w <= 0 || h <= 0 || !src->rgb) return k3c_errf(err, K3C_EINVAL, "resize: bad size %dx%d", w, h);
    int *bx = NULL, *kx = NULL, *by = NULL, *ky = NULL;
    const int ksx = coeffs(src->w, w, &bx, &kx, err), ksy = ksx < 0 ? -1 : coeffs(src->h, h, &by, &ky, err);
    /* horizontal pass over the source rows the vertical pass reads, then the vertical pass (Pillow's order) */
    const int y0 = ksy < 0 ? 0 : by[0], y1 = ksy < 0 ? 0 : by[2 * (h - 1)] + by[2 * (h - 1) + 1];
    uint8_t *tmp = ksy < 0 ? NULL : malloc((size_t)w * (y1 - y0) * 3), *out = tmp ? malloc((size_t)w * h * 3) : NULL;
    if (!out) {
        free(bx), free(kx), free(by), free(ky), free(tmp);
        return ksy < 0 ? err->code : k3c_errf(err, K3C_ENOMEM, "resize: out of memory");
    }
    for (int y = y0; y < y1; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++) {
                int64_t s = (int64_t)1 << (PRECISION_BITS - 1);
                for (int t = 0; t < bx[2 * x + 1]; t++)
                    s += (int64_t)src->rgb[((size_t)y * src->w + bx[2 * x] + t) * 3 + c] * kx[x * ksx + t];
                tmp[((size_t)(y - y0) * w + x) * 3 + c] = clip8(s);
            }
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++) {
                int64_t s = (int64_t)1 << (PRECISION_BITS - 1);
                for (int t = 0; t < by[2 * y + 1]; t++)
                    s += (int64_t)tmp[((size_t)(by[2 * y] - y0 + t) * w + x) * 3 + c] * ky[y * ksy + t];
                out[((size_t)y * w + x) * 3 + c] = clip8(s);
            }
    free(bx), free(kx), free(by), free(ky), free(tmp);
    dst->w = w;
    dst->h = h;
    dst->rgb = out;
    return K3C_OK;
}

/* ---------------------------------------------------------------- the whole pipeline */

/* Frame f of the clip, resized (when needed), padded with zeros, normalised and cut into patches at px. */
static void patchify(const k3c_media_cfg *c, const k3c_image *im, const k3c_resize_plan *r, float *px) {
    const int64_t p = c->patch_size, gw = r->grid_w;
    for (int64_t gy = 0; gy < r->grid_h; gy++)
        for (int64_t gx = 0; gx < gw; gx++)
            for (int ch = 0; ch < 3; ch++)
                for (int64_t dy = 0; dy < p; dy++)
                    for (int64_t dx = 0; dx < p; dx++) {
                        const int64_t y = gy * p + dy, x = gx * p + dx;
                        const int v = y < im->h && x < im->w ? im->rgb[((size_t)y * im->w + x) * 3 + ch] : 0;
                        /* rescaled to float32 first, as the release's processor does (bit-exact to its output) */
                        const float s = (float)v / 255.0f;
                        px[(((gy * gw + gx) * 3 + ch) * p + dy) * p + dx] =
                            (float)(((double)s - c->mean[ch]) / c->std[ch]);
                    }
}

int k3c_vision_preprocess(const k3c_media_cfg *c, const k3c_image *frames, int t, float **pixels, k3c_grid_thw *grid,
                          k3c_resize_plan *plan, k3c_err *err) {
    *pixels = NULL;
    if (t < 1) return k3c_errf(err, K3C_EINVAL, "preprocess: no frames");
    for (int f = 1; f < t; f++)
        if (frames[f].w != frames[0].w || frames[f].h != frames[0].h)
            return k3c_errf(err, K3C_EINVAL, "preprocess: frame %d is %dx%d, frame 0 is %dx%d", f, frames[f].w,
                            frames[f].h, frames[0].w, frames[0].h);
    k3c_resize_plan r;
    int rc = k3c_navit_resize(c, frames[0].w, frames[0].h, &r, err);
    if (rc) return rc;
    const size_t per = (size_t)(r.grid_h * r.grid_w * 3 * c->patch_size * c->patch_size);
    float *px = malloc(per * (size_t)t * sizeof *px);
    if (!px) return k3c_errf(err, K3C_ENOMEM, "preprocess: out of memory");
    for (int f = 0; f < t && !rc; f++) {
        k3c_image sized = frames[f];
        int own = r.new_w != frames[f].w || r.new_h != frames[f].h; /* Pillow copies an unchanged size as is */
        if (own && (rc = k3c_image_resize_bicubic(&frames[f], r.new_w, r.new_h, &sized, err))) break;
        patchify(c, &sized, &r, px + per * (size_t)f);
        if (own) k3c_image_free(&sized);
    }
    if (rc) {
        free(px);
        return rc;
    }
    *pixels = px;
    grid->t = t;
    grid->h = r.grid_h;
    grid->w = r.grid_w;
    if (plan) *plan = r;
    return K3C_OK;
}
