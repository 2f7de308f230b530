/* weights_upload.c — the engine's weights copied into a backend's memory as stored: every matrix keeps its type
 * (float32, bf16, MXFP4 with its scales), each MoE matrix's experts evenly spaced, vectors as float. docs/ENGINE.md
 * "Weights" and "Two backends, one engine". */
#include "base/carve.h"
#include "base/check.h"
#include "serve/weights.h"

#include <stdlib.h>
#include <string.h>

/* One placement pass over the weights: measuring (cv.base NULL) or carving the backend block and uploading. */
typedef struct {
    k3c_carver cv;
    const k3c_backend_f32 *be;
    k3c_weights *dst; /* receives the views (and owns their arrays) */
    int rc;
    k3c_err *err;
} mover;

static void *put(mover *m, const void *host, size_t bytes) {
    void *d = k3c_carve(&m->cv, bytes);
    if (d && host && bytes && !m->rc) m->rc = m->be->upload(d, host, bytes, m->err);
    return d;
}

static size_t data_bytes(const k3c_qmat *q) {
    const size_t e = (size_t)q->rows * (size_t)q->cols;
    return q->type == K3C_QMAT_F32 ? 4 * e : q->type == K3C_QMAT_BF16 ? 2 * e : e / 2;
}

static k3c_qmat put_mat(mover *m, const k3c_qmat *q) {
    k3c_qmat d = *q;
    if (!q->w) return d;
    d.w = put(m, q->w, data_bytes(q));
    if (q->type == K3C_QMAT_MXFP4) d.scale = put(m, q->scale, (size_t)q->rows * (size_t)(q->cols / 32));
    return d;
}

static const void *put_vec(mover *m, const void *v, int64_t n) {
    return v ? put(m, v, sizeof(float) * (size_t)n) : NULL;
}

/* E expert views placed one after another: every expert has the same size, so the carver spaces them evenly (the
 * device's grouped expert kernels read expert e at base + e·stride). */
static k3c_qmat *put_experts(mover *m, const k3c_qmat *v, int64_t E) {
    if (!v) return NULL;
    k3c_qmat *d = k3c_weights_alloc(m->dst, sizeof *d * (size_t)E);
    if (!d) {
        if (!m->rc) m->rc = k3c_errf(m->err, K3C_ENOMEM, "engine weights: out of memory");
        return NULL;
    }
    for (int64_t e = 0; e < E; e++) d[e] = put_mat(m, &v[e]);
    return d;
}

/* The absorbed key side: every head's W_UK,hᵀ in one block (as k3c_weights_absorb lays it out), W_UV,h row views into
 * the placed kv_b. */
static void put_absorbed(mover *m, const k3c_weights_layer *s, k3c_weights_layer *d, int64_t H, int64_t nope,
                         int64_t dv) {
    d->uk_t = k3c_weights_alloc(m->dst, sizeof(k3c_qmat) * (size_t)H);
    d->uv = k3c_weights_alloc(m->dst, sizeof(k3c_qmat) * (size_t)H);
    if (!d->uk_t || !d->uv) {
        if (!m->rc) m->rc = k3c_errf(m->err, K3C_ENOMEM, "engine weights: out of memory");
        return;
    }
    const size_t head = data_bytes(&s->uk_t[0]);
    const char *t = put(m, s->uk_t[0].w, head * (size_t)H);
    for (int64_t h = 0; h < H; h++) {
        d->uk_t[h] = s->uk_t[0];
        d->uk_t[h].w = t ? t + head * (size_t)h : NULL;
        d->uv[h] = k3c_qmat_sub_rows(&d->kv_b, h * (nope + dv) + nope, dv);
    }
}

