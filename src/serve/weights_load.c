/* weights_load.c — the engine's weights straight from a release checkpoint: safetensors mmap'd read-only (one file, or
 * model.safetensors.index.json + shards), matrices as views kept as stored (bf16, float32, MXFP4), vectors converted to
 * float. Implements docs/FORMATS.md §1.2 (files), §5 (names), §6 (MXFP4); docs/ENGINE.md "Weights". */
#include "serve/weights.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The checkpoint tensor(s) behind one slice of a parameter-table entry. */
typedef struct {
    const k3c_st_tensor *t, *scale; /* scale: the weight_scale partner of an MXFP4 weight_packed */
} slice_src;

typedef struct {
    const k3c_param_table *tab;
    k3c_weights *w;
    slice_src *src; /* slice e of entry i at src[base[i] + e] */
    size_t *base;   /* [tab->n + 1] */
    int *by_off;    /* entry indices sorted by offset */
    int rc;         /* the first error of a view callback (the callbacks cannot return one) */
    k3c_err *err;
} loader;

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int cmp_offset(const void *a, const void *b, void *ctx) {
    const k3c_param *p = ctx;
    size_t x = p[*(const int *)a].offset, y = p[*(const int *)b].offset;
    return (x > y) - (x < y);
}

static void shape_str(const int64_t *shape, int ndim, char *buf, size_t n) {
    buf[0] = 0;
    for (int i = 0; i < ndim; i++)
        snprintf(buf + strlen(buf), n - strlen(buf), "%s%lld", i ? ", " : "", (long long)shape[i]);
}

/* Where a missing tensor should have been: the index when the checkpoint is sharded. */
static const char *ckpt_where(const char *dir, char *buf, size_t n) {
    snprintf(buf, n, "%s/model.safetensors.index.json", dir);
    if (access(buf, F_OK) != 0) snprintf(buf, n, "%s/model.safetensors", dir);
    return buf;
}

/* Assigns every checkpoint tensor to its slice: unexpected, duplicated and missing tensors are errors. */
static int collect(loader *ld, const k3c_checkpoint *ck, const k3c_config *cfg, const char *dir) {
    const k3c_param_table *tab = ld->tab;
    k3c_err *err = ld->err;
    for (int i = 0; i < k3c_ckpt_count(ck); i++) {
        const k3c_st_tensor *t = k3c_ckpt_at(ck, i);
        if (cfg->vision.present && (!strncmp(t->name, "vision_tower.", 13) || !strncmp(t->name, "mm_projector.", 13)))
            continue; /* the vision tower is not part of the text model */
        int scale = ends_with(t->name, ".weight_scale"), packed = ends_with(t->name, ".weight_packed");
        char name[K3C_PARAM_NAME + 32], partner[K3C_PARAM_NAME + 48];
        size_t stem = strlen(t->name) - (packed ? strlen("_packed") : scale ? strlen("_scale") : 0);
        snprintf(name, sizeof name, "%.*s", (int)stem, t->name);
        snprintf(partner, sizeof partner, "%s_%s", name, scale ? "packed" : "scale");
        if (scale) { /* read with its weight_packed partner, which must exist */
            if (!k3c_ckpt_find(ck, partner))
                return k3c_errf(err, K3C_EFORMAT, "%s: %s has no %s", t->file, t->name, partner);
            continue;
        }
        int e, j = k3c_params_lookup(tab, name, &e);
        if (j < 0)
            return k3c_errf(err, K3C_EFORMAT, "%s: unexpected tensor %s (not in the model the config describes)",
                            t->file, t->name);
        slice_src *s = &ld->src[ld->base[j] + (size_t)(e > 0 ? e : 0)];
        if (s->t)
            return k3c_errf(err, K3C_EFORMAT, "%s: tensor %s given twice (also in %s)", t->file, t->name, s->t->file);
        s->t = t;
        if (packed && !(s->scale = k3c_ckpt_find(ck, partner)))
            return k3c_errf(err, K3C_EFORMAT, "%s: %s has no %s", t->file, t->name, partner);
    }
    for (int i = 0; i < tab->n; i++)
        for (int64_t e = 0; e < (tab->p[i].stack ? tab->p[i].stack : 1); e++)
            if (!ld->src[ld->base[i] + (size_t)e].t) {
                char name[K3C_PARAM_NAME + 16], where[4200];
                k3c_params_name(&tab->p[i], tab->p[i].stack ? e : -1, name, sizeof name);
                return k3c_errf(err, K3C_EFORMAT, "%s: no tensor %s (the config needs it)",
                                ckpt_where(dir, where, sizeof where), name);
            }
    return K3C_OK;
}

