/* qk_clip.c — QK-Clip (the "clip" of MuonClip) for MLA layers: after the optimizer step, heads whose largest scaled
 * logit exceeded τ get query/key rows shrunk so that logit scales by γ = τ / S_max. Spec: docs/MODEL.md §10.2. */
#include "ops/qk_clip.h"

#include <math.h>

static void scale_rows(float *w, int64_t r0, int64_t nrows, int64_t cols, float f) {
    float *x = w + r0 * cols;
    for (int64_t i = 0; i < nrows * cols; i++) x[i] *= f;
}

/* Heads [h0, h0 + hn) of s_max [mla_heads], held from row 0 of q and kv_b (a tensor-parallel share holds only its
 * heads); every S_max of the layer must be finite. */
static int clip_heads(const k3c_config *cfg, const k3c_layer_offsets *o, float *w, const float *s_max, double tau,
                      int64_t h0, int64_t hn, int *n_clipped, k3c_err *err) {
    if (n_clipped) *n_clipped = 0;
    if (!(tau > 0)) return k3c_errf(err, K3C_EINVAL, "qk_clip: tau must be > 0 (got %g)", tau);
    const int lora = cfg->q_lora_rank > 0;
    const size_t q_off = lora ? o->q_b : o->q_proj;
    if (q_off == K3C_NOPARAM || o->kv_b == K3C_NOPARAM)
        return k3c_errf(err, K3C_EINVAL, "qk_clip: layer has no %s or kv_b_proj", lora ? "q_b_proj" : "q_proj");
    const int64_t H = cfg->mla_heads, nope = cfg->qk_nope_dim, rope = cfg->qk_rope_dim, dv = cfg->v_head_dim;
    const int64_t q_cols = lora ? cfg->q_lora_rank : cfg->hidden_size, kv_cols = cfg->kv_lora_rank;
    for (int64_t h = 0; h < H; h++)
        if (!isfinite(s_max[h]))
            return k3c_errf(err, K3C_ENUMERIC, "qk_clip: S_max of head %lld is %g", (long long)h, (double)s_max[h]);
    int clipped = 0;
    for (int64_t h = 0; h < hn; h++) {
        if (!(s_max[h0 + h] > tau)) continue;
        /* q·k is bilinear: sqrt(γ) on both nope factors and γ on the query's rope part scale every logit by γ,
         * while the shared k_pe (all heads read it) stays untouched. */
        const double gamma = tau / (double)s_max[h0 + h];
        const float sg = (float)sqrt(gamma), g1 = (float)gamma;
        scale_rows(w + q_off, h * (nope + rope), nope, q_cols, sg);
        scale_rows(w + q_off, h * (nope + rope) + nope, rope, q_cols, g1);
        scale_rows(w + o->kv_b, h * (nope + dv), nope, kv_cols, sg);
        clipped++;
    }
    if (n_clipped) *n_clipped = clipped;
    return K3C_OK;
}

int k3c_qk_clip_layer(const k3c_config *cfg, const k3c_layer_offsets *o, float *w, const float *s_max, double tau,
                      int *n_clipped, k3c_err *err) {
    return clip_heads(cfg, o, w, s_max, tau, 0, cfg->mla_heads, n_clipped, err);
}

int k3c_qk_clip(const k3c_config *cfg, const k3c_param_table *t, float *w, const float *s_max, double tau,
                int *n_clipped, k3c_err *err) {
    int total = 0;
    if (n_clipped) *n_clipped = 0;
    const int64_t hn = cfg->mla_heads / t->res.tp_size, h0 = t->res.tp_rank * hn; /* a TP share: its heads */
    for (int l = t->res.layer0; l < t->res.layer1; l++) { /* the held layers (another stage clips its own) */
        if (cfg->mixer[l] != K3C_MIXER_MLA) continue;
        int c = 0;
        int rc = clip_heads(cfg, &t->layer[l], w, s_max + (size_t)l * (size_t)cfg->mla_heads, tau, h0, hn, &c, err);
        if (rc) return err ? k3c_err_wrap(err, "layer %d", l) : rc;
        total += c;
    }
    if (n_clipped) *n_clipped = total;
    return K3C_OK;
}
