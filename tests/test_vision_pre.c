/* test_vision_pre.c — vision preprocessing: PNG / JPEG decoding of images the test writes (libpng, libjpeg), the
 * NaViT resize rule against the release's formula, Pillow's bicubic resize bit for bit (hashes from Pillow 9.4.0),
 * normalise + patchify against the golden's pixel_values, and bad files. Spec: docs/VISION.md "Preprocessing". */
#include "test.h"

#include <jpeglib.h>
#include <png.h>

/* ---------------------------------------------------------------- writers used to make test files */
static int write_png(const char *path, int w, int h, int color_type, int depth, const uint8_t *data, int ncolors,
                     const png_color *palette, const uint8_t *trans, int ntrans) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        fclose(f);
        return -1;
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, depth, color_type, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (palette) png_set_PLTE(png, info, palette, ncolors);
    if (trans) png_set_tRNS(png, info, trans, ntrans, NULL);
    png_write_info(png, info);
    const int ch = color_type == PNG_COLOR_TYPE_RGB          ? 3
                   : color_type == PNG_COLOR_TYPE_RGBA       ? 4
                   : color_type == PNG_COLOR_TYPE_GRAY_ALPHA ? 2
                                                             : 1;
    const size_t stride = (size_t)w * ch * (depth == 16 ? 2 : 1);
    for (int y = 0; y < h; y++) png_write_row(png, data + (size_t)y * stride);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    fclose(f);
    return 0;
}

static int write_jpeg(const char *path, int w, int h, const uint8_t *rgb, int quality) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    jpeg_start_compress(&c, TRUE);
    for (int y = 0; y < h; y++) {
        JSAMPROW row = (JSAMPROW)(rgb + (size_t)y * w * 3);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    fclose(f);
    return 0;
}

static uint8_t pattern(int x, int y, int c) { return (uint8_t)((x * 37 + y * 91 + c * 53 + (x * y * 7) % 31) % 256); }

static k3c_image make_image(int w, int h) {
    k3c_image im = {w, h, malloc((size_t)w * h * 3)};
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++) im.rgb[((size_t)y * w + x) * 3 + c] = pattern(x, y, c);
    return im;
}

