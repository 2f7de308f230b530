/* data.c — interleaved image-text training samples: JSONL lines {"text": "...<image>...", "images": [paths],
 * "answer": "..."} decoded, preprocessed and tokenized (each <image> becomes the image's K3 prompt with its merged-token
 * count of <|media_pad|>), targets with no loss on image tokens (and, with an answer, on the answer only); a bad line
 * is reported (file, line, reason) and skipped. Spec: docs/VISION.md "Training data". */
#include "base/check.h"
#include "base/json.h"
#include "vision/vision.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MARKER "<image>"

void k3c_vsample_free(k3c_vsample *s) {
    free(s->ids), free(s->targets), free(s->grid), free(s->pixels), free(s->answer);
    memset(s, 0, sizeof *s);
}

void k3c_vdata_free(k3c_vdata *d) {
    for (size_t i = 0; d->s && i < d->n; i++) k3c_vsample_free(&d->s[i]);
    free(d->s);
    free(d->report);
    memset(d, 0, sizeof *d);
}

static int count_markers(const char *s) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, MARKER)); p += strlen(MARKER)) n++;
    return n;
}

/* Appends image i of the line (relative to the JSONL's directory): pixels, grid, prompt ids. */
static int add_image(const char *base, const char *rel, const k3c_tok *tok, const k3c_media_cfg *mc, k3c_vsample *s,
                     k3c_tok_ids *ids, k3c_err *err) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s%s", rel[0] == '/' ? "" : base, rel) >= (int)sizeof path)
        return k3c_errf(err, K3C_EINVAL, "image path too long");
    k3c_image im;
    CHECK_RC(k3c_image_read(path, &im, err));
    float *px = NULL;
    k3c_grid_thw g;
    k3c_resize_plan plan;
    int rc = k3c_vision_preprocess(mc, &im, 1, &px, &g, &plan, err);
    if (rc) k3c_err_wrap(err, "%s", path);
    const int64_t L = g.t * g.h * g.w, per = 3 * mc->patch_size * mc->patch_size;
    k3c_grid_thw *gg = rc ? NULL : realloc(s->grid, sizeof *gg * (size_t)(s->n_img + 1));
    float *pp = gg ? realloc(s->pixels, sizeof(float) * (size_t)((s->n_patches + L) * per)) : NULL;
    if (gg) s->grid = gg;
    if (pp) s->pixels = pp;
    if (!rc && !pp) rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    if (!rc) {
        memcpy(s->pixels + s->n_patches * per, px, sizeof(float) * (size_t)(L * per));
        s->grid[s->n_img++] = g;
        s->n_patches += L;
        s->n_img_tokens += plan.tokens;
        rc = k3c_vision_image_ids(tok, im.w, im.h, plan.tokens, ids, err);
    }
    free(px);
    k3c_image_free(&im);
    return rc;
}

/* Targets inside the sample: none on image tokens, none before the answer when there is one. */
static int make_targets(k3c_vsample *s, int32_t pad, k3c_err *err) {
    if (!(s->targets = malloc(sizeof(int32_t) * (size_t)s->n))) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    CHECK_RC(k3c_vision_targets(s->ids, s->n, NULL, 1, pad, s->targets, err));
    int64_t counted = 0;
    for (int64_t t = 0; t < s->n; t++) {
        if (t + 1 < s->answer_at) s->targets[t] = -1;
        counted += s->targets[t] >= 0;
    }
    return counted ? K3C_OK : k3c_errf(err, K3C_EINVAL, "no token to learn (text or answer needed after the images)");
}

