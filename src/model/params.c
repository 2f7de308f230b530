/* params.c — builds the parameter inventory of a Kimi-Linear / Kimi-K3 model from its config, in checkpoint order and
 * under checkpoint names (docs/FORMATS.md §5.1–5.2), with the optimizer metadata of docs/MODEL.md §10. */
#include "model/params.h"
#include "base/check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    k3c_param_table *t;
    const k3c_config *cfg;
    int layer;
    char scope[96]; /* "model.layers.3." etc. (without the config prefix) */
    int64_t e0, n;  /* the residency: the routed experts the stacked entries hold ... */
    int l0, l1;     /* ... and the layers (docs/PARALLEL.md "Residency") */
    int global_at;  /* the layer a global entry goes with: 0 for the embedding, the last for the head */
    int oom;
    char overflow[K3C_PARAM_NAME]; /* the first entry whose size overflows int64, "" while none does */
    k3c_param scratch;
} builder;

/* Adds an entry of `stack` slices (0: one, unstacked) of shape d[0..ndim); sizes are computed with overflow checks. */
static size_t add_stacked(builder *b, const char *leaf, int kind, int ndim, const int64_t d[4], int64_t stack) {
    k3c_param_table *t = b->t;
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 256;
        k3c_param *p = realloc(t->p, (size_t)cap * sizeof *p);
        if (!p) {
            b->oom = 1;
            return K3C_NOPARAM;
        }
        t->p = p;
        t->cap = cap;
    }
    k3c_param *p = &t->p[t->n++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s%s%s", b->cfg->tensor_prefix, b->scope, leaf);
    p->ndim = ndim;
    p->stack = stack;
    int64_t numel = stack ? stack : 1, total;
    int ok = stack >= 0;
    for (int i = 0; i < ndim; i++) {
        p->shape[i] = d[i];
        ok = ok && d[i] >= 0 && k3c_mul_ok(numel, d[i], &numel);
    }
    ok = ok && k3c_add_ok((int64_t)t->total, numel, &total);
    if (!ok && !b->overflow[0]) snprintf(b->overflow, sizeof b->overflow, "%s", p->name);
    /* outside the held layers (global entries: the embedding before the first, the head after the last) */
    const int at = b->layer >= 0 ? b->layer : b->global_at;
    p->absent = (uint8_t)(at < b->l0 || at >= b->l1);
    ok = ok && !p->absent; /* an absent entry: no elements here */
    p->numel = ok ? numel : 0;
    p->used = p->numel;
    p->kind = (uint8_t)kind;
    p->layer = b->layer;
    p->offset = t->total;
    if (ok) t->total = (size_t)total;
    return p->offset;
}

static size_t add(builder *b, const char *leaf, int kind, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    const int64_t d[4] = {d0, d1, d2, d3};
    return add_stacked(b, leaf, kind, ndim, d, 0);
}

#define MAT(leaf, o, i) add(b, leaf, K3C_PK_MATRIX, 2, o, i, 0, 0)
#define VEC(leaf, n) add(b, leaf, K3C_PK_VECTOR, 1, n, 0, 0, 0)

/* The entry just added (the builder's scratch entry after an allocation failure, so callers need not check). */
static k3c_param *last(builder *b) { return b->oom || b->t->n == 0 ? &b->scratch : &b->t->p[b->t->n - 1]; }