/* ---------------------------------------------------------------- decoding */
static void test_png(void) {
    const char *tmp = test_tmpdir("vision_pre");
    char path[4300];
    const int w = 5, h = 3;
    k3c_image ref = make_image(w, h), im;
    k3c_err err = {0};
    /* RGB 8-bit */
    snprintf(path, sizeof path, "%s/rgb.png", tmp);
    CHECK(write_png(path, w, h, PNG_COLOR_TYPE_RGB, 8, ref.rgb, 0, NULL, NULL, 0) == 0, "write %s", path);
    CHECK_OK(k3c_image_read(path, &im, &err), &err);
    CHECK(im.rgb && im.w == w && im.h == h && !memcmp(im.rgb, ref.rgb, (size_t)w * h * 3), "PNG RGB exact");
    k3c_image_free(&im);
    /* RGBA: alpha dropped, not composited (Pillow's convert("RGB")) */
    uint8_t rgba[5 * 3 * 4], g16[5 * 3 * 2], gray[5 * 3], pal_idx[5 * 3];
    for (int i = 0; i < w * h; i++) {
        memcpy(rgba + 4 * i, ref.rgb + 3 * i, 3);
        rgba[4 * i + 3] = (uint8_t)(i * 17);
        g16[2 * i] = (uint8_t)(i * 13), g16[2 * i + 1] = 0xff; /* big-endian 16-bit gray: high byte i·13 */
        gray[i] = (uint8_t)(i * 11);
        pal_idx[i] = (uint8_t)(i % 4);
    }
    snprintf(path, sizeof path, "%s/rgba.png", tmp);
    CHECK(write_png(path, w, h, PNG_COLOR_TYPE_RGBA, 8, rgba, 0, NULL, NULL, 0) == 0, "write %s", path);
    CHECK_OK(k3c_image_read(path, &im, &err), &err);
    CHECK(im.rgb && !memcmp(im.rgb, ref.rgb, (size_t)w * h * 3), "PNG RGBA: alpha dropped");
    k3c_image_free(&im);
    /* 16-bit gray: high byte, replicated to RGB */
    snprintf(path, sizeof path, "%s/g16.png", tmp);
    CHECK(write_png(path, w, h, PNG_COLOR_TYPE_GRAY, 16, g16, 0, NULL, NULL, 0) == 0, "write %s", path);
    CHECK_OK(k3c_image_read(path, &im, &err), &err);
    int ok = im.rgb != NULL;
    for (int i = 0; ok && i < w * h; i++)
        ok = im.rgb[3 * i] == i * 13 && im.rgb[3 * i + 1] == i * 13 && im.rgb[3 * i + 2] == i * 13;
    CHECK(ok, "PNG 16-bit gray: high byte in R, G, B");
    k3c_image_free(&im);
    snprintf(path, sizeof path, "%s/g8.png", tmp);
    CHECK(write_png(path, w, h, PNG_COLOR_TYPE_GRAY, 8, gray, 0, NULL, NULL, 0) == 0, "write %s", path);
    CHECK_OK(k3c_image_read(path, &im, &err), &err);
    ok = im.rgb != NULL;
    for (int i = 0; ok && i < w * h; i++) ok = im.rgb[3 * i] == gray[i] && im.rgb[3 * i + 2] == gray[i];
    CHECK(ok, "PNG 8-bit gray");
    k3c_image_free(&im);
    /* palette with transparency: the palette colours, transparency dropped */
    const png_color pal[4] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {10, 20, 30}};
    const uint8_t trans[4] = {0, 128, 255, 7};
    snprintf(path, sizeof path, "%s/pal.png", tmp);
    CHECK(write_png(path, w, h, PNG_COLOR_TYPE_PALETTE, 8, pal_idx, 4, pal, trans, 4) == 0, "write %s", path);
    CHECK_OK(k3c_image_read(path, &im, &err), &err);
    ok = im.rgb != NULL;
    for (int i = 0; ok && i < w * h; i++)
        ok = im.rgb[3 * i] == pal[i % 4].red && im.rgb[3 * i + 1] == pal[i % 4].green &&
             im.rgb[3 * i + 2] == pal[i % 4].blue;
    CHECK(ok, "PNG palette + tRNS");
    k3c_image_free(&im);
    /* JPEG: a flat colour survives quality 100 within rounding; a pattern within JPEG's loss */
    const int jw = 16, jh = 8;
    k3c_image flat = {jw, jh, malloc((size_t)jw * jh * 3)};
    for (int i = 0; i < jw * jh; i++) flat.rgb[3 * i] = 200, flat.rgb[3 * i + 1] = 100, flat.rgb[3 * i + 2] = 50;
    snprintf(path, sizeof path, "%s/flat.jpg", tmp);
    CHECK(write_jpeg(path, jw, jh, flat.rgb, 100) == 0, "write %s", path);
    CHECK_OK(k3c_image_read(path, &im, &err), &err);
    int worst = 0;
    for (int i = 0; im.rgb && i < jw * jh * 3; i++) {
        int d = abs((int)im.rgb[i] - flat.rgb[i]);
        worst = d > worst ? d : worst;
    }
    CHECK(im.rgb && im.w == jw && im.h == jh && worst <= 2, "JPEG flat colour within 2 (got %d)", worst);
    k3c_image_free(&im);
    free(flat.rgb);
    /* bad files: a clear error naming the file */
    snprintf(path, sizeof path, "%s/bad.png", tmp);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 1, 16, f);
        fclose(f);
    }
    CHECK(k3c_image_read(path, &im, &err) == K3C_EFORMAT && strstr(err.msg, "bad.png") && !im.rgb, "truncated PNG: %s",
          err.msg);
    snprintf(path, sizeof path, "%s/bad.jpg", tmp);
    f = fopen(path, "wb");
    if (f) {
        fwrite("\xff\xd8\xff\xe0\0\x10JFIF", 1, 10, f);
        fclose(f);
    }
    CHECK(k3c_image_read(path, &im, &err) == K3C_EFORMAT && strstr(err.msg, "bad.jpg") && !im.rgb, "truncated JPEG: %s",
          err.msg);
    CHECK(k3c_image_decode("GIF89a", 6, "x.gif", &im, &err) == K3C_EFORMAT && strstr(err.msg, "x.gif"),
          "unknown format: %s", err.msg);
    free(ref.rgb);
}

