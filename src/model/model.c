/* model.c — model lifetime: parameters in one flat buffer under checkpoint names; random init for training from scratch
 * (docs/MODEL.md §3.1 init table, §5.1, §10), loading from Hugging Face checkpoints (docs/FORMATS.md §5–§7), saving. */
#include "base/real.h"
#include "model/weights.h"
#include "model/model.h"
#include "ops/backend.h"
#include "ops/mxfp4.h"
#include "base/carve.h"

#include <stdlib.h>
#include <string.h>

const k3c_backend *k3c_model_backend(const k3c_model *m) {
    return m->backend ? (const k3c_backend *)m->backend : k3c_backend_cpu();
}

int k3c_model_download(const k3c_model *m, void *host_dst, const void *src, size_t bytes, k3c_err *err) {
    return k3c_model_backend(m)->download(host_dst, src, bytes, err);
}

int k3c_model_create(const k3c_config *cfg, int with_grad, k3c_model *m, k3c_err *err) {
    const k3c_residency whole = k3c_residency_whole(cfg);
    return k3c_model_create_resident(cfg, with_grad, &whole, m, err);
}

int k3c_model_create_resident(const k3c_config *cfg, int with_grad, const k3c_residency *r, k3c_model *m,
                              k3c_err *err) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->precision = REAL_DTYPE;
    m->kda_chunk = 64;
    int rc = k3c_params_build_resident(cfg, r, &m->table, err);
    if (rc) return rc;
    size_t bytes = m->table.total * sizeof(real); /* < 2^63 elements (params.c), the product checked here */
    if (m->table.total > SIZE_MAX / (2 * sizeof(real))) {
        k3c_model_free(m);
        return k3c_errf(err, K3C_ECONFIG, "model: %zu parameters do not fit in memory", m->table.total);
    }
    if ((rc = k3c_mem_check((uint64_t)bytes * (with_grad ? 2u : 1u),
                            with_grad ? "model (weights and gradients)" : "model (weights)", err))) {
        k3c_model_free(m);
        return rc;
    }
    m->w = k3c_aligned_alloc(bytes);
    m->g = with_grad ? k3c_aligned_alloc(bytes) : NULL;
    if (!m->w || (with_grad && !m->g)) {
        k3c_model_free(m);
        return k3c_errf(err, K3C_ENOMEM, "model: cannot allocate %zu bytes of parameters", bytes);
    }
    return K3C_OK;
}

void k3c_model_free(k3c_model *m) {
    const k3c_backend *be = k3c_model_backend(m);
    if (be->sync(NULL) == K3C_OK || !m->backend) { /* never free memory a device may still be using */
        be->free(m->w);
        be->free(m->g);
    }
    k3c_params_free(&m->table);
    k3c_arena_free(&m->meta);
    if (m->views) k3c_weights_free(m->views);
    free(m->views);
    memset(m, 0, sizeof *m);
}

const k3c_weights *k3c_model_views(k3c_model *m, k3c_err *err) {
    if (m->views && m->views_of == m->w) return m->views;
    if (!m->views && !(m->views = calloc(1, sizeof *m->views))) {
        k3c_errf(err, K3C_ENOMEM, "model: out of memory");
        return NULL;
    }
    k3c_weights_free(m->views);
    m->views_of = NULL;
    if (k3c_weights_of_params(&m->cfg, &m->table, m->w, sizeof(real), NULL, m->views, err)) return NULL;
    m->views_of = m->w;
    return m->views;
}

int k3c_model_check_backend(const k3c_model *m, const void *bev, k3c_err *err) {
    const k3c_backend *be = bev ? (const k3c_backend *)bev : k3c_backend_cpu();
    int kda = 0;
    for (int l = 0; l < m->cfg.num_layers; l++) kda |= m->cfg.mixer[l] == K3C_MIXER_KDA;
    if (kda && !be->supports(K3C_FEATURE_KDA_CHUNK, m->kda_chunk))
        return k3c_errf(err, K3C_EUNSUPPORTED, "model: the %s backend does not support %s = %d%s", be->name,
                        k3c_backend_feature_name(K3C_FEATURE_KDA_CHUNK), m->kda_chunk,
                        m->kda_chunk ? "" : " (token recurrence)");
    return K3C_OK;
}