static void kda_params(builder *b, k3c_layer_offsets *o) {
    const k3c_config *c = b->cfg;
    int64_t D = c->hidden_size, H = c->kda_heads, dk = c->kda_head_dim, P = H * dk, W = c->conv_kernel;
    o->q_proj = MAT("self_attn.q_proj.weight", P, D);
    last(b)->head_rows = dk;
    o->k_proj = MAT("self_attn.k_proj.weight", P, D);
    last(b)->head_rows = dk;
    o->v_proj = MAT("self_attn.v_proj.weight", P, D);
    last(b)->head_rows = dk;
    o->q_conv = add(b, "self_attn.q_conv1d.weight", K3C_PK_VECTOR, 3, P, 1, W, 0);
    o->k_conv = add(b, "self_attn.k_conv1d.weight", K3C_PK_VECTOR, 3, P, 1, W, 0);
    o->v_conv = add(b, "self_attn.v_conv1d.weight", K3C_PK_VECTOR, 3, P, 1, W, 0);
    o->f_a = MAT("self_attn.f_a_proj.weight", dk, D);
    o->f_b = MAT("self_attn.f_b_proj.weight", P, dk);
    if (strcmp(c->model_type, "kimi_k3") == 0) {
        /* K3 stores A_log padded to max(head_dim, H) entries; only the first H are read (docs/FORMATS.md §7 #1). */
        o->A_log = VEC("self_attn.A_log", dk > H ? dk : H);
        if (!last(b)->absent) last(b)->used = H;
    } else {
        o->A_log = add(b, "self_attn.A_log", K3C_PK_VECTOR, 4, 1, 1, H, 1);
    }
    o->dt_bias = VEC("self_attn.dt_bias", P);
    o->b_proj = MAT("self_attn.b_proj.weight", H, D);
    if (c->kda_full_rank_gate) {
        o->g_proj = MAT("self_attn.g_proj.weight", P, D);
    } else {
        o->g_a = MAT("self_attn.g_a_proj.weight", dk, D);
        o->g_b = MAT("self_attn.g_b_proj.weight", P, dk);
    }
    o->o_norm = VEC("self_attn.o_norm.weight", dk);
    o->o_proj = MAT("self_attn.o_proj.weight", D, P);
}

static void mla_params(builder *b, k3c_layer_offsets *o) {
    const k3c_config *c = b->cfg;
    int64_t D = c->hidden_size, H = c->mla_heads, dqk = c->qk_nope_dim + c->qk_rope_dim, dv = c->v_head_dim;
    if (c->q_lora_rank > 0) {
        o->q_a = MAT("self_attn.q_a_proj.weight", c->q_lora_rank, D);
        o->q_a_norm = VEC("self_attn.q_a_layernorm.weight", c->q_lora_rank);
        o->q_b = MAT("self_attn.q_b_proj.weight", H * dqk, c->q_lora_rank);
        last(b)->head_rows = dqk;
    } else {
        o->q_proj = MAT("self_attn.q_proj.weight", H * dqk, D);
        last(b)->head_rows = dqk;
    }
    o->kv_a = MAT("self_attn.kv_a_proj_with_mqa.weight", c->kv_lora_rank + c->qk_rope_dim, D);
    o->kv_a_norm = VEC("self_attn.kv_a_layernorm.weight", c->kv_lora_rank);
    o->kv_b = MAT("self_attn.kv_b_proj.weight", H * (c->qk_nope_dim + dv), c->kv_lora_rank);
    last(b)->head_rows = c->qk_nope_dim + dv;
    if (c->mla_output_gate) o->g_proj = MAT("self_attn.g_proj.weight", H * dv, D);
    o->o_proj = MAT("self_attn.o_proj.weight", D, H * dv);
}

