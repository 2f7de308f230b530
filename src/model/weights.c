/* weights.c — the views a forward reads a model's weights through: filled by walking the layer plan over a view
 * source (a flat parameter buffer here; a checkpoint mapping in serve/weights_load.c), the per-expert view arrays the
 * weights own, and their release. docs/ENGINE.md "Weights". */
#include "model/weights.h"

#include <stdlib.h>
#include <string.h>

void *k3c_weights_alloc(k3c_weights *w, size_t bytes) {
    if (w->n_owned == w->cap_owned) {
        int cap = w->cap_owned ? 2 * w->cap_owned : 16;
        void **o = realloc(w->owned, sizeof *o * (size_t)cap);
        if (!o) return NULL;
        w->owned = o;
        w->cap_owned = cap;
    }
    void *p = k3c_aligned_alloc(bytes ? bytes : 1);
    if (p) w->owned[w->n_owned++] = p;
    return p;
}

void k3c_weights_free(k3c_weights *w) {
    for (int i = 0; i < w->n_owned; i++) k3c_aligned_free(w->owned[i]);
    for (int i = 0; i < w->n_owned_be; i++) w->be->free(w->owned_be[i]);
    free(w->owned_be);
    k3c_ckpt_close(w->ckpt);
    free(w->owned);
    memset(w, 0, sizeof *w);
}

/* E per-expert views of a stacked [E, rows, cols] parameter at offset off (slice e at off + e·rows·cols). */
static k3c_qmat *expert_views(k3c_weights *w, const k3c_weights_src *src, size_t off, int64_t E, int64_t rows,
                              int64_t cols) {
    if (off == K3C_NOPARAM) return NULL;
    k3c_qmat *v = k3c_weights_alloc(w, sizeof *v * (size_t)E);
    for (int64_t e = 0; v && e < E; e++) v[e] = src->mat(src->ctx, off + (size_t)(e * rows * cols), rows, cols);
    return v;
}