int k3c_model_use_backend(k3c_model *m, const k3c_backend *bev, k3c_err *err) {
    const k3c_backend *from = k3c_model_backend(m), *to = bev ? (const k3c_backend *)bev : k3c_backend_cpu();
    int rc = k3c_model_check_backend(m, to, err);
    if (rc) return rc;
    if (from == to) return K3C_OK;
    rc = from->sync(err);
    if (rc) return rc;
    size_t bytes = m->table.total * sizeof(real);
    real *w = to->alloc(bytes), *g = m->g ? to->alloc(bytes) : NULL;
    if (!w || (m->g && !g)) {
        if (w) to->free(w);
        if (g) to->free(g);
        return k3c_errf(err, K3C_ENOMEM, "model: cannot allocate %zu bytes of parameters on the %s backend", bytes,
                        to->name);
    }
    /* through the host: either side may be memory the other cannot address */
    real *host = malloc(bytes);
    rc = host ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "model: cannot stage %zu bytes of parameters", bytes);
    if (!rc && !(rc = from->download(host, m->w, bytes, err))) rc = to->upload(w, host, bytes, err);
    if (!rc && g && !(rc = from->download(host, m->g, bytes, err))) rc = to->upload(g, host, bytes, err);
    if (!rc) rc = to->sync(err); /* host is freed next */
    free(host);
    if (rc) {
        to->free(w);
        if (g) to->free(g);
        return rc;
    }
    from->free(m->w);
    from->free(m->g);
    m->w = w;
    m->g = g;
    m->backend = bev;
    return K3C_OK;
}

int k3c_model_arena_init(const k3c_model *m, size_t cap, k3c_arena *a, k3c_err *err) {
    void *mem = k3c_model_backend(m)->alloc(cap);
    if (!mem) return k3c_errf(err, K3C_ENOMEM, "model: cannot allocate %zu bytes of activations", cap);
    k3c_arena_init_from(a, mem, cap);
    return K3C_OK;
}

void k3c_model_arena_free(const k3c_model *m, k3c_arena *a) {
    const k3c_backend *be = k3c_model_backend(m);
    if (a->base && (be->sync(NULL) == K3C_OK || !m->backend)) be->free(a->base);
    memset(a, 0, sizeof *a);
}

/* One plan for measuring and carving: the topk_ids of every MoE layer and qk_clipped first (the telemetry the host
 * downloads each step, one contiguous range), then logits, cutoffs and S_max. */
static void stats_plan(const k3c_model *m, int64_t T, k3c_carver *c, k3c_step_stats *s) {
    const k3c_config *cfg = &m->cfg;
    const int64_t n = cfg->num_experts, k = cfg->top_k;
    for (int l = 0; l < cfg->num_layers; l++)
        if (cfg->ffn[l] == K3C_FFN_MOE) s->route[l].topk_ids = K3C_CARVE(c, int32_t, T * k);
    s->qk_clipped = K3C_CARVE(c, int32_t, 1);
    s->telemetry_bytes = c->off;
    for (int l = 0; l < cfg->num_layers; l++)
        if (cfg->ffn[l] == K3C_FFN_MOE) {
            s->route[l].logits = K3C_CARVE(c, float, T *n);
            s->route[l].cutoff = K3C_CARVE(c, float, T);
        }
    const int64_t heads = k3c_config_num_mla(cfg) ? cfg->mla_heads : 0;
    s->smax = heads ? K3C_CARVE(c, float, cfg->num_layers *heads) : NULL;
}

int k3c_step_stats_init(const k3c_model *m, int64_t T, k3c_step_stats *s, k3c_err *err) {
    memset(s, 0, sizeof *s);
    k3c_carver c = k3c_carver_measure(64);
    stats_plan(m, T, &c, s);
    memset(s, 0, sizeof *s);
    s->mem = k3c_model_backend(m)->alloc(c.off);
    if (!s->mem) return k3c_errf(err, K3C_ENOMEM, "step statistics: cannot allocate %zu bytes", c.off);
    c = k3c_carver_at(s->mem, c.off, 64);
    stats_plan(m, T, &c, s);
    s->cap_T = T;
    return K3C_OK;
}