/* ---------------------------------------------------------------- resize rule and Pillow's bicubic */
static void test_navit(void) {
    static const struct {
        int w, h, limit, nw, nh, pw, ph;
        int64_t tokens;
    } cases[] = {/* from the release's navit_resize_image (Python) */
                 {84, 56, 16384, 84, 56, 0, 0, 6},
                 {28, 28, 16384, 28, 28, 0, 0, 1},
                 {100, 30, 16384, 100, 30, 12, 26, 8},
                 {4000, 3000, 16384, 2073, 1554, 27, 14, 4200},
                 {1, 1, 16384, 1, 1, 27, 27, 1},
                 {10000, 20, 16384, 7168, 14, 0, 14, 256},
                 {3000, 4000, 16384, 1554, 2073, 14, 27, 4200},
                 {7169, 100, 16384, 7168, 99, 0, 13, 1024},
                 {1000, 800, 1024, 503, 402, 1, 18, 270}};
    k3c_media_cfg c = k3c_media_cfg_default();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        k3c_resize_plan r;
        k3c_err err = {0};
        c.in_patch_limit = cases[i].limit;
        CHECK_OK(k3c_navit_resize(&c, cases[i].w, cases[i].h, &r, &err), &err);
        CHECK(r.new_w == cases[i].nw && r.new_h == cases[i].nh && r.pad_w == cases[i].pw && r.pad_h == cases[i].ph &&
                  r.tokens == cases[i].tokens && r.grid_h * 14 == r.new_h + r.pad_h,
              "navit %dx%d: got %dx%d pad %d,%d tokens %lld", cases[i].w, cases[i].h, r.new_w, r.new_h, r.pad_w,
              r.pad_h, (long long)r.tokens);
    }
}

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static void test_pillow_bicubic(void) {
    static const struct {
        int w, h, nw, nh;
        uint64_t hash; /* FNV-1a of Pillow 9.4.0's Image.resize((nw, nh), BICUBIC).tobytes() of the same pattern */
    } cases[] = {{13, 11, 7, 5, 0x88640019f46af627ull},
                 {13, 11, 20, 17, 0xd2f153da8a3a3e0cull},
                 {64, 48, 30, 41, 0xc9ba5dd6f315b3a9ull},
                 {50, 50, 50, 23, 0x88242d677b3dd608ull},
                 {97, 31, 28, 28, 0x9de7b2178e2cd340ull}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        k3c_image src = make_image(cases[i].w, cases[i].h), dst;
        k3c_err err = {0};
        CHECK_OK(k3c_image_resize_bicubic(&src, cases[i].nw, cases[i].nh, &dst, &err), &err);
        CHECK(dst.rgb && fnv1a(dst.rgb, (size_t)cases[i].nw * cases[i].nh * 3) == cases[i].hash,
              "bicubic %dx%d -> %dx%d: bytes differ from Pillow's", cases[i].w, cases[i].h, cases[i].nw, cases[i].nh);
        k3c_image_free(&dst);
        free(src.rgb);
    }
}

/* ---------------------------------------------------------------- normalise + patchify against the golden */
static void golden_item(const k3c_safetensors *st, const char *cs, int items) {
    char nm[96];
    size_t off = 0;
    snprintf(nm, sizeof nm, "input.%s.pixel_values", cs);
    const k3c_st_tensor *pv = k3c_st_find(st, nm);
    snprintf(nm, sizeof nm, "input.%s.grid_thws", cs);
    const k3c_st_tensor *gt = k3c_st_find(st, nm);
    CHECK(pv && gt && pv->dtype == K3C_F32 && gt->dtype == K3C_I64, "golden inputs of %s", cs);
    if (!pv || !gt) return;
    double worst = 0;
    for (int i = 0; i < items; i++) {
        snprintf(nm, sizeof nm, "input.%s.raw_u8.%d", cs, i);
        const k3c_st_tensor *raw = k3c_st_find(st, nm);
        CHECK(raw && raw->dtype == K3C_U8 && raw->ndim == 4 && raw->shape[3] == 3, "%s: U8 [t, h, w, 3]", nm);
        if (!raw) return;
        const int t = (int)raw->shape[0], h = (int)raw->shape[1], w = (int)raw->shape[2];
        k3c_image fr[4];
        for (int f = 0; f < t && f < 4; f++) fr[f] = (k3c_image){w, h, (uint8_t *)raw->data + (size_t)f * w * h * 3};
        k3c_media_cfg c = k3c_media_cfg_default();
        float *px = NULL;
        k3c_grid_thw g;
        k3c_err err = {0};
        CHECK_OK(k3c_vision_preprocess(&c, fr, t, &px, &g, NULL, &err), &err);
        const int64_t *gr = (const int64_t *)gt->data + 3 * i;
        CHECK(px && g.t == gr[0] && g.h == gr[1] && g.w == gr[2], "%s: grid (%lld, %lld, %lld)", nm, (long long)g.t,
              (long long)g.h, (long long)g.w);
        const size_t n = px ? (size_t)(g.t * g.h * g.w * 3 * 14 * 14) : 0;
        for (size_t j = 0; j < n && off + j < pv->nbytes / 4; j++) {
            double d = fabs((double)px[j] - ((const float *)pv->data)[off + j]);
            worst = d > worst ? d : worst;
        }
        off += n;
        free(px);
    }
    CHECK(off * 4 == pv->nbytes, "%s: all golden patches covered", cs);
    CHECK_LE(worst, 0.0, "preprocess vs golden pixel_values, max abs");
}