/* The entry and slice at element offset off of the parameter table (NULL if none starts there). */
static const slice_src *slice_at(const loader *ld, size_t off, const k3c_param **pp) {
    const k3c_param_table *tab = ld->tab;
    int lo = 0, hi = tab->n - 1, j = -1;
    while (lo <= hi) { /* the last entry starting at or before off */
        int mid = (lo + hi) / 2;
        if (tab->p[ld->by_off[mid]].offset <= off)
            j = ld->by_off[mid], lo = mid + 1;
        else
            hi = mid - 1;
    }
    if (j < 0) return NULL;
    const k3c_param *p = &tab->p[j];
    size_t rel = off - p->offset, slice = (size_t)k3c_param_slice_numel(p);
    if (rel >= (size_t)p->numel || rel % slice) return NULL;
    *pp = p;
    return &ld->src[ld->base[j] + rel / slice];
}

static int fail(loader *ld, int rc) {
    if (!ld->rc) ld->rc = rc;
    return rc;
}

/* The stored tensor must have the table's shape exactly (the config implies it). */
static int same_shape(loader *ld, const k3c_st_tensor *t, const k3c_param *p) {
    int same = t->ndim == p->ndim;
    for (int i = 0; same && i < p->ndim; i++) same = t->shape[i] == p->shape[i];
    if (same) return 1;
    char want[96], got[96];
    shape_str(p->shape, p->ndim, want, sizeof want);
    shape_str(t->shape, t->ndim, got, sizeof got);
    fail(ld, k3c_errf(ld->err, K3C_EFORMAT, "%s: tensor %s has shape [%s], the config implies [%s]", t->file, t->name,
                      got, want));
    return 0;
}

/* A float copy owned by the weights (vectors; matrices stored in a type no kernel reads, e.g. F16). */
static const float *float_copy(loader *ld, const k3c_st_tensor *t, size_t n) {
    float *v = k3c_weights_alloc(ld->w, sizeof(float) * n);
    if (!v) {
        fail(ld, k3c_errf(ld->err, K3C_ENOMEM, "%s: %s: out of memory", t->file, t->name));
        return NULL;
    }
    int rc = k3c_st_read_f32(t, v, n, ld->err);
    if (rc) {
        k3c_err_wrap(ld->err, "%s", t->file);
        fail(ld, rc);
        return NULL;
    }
    return v;
}

/* MXFP4: packed U8 [rows, cols/2] and its UE8M0 scales U8 [rows, cols/32], no scale byte 255 (NaN). */
static k3c_qmat mxfp4_view(loader *ld, const slice_src *s, int64_t rows, int64_t cols) {
    k3c_qmat q = {K3C_QMAT_MXFP4, rows, cols, NULL, NULL};
    const k3c_st_tensor *t = s->t, *sc = s->scale;
    if (t->dtype != K3C_U8 || t->ndim != 2 || t->shape[0] != rows || t->shape[1] * 2 != cols || sc->dtype != K3C_U8 ||
        sc->ndim != 2 || sc->shape[0] != rows || sc->shape[1] * 32 != cols) {
        fail(ld, k3c_errf(ld->err, K3C_EFORMAT,
                          "%s: %s / %s must be U8 [%lld, %lld] / [%lld, %lld] (MXFP4 of the [%lld, %lld] matrix the "
                          "config implies)",
                          t->file, t->name, sc->name, (long long)rows, (long long)(cols / 2), (long long)rows,
                          (long long)(cols / 32), (long long)rows, (long long)cols));
        return q;
    }
    const uint8_t *bad = memchr(sc->data, 255, sc->nbytes);
    if (bad) {
        size_t at = (size_t)(bad - (const uint8_t *)sc->data);
        fail(ld, k3c_errf(ld->err, K3C_EFORMAT, "%s: %s: scale byte 255 (NaN in the OCP MX spec) at row %zu, group %zu",
                          sc->file, sc->name, at / (size_t)(cols / 32), at % (size_t)(cols / 32)));
        return q;
    }
    q.w = t->data;
    q.scale = sc->data;
    return q;
}

