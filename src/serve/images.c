/* images.c — image parts of a chat request: each OpenAI image_url part (a data: URL, PNG or JPEG) decoded,
 * preprocessed and run through the vision tower; its prompt text for the renderer and its embeddings for the
 * <|media_pad|> rows of the prompt. Spec: docs/VISION.md "Serving images"; docs/SERVING.md. */
#include "serve/request.h"

#include "tok/tok.h"
#include "vision/vision.h"

#include <stdlib.h>
#include <string.h>

#define BAD_IMAGE(e, status, code, param, ...)                                                                         \
    k3c_api_fail(e, status, "invalid_request_error", code, param, __VA_ARGS__)

/* "data:image/png;base64,...." → the decoded bytes (malloc'd). Remote URLs are refused: the server fetches nothing. */
static int data_url(const char *url, size_t n, const k3c_api_limits *lim, const char *param, unsigned char **out,
                    size_t *len, k3c_api_error *e) {
    if (n < 5 || memcmp(url, "data:", 5))
        return BAD_IMAGE(e, 400, "invalid_image_url", param,
                         "only data: URLs (data:image/png;base64,... or data:image/jpeg;base64,...) are served; the "
                         "server fetches no remote images");
    const char *comma = memchr(url, ',', n);
    if (!comma) return BAD_IMAGE(e, 400, "invalid_image_url", param, "a data: URL needs a ',' before its data");
    const size_t head = (size_t)(comma - url);
    const int png = head >= 14 && !memcmp(url + 5, "image/png", 9), jpg = head >= 13 && !memcmp(url + 5, "image/jp", 8);
    if (!png && !jpg)
        return BAD_IMAGE(e, 400, "invalid_image_format", param,
                         "the data: URL's media type must be image/png or "
                         "image/jpeg");
    if (head < 7 || memcmp(comma - 7, ";base64", 7))
        return BAD_IMAGE(e, 400, "invalid_image_url", param, "the data: URL must be base64-encoded (';base64,')");
    const char *b64 = comma + 1;
    const size_t nb = n - head - 1;
    if (nb / 4 * 3 > lim->max_image_bytes)
        return BAD_IMAGE(e, 413, "image_too_large", param, "the image is larger than %zu bytes", lim->max_image_bytes);
    if (!(*out = malloc(nb / 4 * 3 + 3))) return k3c_api_fail(e, 500, "server_error", NULL, "", "out of memory");
    if (k3c_base64_decode(b64, nb, *out, len) || *len == 0) {
        free(*out), *out = NULL;
        return BAD_IMAGE(e, 400, "invalid_base64", param, "the image data is not valid base64");
    }
    return 0;
}

/* One image part: decode, preprocess, encode; appends its embeddings to r and its prompt to prompts. */
static int one_image(const k3c_json *part, const k3c_api_limits *lim, const char *param, k3c_api_req *r,
                     k3c_sbuf *prompts, k3c_api_error *e) {
    const k3c_json *iu = k3c_json_get(part, "image_url");
    const k3c_json *url = iu && iu->type == K3C_JSON_OBJECT ? k3c_json_get(iu, "url") : iu;
    if (!url || url->type != K3C_JSON_STRING)
        return BAD_IMAGE(e, 400, "invalid_type", param, "an image part needs \"image_url\": {\"url\": \"data:...\"}");
    unsigned char *bytes = NULL;
    size_t nbytes = 0;
    int rc = data_url(url->string, url->len, lim, param, &bytes, &nbytes, e);
    if (rc) return rc;
    k3c_err err = {0};
    k3c_image im = {0};
    if (k3c_image_decode(bytes, nbytes, "image", &im, &err))
        rc = BAD_IMAGE(e, 400, "invalid_image", param, "not a readable PNG or JPEG image (%s)", err.msg);
    free(bytes);
    if (!rc && (int64_t)im.w * im.h > lim->max_image_pixels)
        rc = BAD_IMAGE(e, 413, "image_too_large", param, "the image has %dx%d pixels, more than %lld", im.w, im.h,
                       (long long)lim->max_image_pixels);
    const k3c_vision_config *vc = &lim->vision->cfg;
    k3c_media_cfg mc = k3c_media_cfg_default();
    mc.patch_size = vc->patch_size, mc.merge = vc->merge_kernel[0];
    float *px = NULL;
    k3c_grid_thw g;
    k3c_resize_plan plan;
    if (!rc && k3c_vision_preprocess(&mc, &im, 1, &px, &g, &plan, &err))
        rc = BAD_IMAGE(e, 400, "invalid_image", param, "%s", err.msg);
    k3c_vision_acts_f32 *a = NULL;
    const float *emb = NULL;
    int64_t N = 0;
    if (!rc && k3c_vision_forward_f32(lim->vision, px, &g, 1, &a, NULL, &emb, &N, &err))
        rc = k3c_api_fail(e, 500, "server_error", NULL, "", "vision tower: %s", err.msg);
    const int64_t E = vc->text_hidden;
    float *grown = rc ? NULL : realloc(r->embeds, sizeof(float) * (size_t)((r->n_embeds + N) * E));
    if (!rc && !grown) rc = k3c_api_fail(e, 500, "server_error", NULL, "", "out of memory");
    if (!rc) {
        r->embeds = grown;
        memcpy(r->embeds + r->n_embeds * E, emb, sizeof(float) * (size_t)(N * E));
        r->n_embeds += N;
        char *text = NULL;
        if (k3c_vision_image_prompt(im.w, im.h, N, &text, NULL, &err))
            rc = k3c_api_fail(e, 500, "server_error", NULL, "", "%s", err.msg);
        else
            k3c_sbuf_printf(prompts, "%s\"%s\"", prompts->len > 1 ? "," : "", text); /* markup: no escapes needed */
        free(text);
    }
    k3c_vision_acts_free_f32(a);
    free(px);
    k3c_image_free(&im);
    return rc;
}

