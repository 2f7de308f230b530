/* qk_logits.c — the largest scaled attention logit per MLA head of the last forward (S_max of MuonClip / QK-Clip), from
 * the saved queries and keys, respecting the causal and document masks. Spec: ARCHITECTURE.md §10.2. */
#include "base/real.h"
#include "model/acts.h"

#include <string.h>

#define QK_BLOCK 128

int R(k3c_model_mla_max_logits)(const k3c_model *m, const k3c_acts *a, float *s_max, k3c_err *err) {
    const k3c_config *c = &m->cfg;
    int64_t H = c->mla_heads, dqk = c->qk_nope_dim + c->qk_rope_dim, T = a->T;
    double scale = 1.0 / sqrt((double)dqk);
    int nd = a->st.cu ? a->st.n_docs : 1;
    for (int l = 0; l < c->num_layers; l++) {
        if (c->mixer[l] != K3C_MIXER_MLA) continue;
        const real *q = a->mla[l].q, *k = a->mla[l].k;
        float *out = s_max + (size_t)l * (size_t)H;
        for (int64_t h = 0; h < H; h++) out[h] = -INFINITY;
        int fail = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : fail)
        for (int64_t h = 0; h < H; h++) {
            real blk[QK_BLOCK * QK_BLOCK];
            double best = -INFINITY;
            for (int d = 0; d < nd; d++) {
                int64_t s = a->st.cu ? a->st.cu[d] : 0, e = a->st.cu ? a->st.cu[d + 1] : T;
                for (int64_t i0 = s; i0 < e; i0 += QK_BLOCK)
                    for (int64_t j0 = s; j0 <= i0 && j0 < e; j0 += QK_BLOCK) {
                        int64_t ni = e - i0 < QK_BLOCK ? e - i0 : QK_BLOCK, nj = e - j0 < QK_BLOCK ? e - j0 : QK_BLOCK;
                        /* blk = Q_h[i0:i0+ni] K_h[j0:j0+nj]ᵀ, heads strided by H·dqk */
                        cblas_rgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)ni, (int)nj, (int)dqk, 1,
                                    q + (i0 * H + h) * dqk, (int)(H * dqk), k + (j0 * H + h) * dqk, (int)(H * dqk), 0,
                                    blk, QK_BLOCK);
                        for (int64_t i = 0; i < ni; i++)
                            for (int64_t j = 0; j < nj && j0 + j <= i0 + i; j++)
                                if (blk[i * QK_BLOCK + j] * scale > best) best = blk[i * QK_BLOCK + j] * scale;
                    }
            }
            out[h] = (float)best;
            if (!isfinite(best) && T > 0) fail = 1;
        }
        if (fail) return k3c_errf(err, K3C_ENUMERIC, "layer %d: non-finite MLA logits", l);
    }
    return K3C_OK;
}