static k3c_qmat ld_mat(void *ctx, size_t off, int64_t rows, int64_t cols) {
    loader *ld = ctx;
    k3c_qmat q = {K3C_QMAT_F32, rows, cols, NULL, NULL};
    const k3c_param *p;
    const slice_src *s = off == K3C_NOPARAM || ld->rc ? NULL : slice_at(ld, off, &p);
    if (!s) return q;
    if (s->scale) return mxfp4_view(ld, s, p->shape[0], p->shape[1]);
    const k3c_st_tensor *t = s->t;
    if (!same_shape(ld, t, p)) return q;
    if (t->dtype == K3C_BF16) {
        q.type = K3C_QMAT_BF16;
        q.w = t->data;
    } else if (t->dtype == K3C_F32 && (uintptr_t)t->data % sizeof(float) == 0) {
        q.w = t->data;
    } else {
        q.w = float_copy(ld, t, (size_t)k3c_param_slice_numel(p));
    }
    return q;
}

static const void *ld_vec(void *ctx, size_t off) {
    loader *ld = ctx;
    const k3c_param *p;
    const slice_src *s = off == K3C_NOPARAM || ld->rc ? NULL : slice_at(ld, off, &p);
    if (!s || !same_shape(ld, s->t, p)) return NULL;
    return float_copy(ld, s->t, (size_t)k3c_param_slice_numel(p));
}

static int load_views(k3c_weights *w, const k3c_config *cfg, const k3c_param_table *tab, const char *dir,
                      k3c_err *err) {
    loader ld = {tab, w, NULL, NULL, NULL, 0, err};
    ld.base = calloc((size_t)tab->n + 1, sizeof *ld.base);
    ld.by_off = malloc(sizeof *ld.by_off * (size_t)(tab->n + 1));
    int rc = ld.base && ld.by_off ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "%s: out of memory", dir);
    for (int i = 0; !rc && i < tab->n; i++) {
        ld.base[i + 1] = ld.base[i] + (size_t)(tab->p[i].stack ? tab->p[i].stack : 1);
        ld.by_off[i] = i;
    }
    if (!rc && !(ld.src = calloc(ld.base[tab->n] + 1, sizeof *ld.src)))
        rc = k3c_errf(err, K3C_ENOMEM, "%s: out of memory", dir);
    if (!rc) {
        qsort_r(ld.by_off, (size_t)tab->n, sizeof *ld.by_off, cmp_offset, tab->p);
        rc = collect(&ld, w->ckpt, cfg, dir);
    }
    if (!rc) {
        const k3c_weights_src src = {ld_mat, ld_vec, &ld};
        rc = k3c_weights_fill(w, cfg, tab, &src, err);
        if (!rc) rc = ld.rc;
    }
    free(ld.src);
    free(ld.base);
    free(ld.by_off);
    return rc;
}

int k3c_weights_open(const char *dir, k3c_weights *w, k3c_err *err) {
    memset(w, 0, sizeof *w);
    k3c_config cfg;
    k3c_param_table tab = {0};
    int rc = k3c_config_load(dir, &cfg, err);
    if (!rc) rc = k3c_ckpt_open(dir, &w->ckpt, err);
    if (!rc) rc = k3c_params_build(&cfg, &tab, err);
    if (!rc) rc = load_views(w, &cfg, &tab, dir, err);
    if (!rc) rc = k3c_weights_absorb(w, err);
    if (!rc) rc = k3c_weights_check(w, err);
    k3c_params_free(&tab);
    if (rc) k3c_weights_free(w);
    return rc;
}
