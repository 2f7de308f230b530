/* weights.c — the engine's weight views: built over an opened float32 model's parameters, the absorbed MLA key side
 * (W_UK,hᵀ copies, W_UV,h row views) and a shape check. Implements docs/MODEL.md §4.2 (absorbed form), docs/ENGINE.md. */
#include "serve/weights.h"
#include "base/check.h"
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

/* A block of the weights' backend memory owned by w (the absorbed copies of a model on the GPU live there). */
static void *weights_alloc_be(k3c_weights *w, size_t bytes) {
    if (!w->be) return k3c_weights_alloc(w, bytes);
    if (w->n_owned_be == w->cap_owned_be) {
        int cap = w->cap_owned_be ? 2 * w->cap_owned_be : 16;
        void **o = realloc(w->owned_be, sizeof *o * (size_t)cap);
        if (!o) return NULL;
        w->owned_be = o;
        w->cap_owned_be = cap;
    }
    void *p = w->be->alloc(bytes ? bytes : 1);
    if (p) w->owned_be[w->n_owned_be++] = p;
    return p;
}

int k3c_weights_from_model(const k3c_model *m, k3c_weights *w, k3c_err *err) {
    memset(w, 0, sizeof *w);
    if (m->precision != K3C_F32) return k3c_errf(err, K3C_EUNSUPPORTED, "engine weights: the model must be float32");
    /* the views point into the model's parameters, wherever they live */
    int rc = k3c_weights_of_params(&m->cfg, &m->table, m->w, sizeof(float), m->backend, w, err);
    if (!rc) rc = k3c_weights_absorb(w, err);
    if (!rc) rc = k3c_weights_check(w, err);
    if (rc) k3c_weights_free(w);
    return rc;
}

/* W_UK,hᵀ of every head from a host copy kb of kv_b: t [H, rkv, nope] in kv_b's type. */
static void absorb_keys(const k3c_qmat *kb, int64_t H, int64_t nope, int64_t dv, int64_t rkv, void *t, float *row) {
    const int bf16 = kb->type == K3C_QMAT_BF16;
    for (int64_t h = 0; h < H; h++)
        /* W_UK,h = rows h·(nope+dv) .. +nope of kv_b; its transpose [rkv, nope] turns q_nope into latent space */
        for (int64_t i = 0; i < nope; i++) {
            k3c_qmat_row(kb, h * (nope + dv) + i, row);
            for (int64_t j = 0; j < rkv; j++) {
                size_t at = (size_t)((h * rkv + j) * nope + i);
                if (bf16)
                    ((uint16_t *)t)[at] = k3c_f32_to_bf16(row[j]); /* a bf16 value round-trips exactly */
                else
                    ((float *)t)[at] = row[j];
            }
        }
}

int k3c_weights_absorb(k3c_weights *w, k3c_err *err) {
    const k3c_config *c = &w->cfg;
    const k3c_backend_f32 *be = w->be ? w->be : k3c_backend_cpu_f32();
    int64_t H = c->mla_heads, nope = c->qk_nope_dim, dv = c->v_head_dim, rkv = c->kv_lora_rank;
    for (int l = 0; l < c->num_layers; l++) {
        k3c_weights_layer *L = &w->layer[l];
        if (c->mixer[l] != K3C_MIXER_MLA) continue;
        if (L->kv_b.type == K3C_QMAT_MXFP4 || !L->kv_b.w)
            return k3c_errf(err, K3C_EUNSUPPORTED, "layer %d: kv_b_proj must be float32 or bf16 to absorb", l);
        const size_t es = L->kv_b.type == K3C_QMAT_BF16 ? 2 : 4, bytes = es * (size_t)(H * nope * rkv);
        const size_t kv_bytes = es * (size_t)(L->kv_b.rows * L->kv_b.cols);
        L->uk_t = k3c_weights_alloc(w, sizeof(k3c_qmat) * (size_t)H);
        L->uv = k3c_weights_alloc(w, sizeof(k3c_qmat) * (size_t)H);
        void *t = weights_alloc_be(w, bytes);
        /* built on the host from a host copy of kv_b (the weights may live in backend memory), then placed beside it */
        void *th = malloc(bytes), *kvh = malloc(kv_bytes);
        float *row = malloc(sizeof(float) * (size_t)rkv);
        int rc = !L->uk_t || !L->uv || !t || !th || !kvh || !row
                     ? k3c_errf(err, K3C_ENOMEM, "layer %d: absorbing kv_b_proj: out of memory", l)
                     : be->download(kvh, L->kv_b.w, kv_bytes, err);
        if (!rc) {
            k3c_qmat kb = L->kv_b;
            kb.w = kvh;
            absorb_keys(&kb, H, nope, dv, rkv, th, row);
            rc = be->upload(t, th, bytes, err);
        }
        if (!rc) rc = be->sync(err); /* th is freed below */
        free(row), free(th), free(kvh);
        if (rc) return rc;
        for (int64_t h = 0; h < H; h++) {
            k3c_qmat u = {L->kv_b.type, rkv, nope, (const char *)t + es * (size_t)(h * rkv * nope), NULL};
            L->uk_t[h] = u;
            L->uv[h] = k3c_qmat_sub_rows(&L->kv_b, h * (nope + dv) + nope, dv);
        }
    }
    return K3C_OK;
}

