/* vision.h — internal to k3c: the vision tower's parameter table (release tensor names), the model struct and the
 * activations one forward saves for its backward. Spec: docs/VISION.md; ../shared/spec/CHECKPOINTS.md §3.4, §4. */
#ifndef K3C_VISION_VISION_H
#define K3C_VISION_VISION_H

#include "ops/vision_ops.h"

#include <stddef.h>

/* The RMSNorm eps of the tower's norms: nn.RMSNorm(eps=None) takes finfo(float32).eps (the golden's probe); the
 * double build uses the same value so both precisions compute one function. The projector's post_norm uses
 * projector_ln_eps. */
#define K3C_VISION_NORM_EPS 1.1920928955078125e-07
#define K3C_VISION_ROPE_THETA 10000.0

/* Parameter slots: 0 patch_embed.proj, 1 pos_emb, then 6 per block, then the final norm and the projector. */
enum { VP_PATCH = 0, VP_POS = 1, VP_BLOCK0 = 2 };
enum { VB_NORM0 = 0, VB_WQKV, VB_WO, VB_NORM1, VB_FC0, VB_FC1, VB_COUNT };
enum { VT_FINAL = 0, VT_PROJ0, VT_PROJ2, VT_POST, VT_COUNT };

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[4];
    size_t off, n; /* in elements of the flat buffer */
} k3c_vision_param;

struct k3c_vision {
    k3c_vision_config cfg;
    k3c_dtype precision; /* K3C_F32 or K3C_F64: the `real` of w and g */
    int n;               /* parameters */
    k3c_vision_param *p;
    size_t total;           /* elements of w (and g) */
    void *w, *g;            /* g NULL unless created with gradients; in the backend's memory */
    const void *backend;    /* the k3c_backend_f32/_f64 running the tower (ops/backend.h); NULL = the CPU reference */
    void (*bfree)(void *p); /* frees w and g (the backend's free; NULL = free()) */
};

/* The table and zeroed buffers of `precision` reals (k3c_vision_create_f32/_f64). */
int k3c_vision_alloc(const k3c_vision_config *vc, k3c_dtype precision, int with_grad, k3c_vision **out, k3c_err *err);

/* Index of block l's slot k, and of tail slot k. */
static inline int k3c_vision_bslot(int64_t l, int k) { return VP_BLOCK0 + (int)l * VB_COUNT + k; }
static inline int k3c_vision_tslot(const struct k3c_vision *v, int k) {
    return VP_BLOCK0 + (int)v->cfg.layers * VB_COUNT + k;
}

/* One forward's inputs and saved stages (golden stage names in comments), in one host block; both precisions are
 * declared (k3c_vision_acts_f32/_f64, k3c_vit_block_acts_f32/_f64) so tests can read either. */
#define K3C_VISION_ACTS_DECL(real, S)                                                                                  \
    typedef struct {                                                                                                   \
        real *in, *norm0, *rstd0, *wqkv, *q_rope, *k_rope, *v, *attn_core, *lse, *attn_out, *resid1, *norm1, *rstd1,   \
            *fc0, *mlp_act, *mlp_out, *out;                                                                            \
    } k3c_vit_block_acts_##S;                                                                                          \
    struct k3c_vision_acts_##S {                                                                                       \
        const void *backend;           /* the table whose memory holds everything below */                             \
        int n;                         /* items */                                                                     \
        k3c_grid_thw *g;               /* [n] */                                                                       \
        int32_t *cu;                   /* [n + 1] token offsets */                                                     \
        int64_t L, N;                  /* patches, merged tokens */                                                    \
        real *pixels;                  /* [L, 3·p·p] a copy of the input */                                          \
        real *conv;                    /* patch_embed.conv [L, D] */                                                   \
        real *embed;                   /* patch_embed.out [L, D] (+ position embedding) */                             \
        real *rope;                    /* rope.freqs_cis_real_imag [L, dh/2, 2] */                                     \
        k3c_vit_block_acts_##S *blk;   /* blocks.l.* */                                                                \
        real *final_norm, *rstd_final; /* encoder.final_norm [L, D] */                                                 \
        real *merged;                  /* merged [N, 4·D] (= proj.in) */                                              \
        real *proj_fc0, *proj_gelu;    /* proj.fc0, proj.gelu [N, 4·D] */                                             \
        real *proj_fc1;                /* proj.fc1 [N, E] */                                                           \
        real *embeds, *rstd_post;      /* proj.out [N, E] */                                                           \
        void *mem;                                                                                                     \
    };

K3C_DECLARE_REAL(K3C_VISION_ACTS_DECL)

#endif