/* One JSONL line → a sample (err names the reason; the caller adds file and line). */
static int parse_line(const char *line, size_t n, const char *base, const k3c_tok *tok, const k3c_media_cfg *mc,
                      int32_t pad, int64_t max_tokens, k3c_vsample *s, k3c_err *err) {
    k3c_json *j = NULL;
    CHECK_RC(k3c_json_parse(line, n, "JSON", &j, err));
    const k3c_json *text = k3c_json_get(j, "text"), *imgs = k3c_json_get(j, "images"), *ans = k3c_json_get(j, "answer");
    int rc = K3C_OK;
    if (j->type != K3C_JSON_OBJECT || !text || text->type != K3C_JSON_STRING)
        rc = k3c_errf(err, K3C_EFORMAT, "field \"text\": expected a string");
    else if (imgs && imgs->type != K3C_JSON_ARRAY)
        rc = k3c_errf(err, K3C_EFORMAT, "field \"images\": expected an array of paths");
    else if (ans && ans->type != K3C_JSON_STRING)
        rc = k3c_errf(err, K3C_EFORMAT, "field \"answer\": expected a string");
    const size_t n_img = imgs ? imgs->n : 0;
    if (!rc && count_markers(text->string) != (int)n_img)
        rc = k3c_errf(err, K3C_EFORMAT, "field \"text\" has %d " MARKER " markers for %zu images",
                      count_markers(text->string), n_img);
    k3c_tok_ids ids = {0};
    const char *p = rc ? NULL : text->string;
    for (size_t i = 0; !rc && i <= n_img; i++) { /* text piece i, then image i */
        const char *m = i < n_img ? strstr(p, MARKER) : p + strlen(p);
        if (m > p) rc = k3c_tok_encode(tok, p, (size_t)(m - p), 0, &ids, err);
        if (!rc && i < n_img && imgs->items[i].type != K3C_JSON_STRING)
            rc = k3c_errf(err, K3C_EFORMAT, "images[%zu]: expected a path", i);
        if (!rc && i < n_img) rc = add_image(base, imgs->items[i].string, tok, mc, s, &ids, err);
        p = m + (i < n_img ? strlen(MARKER) : 0);
    }
    s->answer_at = (int64_t)ids.n;
    if (!rc && ans && !(s->answer = strdup(ans->string))) rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    if (!rc && ans) rc = k3c_tok_encode(tok, ans->string, ans->len, 0, &ids, err);
    if (!rc && !ans) s->answer_at = 0;
    if (!rc && (int64_t)ids.n > max_tokens)
        rc =
            k3c_errf(err, K3C_EINVAL, "%zu tokens, more than the %lld a sample may have", ids.n, (long long)max_tokens);
    s->ids = ids.ids, s->n = (int64_t)ids.n;
    if (!rc) rc = make_targets(s, pad, err);
    k3c_json_free(j);
    return rc;
}

int k3c_vdata_load(const char *path, const k3c_tok *tok, const k3c_vision_config *vc, int64_t max_tokens,
                   k3c_vdata *out, k3c_err *err) {
    memset(out, 0, sizeof *out);
    char base[4096];
    const char *slash = strrchr(path, '/');
    snprintf(base, sizeof base, "%.*s", slash ? (int)(slash - path + 1) : 0, path);
    k3c_media_cfg mc = k3c_media_cfg_default();
    mc.patch_size = vc->patch_size, mc.merge = vc->merge_kernel[0];
    int32_t pad = vc->media_pad_id >= 0 ? (int32_t)vc->media_pad_id : k3c_tok_special_id(tok, "<|media_pad|>");
    if (pad < 0) return k3c_errf(err, K3C_ECONFIG, "%s: the tokenizer has no <|media_pad|>", path);
    FILE *f = fopen(path, "r");
    if (!f) return k3c_errf(err, K3C_EIO, "%s: cannot open", path);
    k3c_sbuf rep;
    k3c_sbuf_init(&rep);
    char *line = NULL;
    size_t cap = 0, room = 0;
    int rc = K3C_OK;
    for (long lineno = 1;; lineno++) {
        ssize_t n = getline(&line, &cap, f);
        if (n < 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
        if (n == 0) continue;
        if (out->n == room) {
            k3c_vsample *g = realloc(out->s, sizeof *g * (room = room ? 2 * room : 256));
            if (!g) {
                rc = k3c_errf(err, K3C_ENOMEM, "%s: out of memory", path);
                break;
            }
            out->s = g;
        }
        k3c_vsample *s = &out->s[out->n];
        memset(s, 0, sizeof *s);
        k3c_err le = {0};
        if (parse_line(line, (size_t)n, base, tok, &mc, pad, max_tokens, s, &le)) {
            k3c_vsample_free(s);
            if (le.code == K3C_ENOMEM) {
                rc = k3c_errf(err, K3C_ENOMEM, "%s:%ld: %s", path, lineno, le.msg);
                break;
            }
            k3c_sbuf_printf(&rep, "%s:%ld: %s (line skipped)\n", path, lineno, le.msg);
            out->n_bad++;
        } else {
            out->n++;
        }
    }
    free(line);
    fclose(f);
    out->report = rep.buf;
    if (!rc && out->n == 0) rc = k3c_errf(err, K3C_EFORMAT, "%s: no usable sample (%d bad lines)", path, out->n_bad);
    if (rc) k3c_vdata_free(out);
    return rc;
}