int k3c_weights_fill(k3c_weights *w, const k3c_config *c, const k3c_param_table *tab, const k3c_weights_src *src,
                     k3c_err *err) {
    const k3c_global_offsets *g = &tab->glob;
    int64_t D = c->hidden_size, V = c->vocab_size, P = c->kda_heads * c->kda_head_dim, dk = c->kda_head_dim;
    int64_t H = c->mla_heads, dqk = c->qk_nope_dim + c->qk_rope_dim, dv = c->v_head_dim, r = c->q_lora_rank;
    int64_t rkv = c->kv_lora_rank, E = c->num_experts, I = c->moe_intermediate_size;
    int64_t lat = c->latent_dim > 0 ? c->latent_dim : D, S = c->num_shared_experts * I;
    const int64_t En = tab->res.experts > 0 ? tab->res.experts : E; /* the experts the table holds (expert parallelism) */
#define MAT(off, rows, cols) src->mat(src->ctx, off, rows, cols)
#define VEC(off) src->vec(src->ctx, off)
    w->cfg = *c;
    w->embed = MAT(g->embed, V, D);
    w->lm_head = MAT(g->lm_head, V, D);
    w->final_norm = VEC(g->final_norm);
    w->out_res_norm = VEC(g->out_res_norm);
    w->out_res_proj = VEC(g->out_res_proj);
    if (!(w->layer = k3c_weights_alloc(w, sizeof *w->layer * (size_t)c->num_layers))) goto oom;
    for (int l = 0; l < c->num_layers; l++) {
        const k3c_layer_offsets *o = &tab->layer[l];
        k3c_weights_layer *L = &w->layer[l];
        L->input_norm = VEC(o->input_norm);
        L->post_norm = VEC(o->post_norm);
        L->attn_res_norm = VEC(o->attn_res_norm);
        L->attn_res_proj = VEC(o->attn_res_proj);
        L->mlp_res_norm = VEC(o->mlp_res_norm);
        L->mlp_res_proj = VEC(o->mlp_res_proj);
        if (c->mixer[l] == K3C_MIXER_KDA) {
            L->q_proj = MAT(o->q_proj, P, D);
            L->k_proj = MAT(o->k_proj, P, D);
            L->v_proj = MAT(o->v_proj, P, D);
            L->q_conv = VEC(o->q_conv);
            L->k_conv = VEC(o->k_conv);
            L->v_conv = VEC(o->v_conv);
            L->f_a = MAT(o->f_a, dk, D);
            L->f_b = MAT(o->f_b, P, dk);
            L->A_log = VEC(o->A_log);
            L->dt_bias = VEC(o->dt_bias);
            L->b_proj = MAT(o->b_proj, c->kda_heads, D);
            L->g_proj = MAT(o->g_proj, P, D);
            L->g_a = MAT(o->g_a, dk, D);
            L->g_b = MAT(o->g_b, P, dk);
            L->o_norm = VEC(o->o_norm);
            L->o_proj = MAT(o->o_proj, D, P);
        } else {
            L->q_proj = MAT(o->q_proj, H * dqk, D);
            L->q_a = MAT(o->q_a, r, D);
            L->q_a_norm = VEC(o->q_a_norm);
            L->q_b = MAT(o->q_b, H * dqk, r);
            L->kv_a = MAT(o->kv_a, rkv + c->qk_rope_dim, D);
            L->kv_a_norm = VEC(o->kv_a_norm);
            L->kv_b = MAT(o->kv_b, H * (c->qk_nope_dim + dv), rkv);
            L->g_proj = MAT(o->g_proj, H * dv, D);
            L->o_proj = MAT(o->o_proj, D, H * dv);
        }
        if (c->ffn[l] == K3C_FFN_DENSE) {
            L->mlp_gate = MAT(o->mlp_gate, c->intermediate_size, D);
            L->mlp_up = MAT(o->mlp_up, c->intermediate_size, D);
            L->mlp_down = MAT(o->mlp_down, D, c->intermediate_size);
        } else {
            L->router = MAT(o->router, E, D);
            L->router_bias = VEC(o->router_bias);
            L->w1 = expert_views(w, src, o->w1, En, I, lat);
            L->w3 = expert_views(w, src, o->w3, En, I, lat);
            L->w2 = expert_views(w, src, o->w2, En, lat, I);
            if (!L->w1 || !L->w2 || !L->w3) goto oom;
            L->shared_gate = MAT(o->shared_gate, S, D);
            L->shared_up = MAT(o->shared_up, S, D);
            L->shared_down = MAT(o->shared_down, D, S);
            L->latent_down = MAT(o->latent_down, lat, D);
            L->latent_up = MAT(o->latent_up, D, lat);
            L->latent_norm = VEC(o->latent_norm);
        }
    }
#undef MAT
#undef VEC
    return K3C_OK;
oom:
    return k3c_errf(err, K3C_ENOMEM, "engine weights: out of memory");
}

/* A flat parameter buffer: offsets are element offsets into it. */
typedef struct {
    const char *base;
    size_t es;
} flat_src;

static k3c_qmat flat_mat(void *ctx, size_t off, int64_t rows, int64_t cols) {
    const flat_src *f = ctx;
    k3c_qmat q = {f->es == sizeof(double) ? K3C_QMAT_F64 : K3C_QMAT_F32, rows, cols,
                  off == K3C_NOPARAM ? NULL : f->base + off * f->es, NULL};
    return q;
}

static const void *flat_vec(void *ctx, size_t off) {
    const flat_src *f = ctx;
    return off == K3C_NOPARAM ? NULL : f->base + off * f->es;
}

int k3c_weights_of_params(const k3c_config *c, const k3c_param_table *tab, const void *w, size_t es,
                          const k3c_backend_f32 *be, k3c_weights *out, k3c_err *err) {
    memset(out, 0, sizeof *out);
    out->be = be;
    flat_src f = {w, es};
    const k3c_weights_src src = {flat_mat, flat_vec, &f};
    int rc = k3c_weights_fill(out, c, tab, &src, err);
    if (rc) k3c_weights_free(out);
    return rc;
}