static void ffn_params(builder *b, k3c_layer_offsets *o, int moe) {
    const k3c_config *c = b->cfg;
    int64_t D = c->hidden_size;
    if (!moe) {
        int64_t I = c->intermediate_size;
        o->mlp_gate = MAT("mlp.gate_proj.weight", I, D);
        o->mlp_up = MAT("mlp.up_proj.weight", I, D);
        o->mlp_down = MAT("mlp.down_proj.weight", D, I);
        return;
    }
    int64_t E = c->num_experts, I = c->moe_intermediate_size, L = c->latent_dim > 0 ? c->latent_dim : D;
    o->router = MAT("block_sparse_moe.gate.weight", E, D);
    o->router_bias = add(b, "block_sparse_moe.gate.e_score_correction_bias", K3C_PK_ROUTER_BIAS, 1, E, 0, 0, 0);
    if (c->latent_dim > 0) {
        o->latent_down = MAT("block_sparse_moe.routed_expert_down_proj.weight", c->latent_dim, D);
        if (c->latent_norm) o->latent_norm = VEC("block_sparse_moe.routed_expert_norm.weight", c->latent_dim);
        o->latent_up = MAT("block_sparse_moe.routed_expert_up_proj.weight", D, c->latent_dim);
    }
    if (c->num_shared_experts > 0) {
        int64_t S = I * c->num_shared_experts;
        o->shared_gate = MAT("block_sparse_moe.shared_experts.gate_proj.weight", S, D);
        o->shared_up = MAT("block_sparse_moe.shared_experts.up_proj.weight", S, D);
        o->shared_down = MAT("block_sparse_moe.shared_experts.down_proj.weight", D, S);
    }
    /* Routed experts stacked [E, out, in] so one op sees them all; checkpoint names are per expert. */
    static const char *leaf[3] = {"w1", "w3", "w2"};
    size_t *dst[3] = {&o->w1, &o->w3, &o->w2};
    for (int k = 0; k < 3; k++) {
        char name[64];
        snprintf(name, sizeof name, "block_sparse_moe.experts.%%d.%s.weight", leaf[k]);
        const int64_t shape[4] = {k < 2 ? I : L, k < 2 ? L : I, 0, 0};
        *dst[k] = add_stacked(b, name, K3C_PK_MATRIX, 2, shape, b->n);
        last(b)->mxfp4 = (uint8_t)c->experts_mxfp4;
        last(b)->stack0 = b->e0;
    }
}

static void init_offsets(k3c_layer_offsets *o) {
    size_t *f = (size_t *)o;
    for (size_t i = 0; i < sizeof *o / sizeof(size_t); i++) f[i] = K3C_NOPARAM;
}

static int build_index(k3c_param_table *t);

k3c_residency k3c_residency_whole(const k3c_config *cfg) {
    return (k3c_residency){0, cfg->num_experts, 0, (int)cfg->num_layers, 0, 1};
}

int k3c_params_build(const k3c_config *cfg, k3c_param_table *t, k3c_err *err) {
    const k3c_residency whole = k3c_residency_whole(cfg);
    return k3c_params_build_resident(cfg, &whole, t, err);
}