static void test_golden_pixels(void) {
    char path[4200];
    snprintf(path, sizeof path, "%s/golden.safetensors", test_shared("golden/k3_vision_tiny"));
    k3c_safetensors *st = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_st_open(path, &st, &err), &err);
    if (!st) return;
    golden_item(st, "img", 2);
    golden_item(st, "vid", 1);
    k3c_st_close(st);
}

/* `k3c vision encode --image`: files preprocessed and packed; the printed prompts carry the original sizes and token
 * counts; re-encoding the written pixel_values / grid_thws gives the same embeddings bit for bit. */
static void test_cli_images(void) {
    const char *tmp = test_tmpdir("vision_cli"), *model = test_shared("golden/k3_vision_tiny");
    char a[4300], b[4300], out[4300], out2[4300], cmd[20000];
    snprintf(a, sizeof a, "%s/a.png", tmp);
    snprintf(b, sizeof b, "%s/b.jpg", tmp);
    snprintf(out, sizeof out, "%s/out.safetensors", tmp);
    snprintf(out2, sizeof out2, "%s/out2.safetensors", tmp);
    k3c_image ia = make_image(100, 30), ib = make_image(300, 200);
    CHECK(write_png(a, 100, 30, PNG_COLOR_TYPE_RGB, 8, ia.rgb, 0, NULL, NULL, 0) == 0, "write %s", a);
    CHECK(write_jpeg(b, 300, 200, ib.rgb, 90) == 0, "write %s", b);
    free(ia.rgb);
    free(ib.rgb);
    snprintf(cmd, sizeof cmd, "%s vision encode --model %s --image %s --image %s --max-patches 64 --out %s 2>&1",
             test_k3c_bin(), model, a, b, out);
    FILE *p = popen(cmd, "r");
    char buf[4096] = {0};
    size_t nr = p ? fread(buf, 1, sizeof buf - 1, p) : 0;
    int rc = p ? pclose(p) : -1;
    CHECK(nr > 0 && rc == 0, "%s: %s", cmd, buf);
    CHECK(strstr(buf, "100x30 -> 100x30 + pad 12,26, 8 tokens: <|media_begin|>image 100x30<|media_content|>") &&
              strstr(buf, "300x200 -> 139x93 + pad 1,19, 20 tokens: <|media_begin|>image 300x200"),
          "printed prompts: %s", buf);
    snprintf(cmd, sizeof cmd, "%s vision encode --model %s --input %s --out %s >/dev/null 2>&1", test_k3c_bin(), model,
             out, out2);
    CHECK(system(cmd) == 0, "%s", cmd);
    k3c_safetensors *s1 = NULL, *s2 = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_st_open(out, &s1, &err), &err);
    CHECK_OK(k3c_st_open(out2, &s2, &err), &err);
    if (s1 && s2) {
        const k3c_st_tensor *g = k3c_st_find(s1, "grid_thws"), *e1 = k3c_st_find(s1, "image_embeds"),
                            *e2 = k3c_st_find(s2, "image_embeds");
        const int64_t want[6] = {1, 4, 8, 1, 8, 10};
        CHECK(g && g->nbytes == sizeof want && !memcmp(g->data, want, sizeof want), "grid_thws (1,4,8), (1,8,10)");
        CHECK(e1 && e2 && e1->shape[0] == 28 && e1->nbytes == e2->nbytes && !memcmp(e1->data, e2->data, e1->nbytes),
              "28 merged tokens; re-encoding the written pixels gives the same embeddings");
    }
    k3c_st_close(s1);
    k3c_st_close(s2);
    snprintf(cmd, sizeof cmd, "%s vision encode --model %s --image %s/missing.png --out %s/x.safetensors 2>&1",
             test_k3c_bin(), model, tmp, tmp);
    p = popen(cmd, "r");
    memset(buf, 0, sizeof buf);
    nr = p ? fread(buf, 1, sizeof buf - 1, p) : 0;
    rc = p ? pclose(p) : -1;
    CHECK(nr > 0 && rc != 0 && strstr(buf, "missing.png"), "missing image: %s", buf);
}

int main(void) {
    test_png();
    test_navit();
    test_pillow_bicubic();
    test_golden_pixels();
    test_cli_images();
    return test_summary();
}