static void put_layer(mover *m, const k3c_config *c, const k3c_weights_layer *s, k3c_weights_layer *d) {
    const int64_t D = c->hidden_size, P = c->kda_heads * c->kda_head_dim, dk = c->kda_head_dim;
    const int64_t lat = c->latent_dim > 0 ? c->latent_dim : D, E = c->num_experts;
    memset(d, 0, sizeof *d);
    d->input_norm = put_vec(m, s->input_norm, D), d->post_norm = put_vec(m, s->post_norm, D);
    d->attn_res_norm = put_vec(m, s->attn_res_norm, D), d->attn_res_proj = put_vec(m, s->attn_res_proj, D);
    d->mlp_res_norm = put_vec(m, s->mlp_res_norm, D), d->mlp_res_proj = put_vec(m, s->mlp_res_proj, D);
    const k3c_qmat *sm[] = {&s->q_proj,   &s->k_proj, &s->v_proj,     &s->f_a,       &s->f_b,       &s->b_proj,
                            &s->g_proj,   &s->g_a,    &s->g_b,        &s->q_a,       &s->q_b,       &s->kv_a,
                            &s->kv_b,     &s->o_proj, &s->mlp_gate,   &s->mlp_up,    &s->mlp_down,  &s->router,
                            &s->shared_gate, &s->shared_up, &s->shared_down, &s->latent_down, &s->latent_up};
    k3c_qmat *dm[] = {&d->q_proj,   &d->k_proj, &d->v_proj,     &d->f_a,       &d->f_b,       &d->b_proj,
                      &d->g_proj,   &d->g_a,    &d->g_b,        &d->q_a,       &d->q_b,       &d->kv_a,
                      &d->kv_b,     &d->o_proj, &d->mlp_gate,   &d->mlp_up,    &d->mlp_down,  &d->router,
                      &d->shared_gate, &d->shared_up, &d->shared_down, &d->latent_down, &d->latent_up};
    for (size_t i = 0; i < sizeof sm / sizeof sm[0]; i++) *dm[i] = put_mat(m, sm[i]);
    const int64_t W = c->conv_kernel;
    d->q_conv = put_vec(m, s->q_conv, P * W), d->k_conv = put_vec(m, s->k_conv, P * W);
    d->v_conv = put_vec(m, s->v_conv, P * W);
    d->A_log = put_vec(m, s->A_log, c->kda_heads), d->dt_bias = put_vec(m, s->dt_bias, P);
    d->o_norm = put_vec(m, s->o_norm, dk);
    d->q_a_norm = put_vec(m, s->q_a_norm, c->q_lora_rank), d->kv_a_norm = put_vec(m, s->kv_a_norm, c->kv_lora_rank);
    d->router_bias = put_vec(m, s->router_bias, E), d->latent_norm = put_vec(m, s->latent_norm, lat);
    d->w1 = put_experts(m, s->w1, E), d->w3 = put_experts(m, s->w3, E), d->w2 = put_experts(m, s->w2, E);
    if (s->uk_t) put_absorbed(m, s, d, c->mla_heads, c->qk_nope_dim, c->v_head_dim);
}

static void put_all(mover *m, const k3c_weights *s) {
    const k3c_config *c = &s->cfg;
    const int64_t D = c->hidden_size;
    k3c_weights *d = m->dst;
    d->cfg = *c;
    d->embed = put_mat(m, &s->embed);
    /* a tied head is the embedding itself */
    d->lm_head = s->lm_head.w == s->embed.w ? d->embed : put_mat(m, &s->lm_head);
    d->final_norm = put_vec(m, s->final_norm, D);
    d->out_res_norm = put_vec(m, s->out_res_norm, D), d->out_res_proj = put_vec(m, s->out_res_proj, D);
    d->layer = k3c_weights_alloc(d, sizeof *d->layer * (size_t)c->num_layers);
    if (!d->layer) {
        if (!m->rc) m->rc = k3c_errf(m->err, K3C_ENOMEM, "engine weights: out of memory");
        return;
    }
    for (int l = 0; l < c->num_layers; l++) put_layer(m, c, &s->layer[l], &d->layer[l]);
}

int k3c_weights_to_backend(const k3c_weights *src, const k3c_backend_f32 *be, k3c_weights *dst, k3c_err *err) {
    memset(dst, 0, sizeof *dst);
    if (src->be) return k3c_errf(err, K3C_EINVAL, "engine weights: already in backend '%s' memory", src->be->name);
    k3c_weights probe = {0}; /* the measuring pass builds its view arrays here and drops them */
    mover m = {k3c_carver_measure(256), be, &probe, K3C_OK, err};
    put_all(&m, src);
    k3c_weights_free(&probe);
    if (m.rc) return m.rc;
    const size_t bytes = m.cv.off;
    dst->be = be;
    void *block = be->alloc(bytes ? bytes : 1);
    if (!block || !(dst->owned_be = malloc(sizeof *dst->owned_be))) {
        if (block) be->free(block);
        memset(dst, 0, sizeof *dst);
        return k3c_errf(err, K3C_ENOMEM, "engine weights: %.2f GiB of %s memory", (double)bytes / (1 << 30),
                        be->name);
    }
    dst->owned_be[0] = block, dst->n_owned_be = dst->cap_owned_be = 1;
    dst->bytes = bytes;
    m = (mover){k3c_carver_at(block, bytes, 256), be, dst, K3C_OK, err};
    put_all(&m, src);
    int rc = m.rc ? m.rc : be->sync(err); /* the host copies may go once this returns */
    if (!rc) rc = k3c_weights_check(dst, err);
    if (rc) k3c_weights_free(dst);
    return rc;
}