int k3c_params_build_resident(const k3c_config *cfg, const k3c_residency *r, k3c_param_table *t, k3c_err *err) {
    memset(t, 0, sizeof *t);
    /* the bounds of the validator keep every derived width (heads × head_dim, ...) far from overflowing */
    CHECK_RC(k3c_config_validate(cfg, "params: config", err));
    const int64_t e0 = r->expert0, n = r->experts;
    if (e0 < 0 || n < (cfg->num_experts > 0) || e0 > cfg->num_experts - n)
        return k3c_errf(err, K3C_EINVAL, "params: experts [%lld, %lld) of a model of %lld", (long long)e0,
                        (long long)(e0 + n), (long long)cfg->num_experts);
    if (r->layer0 < 0 || r->layer0 >= r->layer1 || r->layer1 > cfg->num_layers)
        return k3c_errf(err, K3C_EINVAL, "params: layers [%d, %d) of a model of %lld", r->layer0, r->layer1,
                        (long long)cfg->num_layers);
    const int tp = r->tp_size > 1 ? r->tp_size : 1;
    if (r->tp_rank < 0 || r->tp_rank >= tp)
        return k3c_errf(err, K3C_EINVAL, "params: tensor-parallel share %d of %d", r->tp_rank, tp);
    t->layer = malloc((size_t)(cfg->num_layers > 0 ? cfg->num_layers : 1) * sizeof *t->layer);
    if (!t->layer) return k3c_errf(err, K3C_ENOMEM, "params: out of memory");
    t->experts = cfg->num_experts, t->res = *r;
    t->res.tp_size = tp;
    builder bb = {.t = t, .cfg = cfg, .layer = -1, .e0 = e0, .n = n, .l0 = r->layer0, .l1 = r->layer1}, *b = &bb;
    int64_t D = cfg->hidden_size, V = cfg->vocab_size;
    k3c_global_offsets *g = &t->glob;
    snprintf(b->scope, sizeof b->scope, "model.");
    g->embed = add(b, "embed_tokens.weight", K3C_PK_EMBED, 2, V, D, 0, 0);
    for (int l = 0; l < cfg->num_layers; l++) {
        k3c_layer_offsets *o = &t->layer[l];
        init_offsets(o);
        b->layer = l;
        snprintf(b->scope, sizeof b->scope, "model.layers.%d.", l);
        o->input_norm = VEC("input_layernorm.weight", D);
        o->post_norm = VEC("post_attention_layernorm.weight", D);
        if (cfg->attn_res_block > 0) {
            o->attn_res_norm = VEC("self_attention_res_norm.weight", D);
            o->attn_res_proj = add(b, "self_attention_res_proj.weight", K3C_PK_VECTOR, 2, 1, D, 0, 0);
            o->mlp_res_norm = VEC("mlp_res_norm.weight", D);
            o->mlp_res_proj = add(b, "mlp_res_proj.weight", K3C_PK_VECTOR, 2, 1, D, 0, 0);
        }
        if (cfg->mixer[l] == K3C_MIXER_KDA)
            kda_params(b, o);
        else
            mla_params(b, o);
        ffn_params(b, o, cfg->ffn[l] == K3C_FFN_MOE);
    }
    b->layer = -1;
    b->global_at = (int)cfg->num_layers - 1;
    snprintf(b->scope, sizeof b->scope, "model.");
    g->final_norm = VEC("norm.weight", D);
    g->out_res_norm = g->out_res_proj = K3C_NOPARAM;
    if (cfg->attn_res_block > 0) {
        g->out_res_norm = VEC("output_attn_res_norm.weight", D);
        g->out_res_proj = add(b, "output_attn_res_proj.weight", K3C_PK_VECTOR, 2, 1, D, 0, 0);
    }
    b->scope[0] = 0;
    g->lm_head = add(b, "lm_head.weight", K3C_PK_HEAD, 2, V, D, 0, 0);
    if (b->overflow[0]) {
        k3c_params_free(t);
        return k3c_errf(err, K3C_ECONFIG, "params: %s: the model has more than 2^63 parameters", b->overflow);
    }
    int cut = b->oom ? -1 : k3c_params_tp_split(t, cfg, tp);
    if (cut > 0) {
        char name[K3C_PARAM_NAME];
        snprintf(name, sizeof name, "%s", t->p[cut - 1].name);
        k3c_params_free(t);
        return k3c_errf(err, K3C_ECONFIG, "params: tensor parallelism over %d ranks does not divide %s", tp, name);
    }
    if (cut || build_index(t)) {
        k3c_params_free(t);
        return k3c_errf(err, K3C_ENOMEM, "params: out of memory");
    }
    return K3C_OK;
}

void k3c_params_free(k3c_param_table *t) {
    free(t->p);
    free(t->slot);
    free(t->layer);
    memset(t, 0, sizeof *t);
}

void k3c_params_name(const k3c_param *p, int64_t expert, char *buf, size_t n) {
    if (p->stack) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        snprintf(buf, n, p->name, (int)(p->stack0 + expert));
#pragma GCC diagnostic pop
    } else {
        snprintf(buf, n, "%s", p->name);
    }
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Index of entry names for loading checkpoints of ~500k tensors (a linear scan per tensor would be quadratic). */
static int build_index(k3c_param_table *t) {
    int n = 16;
    while (n < 2 * t->n + 2) n *= 2;
    t->slot = malloc(sizeof(int) * (size_t)n);
    if (!t->slot) return -1;
    t->n_slots = n;
    for (int i = 0; i < n; i++) t->slot[i] = -1;
    for (int i = 0; i < t->n; i++) {
        uint64_t h = name_hash(t->p[i].name);
        int j = (int)(h & (uint64_t)(n - 1));
        while (t->slot[j] >= 0) j = (j + 1) & (n - 1);
        t->slot[j] = i;
    }
    return 0;
}

