/* params.c — the vision tower's parameter table under the release's tensor names, the tower's one flat buffer (saved
 * from wherever it runs), and the merged-token count of packed items. Spec: ../shared/spec/CHECKPOINTS.md §3.4 and the vision tensor table. */
#include "base/json.h"
#include "ops/backend.h"
#include "vision/vision.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void set(k3c_vision_param *p, const char *name, int ndim, int64_t a, int64_t b, int64_t c, int64_t d) {
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    const int64_t s[4] = {a, b, c, d};
    p->n = 1;
    for (int i = 0; i < 4; i++) {
        p->shape[i] = i < ndim ? s[i] : 0;
        if (i < ndim) p->n *= (size_t)s[i];
    }
}

/* Fills p[] in slot order (vision.h) and returns the count. */
static int fill_table(const k3c_vision_config *vc, k3c_vision_param *p) {
    const int64_t D = vc->hidden, Q = vc->qkv_hidden, F = vc->intermediate, ps = vc->patch_size;
    const int64_t M = vc->mm_hidden * vc->merge_kernel[0] * vc->merge_kernel[1], E = vc->text_hidden;
    char nm[96];
    set(&p[VP_PATCH], "vision_tower.patch_embed.proj.weight", 4, D, 3, ps, ps);
    set(&p[VP_POS], "vision_tower.patch_embed.pos_emb.weight", 3, vc->pos_emb_h, vc->pos_emb_w, D, 0);
    for (int64_t l = 0; l < vc->layers; l++) {
        static const char *const part[VB_COUNT] = {"norm0", "wqkv", "wo", "norm1", "mlp.fc0", "mlp.fc1"};
        const int64_t rows[VB_COUNT] = {D, 3 * Q, D, D, F, D}, cols[VB_COUNT] = {0, D, Q, 0, D, F};
        for (int k = 0; k < VB_COUNT; k++) {
            snprintf(nm, sizeof nm, "vision_tower.encoder.blocks.%lld.%s.weight", (long long)l, part[k]);
            set(&p[k3c_vision_bslot(l, k)], nm, cols[k] ? 2 : 1, rows[k], cols[k], 0, 0);
        }
    }
    int t = VP_BLOCK0 + (int)vc->layers * VB_COUNT;
    set(&p[t + VT_FINAL], "vision_tower.encoder.final_layernorm.weight", 1, D, 0, 0, 0);
    set(&p[t + VT_PROJ0], "mm_projector.proj.0.weight", 2, M, M, 0, 0);
    set(&p[t + VT_PROJ2], "mm_projector.proj.2.weight", 2, E, M, 0, 0);
    set(&p[t + VT_POST], "mm_projector.post_norm.weight", 1, E, 0, 0, 0);
    return t + VT_COUNT;
}

/* Shared by k3c_vision_create_f32/_f64: the table and zeroed buffers of `precision` reals. */
int k3c_vision_alloc(const k3c_vision_config *vc, k3c_dtype precision, int with_grad, k3c_vision **out, k3c_err *err) {
    *out = NULL;
    if (!vc || !vc->present) return k3c_errf(err, K3C_ECONFIG, "vision: the config has no vision_config");
    if (vc->layers <= 0 || vc->layers > 4096 || vc->heads <= 0 || vc->qkv_hidden % vc->heads ||
        (vc->qkv_hidden / vc->heads) % 4 || vc->mm_hidden != vc->hidden)
        return k3c_errf(err, K3C_ECONFIG, "vision: unsupported vision_config (layers %lld, heads %lld, qkv %lld)",
                        (long long)vc->layers, (long long)vc->heads, (long long)vc->qkv_hidden);
    k3c_vision *v = calloc(1, sizeof *v);
    int n = VP_BLOCK0 + (int)vc->layers * VB_COUNT + VT_COUNT;
    if (v) v->p = calloc((size_t)n, sizeof *v->p);
    if (!v || !v->p) {
        free(v);
        return k3c_errf(err, K3C_ENOMEM, "vision: out of memory");
    }
    v->cfg = *vc;
    v->precision = precision;
    v->n = fill_table(vc, v->p);
    for (int i = 0; i < v->n; i++) {
        v->p[i].off = v->total;
        v->total += v->p[i].n;
    }
    size_t es = precision == K3C_F64 ? sizeof(double) : sizeof(float);
    v->w = calloc(v->total, es);
    v->g = with_grad ? calloc(v->total, es) : NULL;
    if (!v->w || (with_grad && !v->g)) {
        size_t total = v->total;
        k3c_vision_free(v);
        return k3c_errf(err, K3C_ENOMEM, "vision: out of memory for %zu parameters", total);
    }
    *out = v;
    return K3C_OK;
}