static int is_image_part(const k3c_json *p) {
    const k3c_json *t = p->type == K3C_JSON_OBJECT ? k3c_json_get(p, "type") : NULL;
    return t && t->type == K3C_JSON_STRING && (!strcmp(t->string, "image_url") || !strcmp(t->string, "image"));
}

int k3c_api_images(const k3c_json *msgs, const k3c_api_limits *lim, k3c_api_req *r, k3c_sbuf *prompts,
                   k3c_api_error *e) {
    int n_img = 0;
    k3c_sbuf_append(prompts, "[", 1);
    for (size_t i = 0; i < msgs->n; i++) {
        const k3c_json *c = k3c_json_get(&msgs->items[i], "content");
        for (size_t j = 0; c && c->type == K3C_JSON_ARRAY && j < c->n; j++) {
            if (!is_image_part(&c->items[j])) continue;
            char param[64];
            snprintf(param, sizeof param, "messages[%zu].content[%zu]", i, j);
            if (!lim->vision)
                return BAD_IMAGE(e, 400, "model_not_multimodal", param,
                                 "model '%s' has no vision tower (no vision_config): image parts are not served",
                                 lim->model_name ? lim->model_name : "");
            if (++n_img > lim->max_images)
                return BAD_IMAGE(e, 400, "too_many_images", param, "at most %d images per request", lim->max_images);
            int rc = one_image(&c->items[j], lim, param, r, prompts, e);
            if (rc) return rc;
        }
    }
    k3c_sbuf_append(prompts, "]", 1);
    if (!prompts->ok) return k3c_api_fail(e, 500, "server_error", NULL, "", "out of memory");
    return n_img;
}

int k3c_api_image_rows(const k3c_api_limits *lim, k3c_api_req *r, k3c_api_error *e) {
    if (!r->n_embeds) return 0;
    int64_t pad = lim->vision->cfg.media_pad_id;
    if (pad < 0) pad = k3c_tok_special_id(lim->tok, "<|media_pad|>");
    const int64_t T = (int64_t)r->prompt.n;
    if (!(r->embed_pos = malloc(sizeof(int32_t) * (size_t)(T ? T : 1))))
        return k3c_api_fail(e, 500, "server_error", NULL, "", "out of memory");
    const int64_t n = pad < 0 ? 0 : k3c_vision_pad_positions(r->prompt.ids, T, (int32_t)pad, r->embed_pos);
    if (n != r->n_embeds)
        return k3c_api_fail(e, 400, "invalid_request_error", "invalid_value", "messages",
                            "the prompt has %lld <|media_pad|> tokens for %lld image tokens", (long long)n,
                            (long long)r->n_embeds);
    return 0;
}
