/* load.c — creating, initialising and loading the vision tower in either precision: the config's vision_config and
 * the checkpoint's vision_tower.* / mm_projector.* tensors, checked against the table's shapes.
 * Spec: ../shared/spec/CHECKPOINTS.md §3.4 and the vision tensor table; docs/VISION.md "Loading". */
#include "base/real.h"
#include "ops/backend.h"
#include "vision/vision.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int k3c_vision_create(const k3c_vision_config *vc, int with_grad, k3c_vision **out, k3c_err *err) {
    return k3c_vision_alloc(vc, REAL_DTYPE, with_grad, out, err);
}

/* Truncated at two standard deviations, as nn.init.trunc_normal_ with its default bounds is for these stds. */
static double trunc_normal(k3c_rng *r, double std) {
    for (;;) {
        double z = k3c_rng_normal(r);
        if (z >= -2 && z <= 2) return z * std;
    }
}

void k3c_vision_init(k3c_vision *v, uint64_t seed) {
    if (v->backend) return; /* host writes only: init before k3c_vision_use_backend */
    real *w = v->w;
    k3c_rng r = {seed, 0};
    for (int i = 0; i < v->n; i++) {
        const k3c_vision_param *p = &v->p[i];
        real *x = w + p->off;
        if (p->ndim == 1)
            for (size_t j = 0; j < p->n; j++) x[j] = 1;
        else if (i == VP_POS)
            for (size_t j = 0; j < p->n; j++) x[j] = (real)k3c_rng_normal(&r);
        else {
            const double std = sqrt(2.0 / (double)(p->n / (size_t)p->shape[0]));
            for (size_t j = 0; j < p->n; j++) x[j] = (real)trunc_normal(&r, std);
        }
    }
}

static int is_vision_name(const char *name) {
    return !strncmp(name, "vision_tower.", 13) || !strncmp(name, "mm_projector.", 13);
}

static int load_param(k3c_vision *v, const k3c_checkpoint *ck, const k3c_vision_param *p, k3c_err *err) {
    const k3c_st_tensor *t = k3c_ckpt_find(ck, p->name);
    if (!t) return k3c_errf(err, K3C_EFORMAT, "checkpoint is missing vision tensor %s", p->name);
    int same = t->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
    if (!same)
        return k3c_errf(err, K3C_EFORMAT,
                        "%s: tensor %s has %d dims [%lld, ...], vision_config implies %d dims [%lld, ...]", t->file,
                        t->name, t->ndim, (long long)(t->ndim ? t->shape[0] : 0), p->ndim, (long long)p->shape[0]);
#if K3C_REAL_DOUBLE
    return k3c_st_read_f64(t, (real *)v->w + p->off, p->n, err);
#else
    return k3c_st_read_f32(t, (real *)v->w + p->off, p->n, err);
#endif
}

int k3c_vision_load(k3c_vision *v, const k3c_checkpoint *ck, k3c_err *err) {
    if (v->precision != REAL_DTYPE) return k3c_errf(err, K3C_EINVAL, "vision_load: tower of the other precision");
    if (v->backend) return k3c_errf(err, K3C_EINVAL, "vision_load: load before k3c_vision_use_backend");
    for (int i = 0; i < k3c_ckpt_count(ck); i++) { /* an unknown vision tensor means a different tower */
        const k3c_st_tensor *t = k3c_ckpt_at(ck, i);
        if (!is_vision_name(t->name)) continue;
        int known = 0;
        for (int j = 0; j < v->n && !known; j++) known = !strcmp(v->p[j].name, t->name);
        if (!known) return k3c_errf(err, K3C_EFORMAT, "%s: unexpected vision tensor %s", t->file, t->name);
    }
    for (int i = 0; i < v->n; i++) {
        int rc = load_param(v, ck, &v->p[i], err);
        if (rc) return rc;
    }
    return K3C_OK;
}

int k3c_vision_open(const char *dir, int with_grad, k3c_vision **out, k3c_err *err) {
    *out = NULL;
    k3c_config *cfg = calloc(1, sizeof *cfg);
    if (!cfg) return k3c_errf(err, K3C_ENOMEM, "vision_open: out of memory");
    k3c_checkpoint *ck = NULL;
    k3c_vision *v = NULL;
    int rc = k3c_config_load(dir, cfg, err);
    if (!rc && !cfg->vision.present) rc = k3c_errf(err, K3C_ECONFIG, "%s: config.json has no vision_config", dir);
    if (!rc) rc = k3c_ckpt_open(dir, &ck, err);
    if (!rc) rc = k3c_vision_create(&cfg->vision, with_grad, &v, err);
    if (!rc) rc = k3c_vision_load(v, ck, err);
    k3c_ckpt_close(ck);
    free(cfg);
    if (rc) {
        k3c_vision_free(v);
        return rc;
    }
    *out = v;
    return K3C_OK;
}

int k3c_vision_use_backend(k3c_vision *v, const k3c_backend *backend, k3c_err *err) {
    const k3c_backend *be = backend ? backend : k3c_backend_cpu();
    if (v->precision != REAL_DTYPE)
        return k3c_errf(err, K3C_EINVAL, "vision_use_backend: tower of the other precision");
    if (v->backend) return k3c_errf(err, K3C_EINVAL, "vision_use_backend: the tower already left the host");
    if (be == k3c_backend_cpu()) return K3C_OK; /* the CPU's memory is the host's */
    const size_t bytes = v->total * sizeof(real);
    real *w = be->alloc(bytes), *g = v->g ? be->alloc(bytes) : NULL;
    int rc = !w || (v->g && !g) ? k3c_errf(err, K3C_ENOMEM, "vision_use_backend: %s: out of memory", be->name) : K3C_OK;
    if (!rc) rc = be->upload(w, v->w, bytes, err);
    if (!rc && g) rc = be->upload(g, v->g, bytes, err);
    if (!rc) rc = be->sync(err);
    if (rc) {
        if (w) be->free(w);
        if (g) be->free(g);
        return rc;
    }
    free(v->w);
    free(v->g);
    v->w = w;
    v->g = g;
    v->backend = be;
    v->bfree = be->free;
    return K3C_OK;
}