void k3c_vision_free(k3c_vision *v) {
    if (!v) return;
    void (*f)(void *) = v->bfree ? v->bfree : free;
    if (v->w) f(v->w);
    if (v->g) f(v->g);
    free(v->p);
    free(v);
}

size_t k3c_vision_param_count(const k3c_vision *v) { return v ? v->total : 0; }
void *k3c_vision_weights(k3c_vision *v) { return v ? v->w : NULL; }
void *k3c_vision_grads(k3c_vision *v) { return v ? v->g : NULL; }

int64_t k3c_vision_merged_tokens(const k3c_vision_config *vc, const k3c_grid_thw *g, int n, k3c_err *err) {
    if (k3c_grid_tokens(g, n, err) < 0) return -1;
    const int64_t kh = vc->merge_kernel[0], kw = vc->merge_kernel[1];
    int64_t N = 0;
    for (int i = 0; i < n; i++) {
        if (g[i].h % kh || g[i].w % kw)
            return k3c_errf(err, K3C_EINVAL,
                            "vision: item %d grid %lldx%lld is not a multiple of the %lldx%lld merge kernel", i,
                            (long long)g[i].h, (long long)g[i].w, (long long)kh, (long long)kw),
                   -1;
        N += (g[i].h / kh) * (g[i].w / kw);
    }
    return N;
}

/* The parameters as host memory: w itself, or (a tower on a device) a downloaded copy in *copy (free() it). */
static int host_weights(const k3c_vision *v, const char *path, const void **w, void **copy, k3c_err *err) {
    *w = v->w, *copy = NULL;
    if (!v->backend) return K3C_OK;
    const size_t bytes = v->total * (v->precision == K3C_F64 ? sizeof(double) : sizeof(float));
    if (!(*copy = malloc(bytes ? bytes : 1))) return k3c_errf(err, K3C_ENOMEM, "vision_save: %s: out of memory", path);
    *w = *copy;
    return v->precision == K3C_F64 ? ((const k3c_backend_f64 *)v->backend)->download(*copy, v->w, bytes, err)
                                   : ((const k3c_backend_f32 *)v->backend)->download(*copy, v->w, bytes, err);
}

int k3c_vision_save(const k3c_vision *v, const char *path, k3c_err *err) {
    k3c_st_entry *e = calloc((size_t)v->n, sizeof *e);
    const void *w = v->w;
    void *copy = NULL;
    int rc = !e ? k3c_errf(err, K3C_ENOMEM, "vision_save: out of memory") : host_weights(v, path, &w, &copy, err);
    const size_t es = v->precision == K3C_F64 ? sizeof(double) : sizeof(float);
    for (int i = 0; !rc && i < v->n; i++) {
        const k3c_vision_param *p = &v->p[i];
        e[i] = (k3c_st_entry){p->name, v->precision, p->ndim, {0}, (const char *)w + p->off * es};
        for (int d = 0; d < p->ndim; d++) e[i].shape[d] = p->shape[d];
    }
    if (!rc) rc = k3c_st_write(path, e, v->n, NULL, err);
    free(copy);
    free(e);
    return rc;
}

int k3c_vision_save_beside(const k3c_vision *v, const char *dir, k3c_err *err) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/model.safetensors", dir) >= (int)sizeof path)
        return k3c_errf(err, K3C_EINVAL, "%s: path too long", dir);
    k3c_safetensors *st = NULL;
    int rc = k3c_st_open(path, &st, err);
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    k3c_sbuf_printf(&s, "{\"metadata\": {}, \"weight_map\": {");
    for (int i = 0; !rc && i < k3c_st_count(st); i++) {
        const char *name = k3c_st_at(st, i)->name;
        if (!strncmp(name, "vision_tower.", 13) || !strncmp(name, "mm_projector.", 13))
            rc = k3c_errf(err, K3C_EFORMAT, "%s: already holds vision tensor %s", path, name);
        k3c_sbuf_printf(&s, "%s\"%s\": \"model.safetensors\"", i ? ", " : "", name);
    }
    for (int i = 0; i < v->n; i++) k3c_sbuf_printf(&s, ", \"%s\": \"vision.safetensors\"", v->p[i].name);
    k3c_sbuf_append(&s, "}}\n", 3);
    k3c_st_close(st);
    if (!rc && !s.ok) rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    snprintf(path, sizeof path, "%s/vision.safetensors", dir);
    if (!rc) rc = k3c_vision_save(v, path, err);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (!rc) rc = k3c_write_file_atomic(path, s.buf, s.len, err);
    k3c_sbuf_free(&s);
    return rc;
}
