/* image.c — PNG (libpng) and JPEG (libjpeg-turbo) decoding to 8-bit RGB, as Pillow's Image.open(...).convert("RGB")
 * gives it: palettes and gray expanded, alpha dropped (not composited), 16-bit samples truncated to their high byte.
 * Spec: docs/VISION.md "Preprocessing". */
#include "base/base.h"

#include <jpeglib.h>
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIDE 65536 /* larger images are refused before any pixel memory is taken */
#define MAX_PIXELS ((int64_t)1 << 28)

static int check_size(const char *name, int64_t w, int64_t h, k3c_err *err) {
    if (w <= 0 || h <= 0 || w > MAX_SIDE || h > MAX_SIDE || w * h > MAX_PIXELS)
        return k3c_errf(err, K3C_EFORMAT, "%s: image size %lldx%lld outside 1 .. %d per side, %lld pixels", name,
                        (long long)w, (long long)h, MAX_SIDE, (long long)MAX_PIXELS);
    return K3C_OK;
}

/* ---------------------------------------------------------------- PNG */
typedef struct {
    const unsigned char *p;
    size_t n, off;
    char msg[200];
} png_src;

static void png_read_mem(png_structp png, png_bytep out, png_size_t n) {
    png_src *s = png_get_io_ptr(png);
    if (n > s->n - s->off) png_error(png, "truncated file");
    memcpy(out, s->p + s->off, n);
    s->off += n;
}

static void png_on_error(png_structp png, png_const_charp msg) {
    png_src *s = png_get_error_ptr(png);
    snprintf(s->msg, sizeof s->msg, "%s", msg);
    png_longjmp(png, 1);
}
static void png_on_warning(png_structp png, png_const_charp msg) { (void)png, (void)msg; }

static int decode_png(const unsigned char *data, size_t n, const char *name, k3c_image *img, k3c_err *err) {
    png_src src = {data, n, 0, ""};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error, png_on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    unsigned char *volatile rgba = NULL;
    png_bytep *volatile rows = NULL;
    if (!png || !info) {
        png_destroy_read_struct(png ? &png : NULL, NULL, NULL);
        return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", name);
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, NULL);
        free(rgba);
        free(rows);
        return k3c_errf(err, K3C_EFORMAT, "%s: bad PNG: %s", name, src.msg);
    }
    png_set_read_fn(png, &src, png_read_mem);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    if (check_size(name, w, h, err)) {
        png_destroy_read_struct(&png, &info, NULL);
        return err->code;
    }
    /* to 8-bit RGBA whatever the source: palette / low-bit gray expanded, 16 bits cut to the high byte */
    png_set_expand(png);
    png_set_strip_16(png);
    png_set_gray_to_rgb(png);
    png_set_add_alpha(png, 0xff, PNG_FILLER_AFTER);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)w * 4) png_error(png, "unexpected row layout after conversion");
    rgba = malloc((size_t)w * h * 4);
    rows = malloc(h * sizeof *rows);
    if (!rgba || !rows) png_error(png, "out of memory");
    for (png_uint_32 y = 0; y < h; y++) rows[y] = rgba + (size_t)y * w * 4;
    png_read_image(png, rows);
    png_destroy_read_struct(&png, &info, NULL);
    free(rows);
    img->w = (int)w;
    img->h = (int)h;
    img->rgb = malloc((size_t)w * h * 3);
    if (!img->rgb) {
        free(rgba);
        return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", name);
    }
    for (size_t i = 0; i < (size_t)w * h; i++) memcpy(img->rgb + 3 * i, rgba + 4 * i, 3); /* alpha dropped */
    free(rgba);
    return K3C_OK;
}

/* ---------------------------------------------------------------- JPEG */
typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
} jpeg_err_mgr;

static void jpeg_on_error(j_common_ptr cinfo) {
    jpeg_err_mgr *e = (jpeg_err_mgr *)cinfo->err;
    e->pub.format_message(cinfo, e->msg);
    longjmp(e->jump, 1);
}
static void jpeg_on_message(j_common_ptr cinfo, int level) { (void)cinfo, (void)level; } /* the library never prints */

static int decode_jpeg(const unsigned char *data, size_t n, const char *name, k3c_image *img, k3c_err *err) {
    struct jpeg_decompress_struct cinfo;
    jpeg_err_mgr jerr;
    unsigned char *volatile rgb = NULL;
    cinfo.err = jpeg_std_error(&jerr.pub);
    jerr.pub.error_exit = jpeg_on_error;
    jerr.pub.emit_message = jpeg_on_message;
    jerr.msg[0] = 0;
    if (setjmp(jerr.jump)) {
        jpeg_destroy_decompress(&cinfo);
        free(rgb);
        return k3c_errf(err, K3C_EFORMAT, "%s: bad JPEG: %s", name, jerr.msg);
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, (unsigned long)n);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
        jpeg_destroy_decompress(&cinfo);
        return k3c_errf(err, K3C_EUNSUPPORTED, "%s: CMYK / YCCK JPEGs are not supported (convert to RGB first)", name);
    }
    cinfo.out_color_space = JCS_RGB; /* libjpeg's defaults otherwise: islow DCT, fancy upsampling, as Pillow */
    if (check_size(name, cinfo.image_width, cinfo.image_height, err)) {
        jpeg_destroy_decompress(&cinfo);
        return err->code;
    }
    jpeg_start_decompress(&cinfo);
    const size_t stride = (size_t)cinfo.output_width * 3;
    rgb = malloc(stride * cinfo.output_height);
    if (!rgb) {
        snprintf(jerr.msg, sizeof jerr.msg, "out of memory");
        longjmp(jerr.jump, 1);
    }
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = rgb + stride * cinfo.output_scanline;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
    img->w = (int)cinfo.output_width;
    img->h = (int)cinfo.output_height;
    img->rgb = rgb;
    jpeg_destroy_decompress(&cinfo);
    return K3C_OK;
}

int k3c_image_decode(const void *data, size_t n, const char *name, k3c_image *img, k3c_err *err) {
    static const unsigned char png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    const unsigned char *p = data;
    memset(img, 0, sizeof *img);
    if (!name) name = "image";
    if (n >= 8 && !memcmp(p, png_magic, 8)) return decode_png(p, n, name, img, err);
    if (n >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff) return decode_jpeg(p, n, name, img, err);
    return k3c_errf(err, K3C_EFORMAT, "%s: not a PNG or JPEG file (unknown signature)", name);
}

int k3c_image_read(const char *path, k3c_image *img, k3c_err *err) {
    memset(img, 0, sizeof *img);
    char *buf = NULL;
    size_t n = 0;
    int rc = k3c_read_file(path, &buf, &n, err);
    if (rc) return rc;
    rc = k3c_image_decode(buf, n, path, img, err);
    free(buf);
    return rc;
}

void k3c_image_free(k3c_image *img) {
    if (!img) return;
    free(img->rgb);
    img->rgb = NULL;
}