static int find_exact(const k3c_param_table *t, const char *name) {
    int n = t->n_slots, j = (int)(name_hash(name) & (uint64_t)(n - 1));
    for (; t->slot[j] >= 0; j = (j + 1) & (n - 1))
        if (strcmp(t->p[t->slot[j]].name, name) == 0) return t->slot[j];
    return -1;
}

int k3c_params_lookup(const k3c_param_table *t, const char *name, int *expert) {
    char alt[K3C_PARAM_NAME + 32], pat[K3C_PARAM_NAME + 32];
    const char *dense = strstr(name, ".block_sparse_moe.");
    if (dense &&
        (strstr(dense, "_moe.gate_proj.") || strstr(dense, "_moe.up_proj.") || strstr(dense, "_moe.down_proj."))) {
        /* transformers saves the dense layer-0 MLP under block_sparse_moe.* (golden/README.md) */
        snprintf(alt, sizeof alt, "%.*s.mlp.%s", (int)(dense - name), name, dense + strlen(".block_sparse_moe."));
        name = alt;
    }
    if (expert) *expert = -1;
    int i = find_exact(t, name);
    if (i >= 0) return t->p[i].stack ? -1 : t->p[i].absent ? K3C_PARAM_NOT_HELD : i;
    /* a routed expert: "...experts.<e>.w1.weight" is slice e of the entry named "...experts.%d.w1.weight" */
    const char *ex = strstr(name, ".experts.");
    if (!ex) return -1;
    const char *d = ex + strlen(".experts."), *end = d;
    while (*end >= '0' && *end <= '9') end++;
    if (end == d || *end != '.' || (end - d > 1 && *d == '0') || end - d > 9) return -1;
    snprintf(pat, sizeof pat, "%.*s%%d%s", (int)(d - name), name, end);
    i = find_exact(t, pat);
    long e = strtol(d, NULL, 10);
    if (i < 0 || !t->p[i].stack || e >= t->experts) return -1;
    if (t->p[i].absent || e < t->p[i].stack0 || e >= t->p[i].stack0 + t->p[i].stack)
        return K3C_PARAM_NOT_HELD; /* another rank's */
    if (expert) *expert = (int)(e - t->p[i].stack0);
    return i;
}

int64_t k3c_params_trainable(const k3c_param_table *t) {
    int64_t n = 0;
    for (int i = 0; i < t->n; i++)
        if (t->p[i].kind != K3C_PK_ROUTER_BIAS) n += t->p[i].used;
    return n;
}

int k3c_params_write(const k3c_param_table *t, const float *x, const char *path, int e0, int e1, int experts_only,
                     k3c_err *err) {
    const size_t off0 = e0 < t->n ? t->p[e0].offset : t->total;
    int n = 0;
    for (int i = e0; i < e1; i++) n += t->p[i].absent ? 0 : (int)(t->p[i].stack ? t->p[i].stack : !experts_only);
    k3c_st_entry *ent = calloc((size_t)n + 1, sizeof *ent);
    char(*names)[K3C_PARAM_NAME + 16] = calloc((size_t)n + 1, sizeof *names);
    if (!ent || !names) {
        free(ent);
        free(names);
        return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", path);
    }
    int k = 0;
    for (int i = e0; i < e1; i++) {
        const k3c_param *p = &t->p[i];
        for (int64_t e = 0; !p->absent && e < (p->stack ? p->stack : !experts_only); e++, k++) {
            k3c_params_name(p, p->stack ? e : -1, names[k], sizeof names[k]);
            ent[k].name = names[k];
            ent[k].dtype = K3C_F32;
            ent[k].ndim = p->ndim;
            memcpy(ent[k].shape, p->shape, sizeof p->shape);
            ent[k].data = x + (p->offset - off0) + (size_t)e * (size_t)k3c_param_slice_numel(p);
        }
    }
    static const char *const meta[] = {"format", "pt", "producer", "k3c", NULL};
    int rc = k3c_st_write(path, ent, n, meta, err);
    free(ent);
    free(names);
    return rc;
}