static int need(const k3c_qmat *q, int64_t rows, int64_t cols, int l, const char *name, k3c_err *err) {
    char what[96];
    snprintf(what, sizeof what, "engine weights: layer %d: %s", l, name);
    CHECK_RC(k3c_qmat_check(q, what, err));
    if (q->rows != rows || q->cols != cols)
        return k3c_errf(err, K3C_EINVAL, "%s is [%lld, %lld], the config implies [%lld, %lld]", what,
                        (long long)q->rows, (long long)q->cols, (long long)rows, (long long)cols);
    return K3C_OK;
}

#define NEEDV(p, l, name)                                                                                              \
    do {                                                                                                               \
        if (!(p)) return k3c_errf(err, K3C_EINVAL, "engine weights: layer %d: %s missing", l, name);                   \
    } while (0)

static int check_layer(const k3c_config *c, const k3c_weights_layer *L, int l, k3c_err *err) {
    int64_t D = c->hidden_size, P = c->kda_heads * c->kda_head_dim, dk = c->kda_head_dim;
    int64_t H = c->mla_heads, dqk = c->qk_nope_dim + c->qk_rope_dim, dv = c->v_head_dim, r = c->q_lora_rank;
    int64_t rkv = c->kv_lora_rank, E = c->num_experts, I = c->moe_intermediate_size;
    int64_t lat = c->latent_dim > 0 ? c->latent_dim : D, S = c->num_shared_experts * I;
    NEEDV(L->input_norm, l, "input_layernorm");
    NEEDV(L->post_norm, l, "post_attention_layernorm");
    if (c->attn_res_block > 0) {
        NEEDV(L->attn_res_norm && L->attn_res_proj, l, "self_attention_res_{norm,proj}");
        NEEDV(L->mlp_res_norm && L->mlp_res_proj, l, "mlp_res_{norm,proj}");
    }
    if (c->mixer[l] == K3C_MIXER_KDA) {
        CHECK_RC(need(&L->q_proj, P, D, l, "q_proj", err));
        CHECK_RC(need(&L->k_proj, P, D, l, "k_proj", err));
        CHECK_RC(need(&L->v_proj, P, D, l, "v_proj", err));
        NEEDV(L->q_conv && L->k_conv && L->v_conv, l, "q/k/v conv1d");
        CHECK_RC(need(&L->f_a, dk, D, l, "f_a_proj", err));
        CHECK_RC(need(&L->f_b, P, dk, l, "f_b_proj", err));
        NEEDV(L->A_log && L->dt_bias && L->o_norm, l, "A_log / dt_bias / o_norm");
        CHECK_RC(need(&L->b_proj, c->kda_heads, D, l, "b_proj", err));
        if (c->kda_full_rank_gate) {
            CHECK_RC(need(&L->g_proj, P, D, l, "g_proj", err));
        } else {
            CHECK_RC(need(&L->g_a, dk, D, l, "g_a_proj", err));
            CHECK_RC(need(&L->g_b, P, dk, l, "g_b_proj", err));
        }
        CHECK_RC(need(&L->o_proj, D, P, l, "o_proj", err));
    } else {
        if (r > 0) {
            CHECK_RC(need(&L->q_a, r, D, l, "q_a_proj", err));
            CHECK_RC(need(&L->q_b, H * dqk, r, l, "q_b_proj", err));
            NEEDV(L->q_a_norm, l, "q_a_layernorm");
        } else {
            CHECK_RC(need(&L->q_proj, H * dqk, D, l, "q_proj", err));
        }
        CHECK_RC(need(&L->kv_a, rkv + c->qk_rope_dim, D, l, "kv_a_proj_with_mqa", err));
        NEEDV(L->kv_a_norm, l, "kv_a_layernorm");
        NEEDV(L->uk_t && L->uv, l, "absorbed kv_b_proj (k3c_weights_absorb)");
        for (int64_t h = 0; h < H; h++) {
            CHECK_RC(need(&L->uk_t[h], rkv, c->qk_nope_dim, l, "absorbed W_UK", err));
            CHECK_RC(need(&L->uv[h], dv, rkv, l, "absorbed W_UV", err));
        }
        if (c->mla_output_gate) CHECK_RC(need(&L->g_proj, H * dv, D, l, "g_proj", err));
        CHECK_RC(need(&L->o_proj, D, H * dv, l, "o_proj", err));
    }
    if (c->ffn[l] == K3C_FFN_DENSE) {
        CHECK_RC(need(&L->mlp_gate, c->intermediate_size, D, l, "mlp.gate_proj", err));
        CHECK_RC(need(&L->mlp_up, c->intermediate_size, D, l, "mlp.up_proj", err));
        return need(&L->mlp_down, D, c->intermediate_size, l, "mlp.down_proj", err);
    }
    CHECK_RC(need(&L->router, E, D, l, "gate", err));
    NEEDV(L->w1 && L->w2 && L->w3, l, "experts");
    for (int64_t e = 0; e < E; e++) {
        CHECK_RC(need(&L->w1[e], I, lat, l, "experts.w1", err));
        CHECK_RC(need(&L->w3[e], I, lat, l, "experts.w3", err));
        CHECK_RC(need(&L->w2[e], lat, I, l, "experts.w2", err));
    }
    if (S > 0) {
        CHECK_RC(need(&L->shared_gate, S, D, l, "shared_experts.gate_proj", err));
        CHECK_RC(need(&L->shared_up, S, D, l, "shared_experts.up_proj", err));
        CHECK_RC(need(&L->shared_down, D, S, l, "shared_experts.down_proj", err));
    }
    if (c->latent_dim > 0) {
        CHECK_RC(need(&L->latent_down, lat, D, l, "routed_expert_down_proj", err));
        CHECK_RC(need(&L->latent_up, D, lat, l, "routed_expert_up_proj", err));
        if (c->latent_norm) NEEDV(L->latent_norm, l, "routed_expert_norm");
    }
    return K3C_OK;
}

int k3c_weights_check(const k3c_weights *w, k3c_err *err) {
    const k3c_config *c = &w->cfg;
    CHECK_RC(need(&w->embed, c->vocab_size, c->hidden_size, -1, "embed_tokens", err));
    CHECK_RC(need(&w->lm_head, c->vocab_size, c->hidden_size, -1, "lm_head", err));
    if (!w->final_norm) return k3c_errf(err, K3C_EINVAL, "engine weights: final norm missing");
    if (c->attn_res_block > 0 && (!w->out_res_norm || !w->out_res_proj))
        return k3c_errf(err, K3C_EINVAL, "engine weights: output_attn_res_{norm,proj} missing");
    if (!w->layer) return k3c_errf(err, K3C_EINVAL, "engine weights: no layers");
    for (int l = 0; l < c->num_layers; l++) CHECK_RC(check_layer(c, &w->layer[l], l, err));
    return K3C_OK;
}