void k3c_step_stats_free(const k3c_model *m, k3c_step_stats *s) {
    const k3c_backend *be = k3c_model_backend(m);
    if (s->mem && (be->sync(NULL) == K3C_OK || !m->backend)) be->free(s->mem);
    memset(s, 0, sizeof *s);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Projections that write into the residual stream get std / sqrt(2·layers) (GPT-2 style), so the stream's variance
 * does not grow with depth at init. */
static int is_output_proj(const char *name) {
    if (ends_with(name, "routed_expert_down_proj.weight")) return 0; /* W↓ reads the stream, it does not write it */
    return ends_with(name, "o_proj.weight") || ends_with(name, "down_proj.weight") || ends_with(name, ".w2.weight") ||
           ends_with(name, "routed_expert_up_proj.weight");
}

/* The random draw of element j of entry p: its index in the whole model's entry (j0: where the held experts start). */
static uint64_t at(const k3c_param_table *t, const k3c_param *p, uint64_t j0, int64_t j) {
    return j0 + (uint64_t)k3c_param_whole_index(t, p, j);
}

void k3c_model_init(k3c_model *m, uint64_t seed, double std) {
    real *w = m->w;
    const k3c_config *c = &m->cfg;
    double out_std = std / sqrt(2.0 * (double)(c->num_layers > 0 ? c->num_layers : 1));
    for (int i = 0; i < m->table.n; i++) {
        const k3c_param *p = &m->table.p[i];
        real *x = w + p->offset;
        uint64_t s =
            seed * 1000003u + (uint64_t)i; /* one stream per tensor: init does not depend on order or threads */
        /* the held experts and tensor-parallel shares draw the elements the whole model's entry gives them */
        const uint64_t j0 = (uint64_t)(p->stack0 * k3c_param_slice_numel(p));
        const char *n = p->name;
        if (p->kind == K3C_PK_ROUTER_BIAS || ends_with(n, "res_proj.weight")) {
            memset(x, 0, (size_t)p->numel * sizeof *x); /* QB starts from b = 0; AttnRes queries 0 → uniform mix */
        } else if (ends_with(n, "norm.weight")) {
            for (int64_t j = 0; j < p->numel; j++) x[j] = 1;
        } else if (ends_with(n, "A_log")) {
            for (int64_t j = 0; j < p->numel; j++) /* lower-bound gate: A = 0 (fla safe_gate); softplus: log U(1,16) */
                x[j] = j >= p->used ? 0
                       : c->kda_gate == K3C_GATE_LOWER_BOUND
                           ? 0
                           : (real)log(1.0 + 15.0 * k3c_uniform_at(s, at(&m->table, p, j0, j)));
        } else if (ends_with(n, "dt_bias")) {
            for (int64_t j = 0; j < p->numel; j++) { /* fla: softplus⁻¹(dt), dt = exp(U(log 1e-3, log 0.1)) ≥ 1e-4 */
                double dt = exp(log(1e-3) + (log(0.1) - log(1e-3)) * k3c_uniform_at(s, at(&m->table, p, j0, j)));
                if (dt < 1e-4) dt = 1e-4;
                x[j] = (real)(dt + log(-expm1(-dt)));
            }
        } else if (ends_with(n, "conv1d.weight")) {
            double bound = 1.0 / sqrt((double)c->conv_kernel); /* nn.Conv1d default (fan_in = kernel for depthwise) */
            for (int64_t j = 0; j < p->numel; j++)
                x[j] = (real)(bound * (2 * k3c_uniform_at(s, at(&m->table, p, j0, j)) - 1));
        } else {
            double sd = is_output_proj(n) ? out_std : std;
            for (int64_t j = 0; j < p->numel; j++) x[j] = (real)(sd * k3c_normal_at(s, at(&m->table, p, j0, j)));
        }
    }
}

static int read_real(const k3c_st_tensor *t, real *dst, size_t n, k3c_err *err) {
#if K3C_REAL_DOUBLE
    return k3c_st_read_f64(t, dst, n, err);
#else
    return k3c_st_read_f32(t, dst, n, err);
#endif
}

/* Reads one checkpoint tensor into slice `e` of entry p (shape must match; MXFP4 pairs decoded). */
static int load_one(k3c_model *m, const k3c_checkpoint *ck, const k3c_st_tensor *t, const k3c_param *p, int e,
                    int packed, k3c_err *err) {
    real *dst = (real *)m->w + p->offset + (e > 0 ? (size_t)e * (size_t)k3c_param_slice_numel(p) : 0);
    size_t n = (size_t)k3c_param_slice_numel(p);
    if (packed) {
        char scale_name[K3C_PARAM_NAME + 32];
        snprintf(scale_name, sizeof scale_name, "%.*s.weight_scale", (int)(strlen(t->name) - strlen(".weight_packed")),
                 t->name);
        const k3c_st_tensor *sc = k3c_ckpt_find(ck, scale_name);
        if (!sc) return k3c_errf(err, K3C_EFORMAT, "%s: %s has no %s", t->file, t->name, scale_name);
        int64_t rows, cols;
#if K3C_REAL_DOUBLE
        int rc = k3c_mxfp4_decode_st_f64(t, sc, dst, n, &rows, &cols, err);
#else
        int rc = k3c_mxfp4_decode_st_f32(t, sc, dst, n, &rows, &cols, err);
#endif
        if (rc) return rc;
        if (rows != p->shape[0] || cols != p->shape[1])
            return k3c_errf(err, K3C_EFORMAT, "%s: %s decodes to [%lld, %lld], expected [%lld, %lld]", t->file, t->name,
                            (long long)rows, (long long)cols, (long long)p->shape[0], (long long)p->shape[1]);
        return K3C_OK;
    }
    const int64_t *want_shape = p->whole_shape; /* a tensor-parallel share reads its part of the whole tensor */
    int same = t->ndim == p->ndim;
    for (int i = 0; same && i < p->ndim; i++) same = t->shape[i] == want_shape[i];
    if (!same) {
        char want[96] = "", got[96] = "";
        for (int i = 0; i < p->ndim; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? "," : "", (long long)want_shape[i]);
        for (int i = 0; i < t->ndim; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? "," : "", (long long)t->shape[i]);
        return k3c_errf(err, K3C_EFORMAT, "%s: tensor %s has shape [%s], the config implies [%s]", t->file, t->name,
                        got, want);
    }
    if (!p->tp_share) return read_real(t, dst, n, err);
    real *whole = malloc(sizeof(real) * (size_t)p->whole_numel);
    if (!whole) return k3c_errf(err, K3C_ENOMEM, "%s: %s: out of memory", t->file, t->name);
    int rc = read_real(t, whole, (size_t)p->whole_numel, err);
    if (!rc) k3c_param_share_copy(p, m->table.res.tp_rank, sizeof(real), whole, dst, 0);
    free(whole);
    return rc;
}

int k3c_model_load(k3c_model *m, const k3c_checkpoint *ck, k3c_err *err) {
    const k3c_param_table *tab = &m->table;
    /* one flag per slice: every parameter must come from the checkpoint */
    size_t *base = calloc((size_t)tab->n + 1, sizeof *base);
    if (!base) return k3c_errf(err, K3C_ENOMEM, "load: out of memory");
    for (int i = 0; i < tab->n; i++) base[i + 1] = base[i] + (size_t)(tab->p[i].stack ? tab->p[i].stack : 1);
    unsigned char *seen = calloc(base[tab->n] + 1, 1);
    if (!seen) {
        free(base);
        return k3c_errf(err, K3C_ENOMEM, "load: out of memory");
    }
    int rc = K3C_OK;
    for (int i = 0; i < k3c_ckpt_count(ck) && !rc; i++) {
        const k3c_st_tensor *t = k3c_ckpt_at(ck, i);
        if (ends_with(t->name, ".weight_scale")) continue; /* read with its weight_packed partner */
        if (m->cfg.vision.present && (!strncmp(t->name, "vision_tower.", 13) || !strncmp(t->name, "mm_projector.", 13)))
            continue; /* the vision tower is a separate parameter set: k3c_vision_load (src/vision/load.c) */
        int packed = ends_with(t->name, ".weight_packed");
        char name[K3C_PARAM_NAME + 32];
        snprintf(name, sizeof name, "%.*s%s", (int)(strlen(t->name) - (packed ? strlen("_packed") : 0)), t->name, "");
        int e, j = k3c_params_lookup(tab, name, &e);
        if (j == K3C_PARAM_NOT_HELD) continue; /* another rank's expert or layer (docs/PARALLEL.md "Residency") */
        if (j < 0) {
            rc = k3c_errf(err, K3C_EFORMAT, "%s: unexpected tensor %s (not in the model the config describes)", t->file,
                          t->name);
            break;
        }
        size_t slot = base[j] + (size_t)(e > 0 ? e : 0);
        if (seen[slot]) {
            rc = k3c_errf(err, K3C_EFORMAT, "%s: tensor %s given twice", t->file, t->name);
            break;
        }
        seen[slot] = 1;
        rc = load_one(m, ck, t, &tab->p[j], e, packed, err);
    }
    for (int i = 0; i < tab->n && !rc; i++)
        for (int64_t e = 0; !tab->p[i].absent && e < (tab->p[i].stack ? tab->p[i].stack : 1) && !rc; e++)
            if (!seen[base[i] + (size_t)e]) {
                char name[K3C_PARAM_NAME + 16];
                k3c_params_name(&tab->p[i], e, name, sizeof name);
                rc = k3c_errf(err, K3C_EFORMAT, "checkpoint is missing tensor %s (no file of it holds it)", name);
            }
    free(seen);
    free(base);
    return rc;
}

int k3c_model_save_range(const k3c_model *m, const char *path, int e0, int e1, k3c_err *err) {
    return k3c_model_save_entries(m, path, e0, e1, 0, err);
}

int k3c_model_save_entries(const k3c_model *m, const char *path, int e0, int e1, int experts_only, k3c_err *err) {
    const k3c_param_table *tab = &m->table;
    if (tab->res.tp_size > 1)
        return k3c_errf(
            err, K3C_EINVAL,
            "%s: the model holds tensor-parallel share %d of %d; the whole tensors are gathered over the TP "
            "group first (k3c_tp_gather_whole)",
            path, tab->res.tp_rank, tab->res.tp_size);
    const size_t off0 = e0 < tab->n ? tab->p[e0].offset : tab->total,
                 off1 = e1 < tab->n ? tab->p[e1].offset : tab->total;
    /* the parameters may be backend memory the host cannot address: download them first */
    real *host = malloc((off1 - off0) * sizeof *host + 1);
    float *conv = K3C_REAL_DOUBLE ? malloc((off1 - off0) * sizeof *conv + 1) : (float *)host;
    int rc = !host || !conv ? k3c_errf(err, K3C_ENOMEM, "%s: out of memory", path) : K3C_OK;
    if (!rc) rc = k3c_model_backend(m)->download(host, (const real *)m->w + off0, (off1 - off0) * sizeof *host, err);
    for (size_t i = 0; !rc && K3C_REAL_DOUBLE && i < off1 - off0; i++) conv[i] = (float)host[i];
    if (!rc) rc = k3c_params_write(tab, conv, path, e0, e1, experts_only, err);
    if (conv != (float *)host) free(conv);
    free(host);
    return rc;
}

int k3c_model_save(const k3c_model *m, const char *path, k3c_err *err) {
    return k3c_model_save_range(m, path, 0, m->table.n, err);
}

int k3c_model_open(const char *dir, int with_grad, k3c_model *m, k3c_err *err) {
    memset(m, 0, sizeof *m);
    k3c_config cfg;
    int rc = k3c_config_load(dir, &cfg, err);
    if (rc) return rc;
    k3c_checkpoint *ck = NULL;
    rc = k3c_ckpt_open(dir, &ck, err);
    if (rc) return rc;
    rc = k3c_model_create(&cfg, with_grad, m, err);
    if (!rc) {
        rc = k3c_model_load(m, ck, err);
        if (rc) k3c_model_free(m);
    }
    k3c_ckpt_close(ck);
    return rc;
}

int k3c_model_load_dir(const char *dir, int with_grad, k3c_model **out, k3c_err *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", dir);
    int rc = k3c_model_open(dir, with_grad, *out, err);
    if (rc) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

void k3c_model_close(k3c_model *m) {
    if (!m) return;
    k3c_model_free(m);
    free(m);
}
