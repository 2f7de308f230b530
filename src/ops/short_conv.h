/* short_conv.h — depthwise causal convolution (kernel W, no bias) followed by SiLU, with zero padding before every
 * packed-document start and an optional conv state for decoding. Spec: docs/MODEL.md §3.1 step 2, §3.4 "Short-conv
 * backward", §3.5. Symbols exist as _f32 and _f64.
 *
 *   a_t[c] = Σ_{j=0..W−1} w[c, j] · x_{t−W+1+j}[c],   y_t[c] = SiLU(a_t[c])   (w[c, W−1] multiplies the current token)
 *
 * x, y [T, C] token-major; w [C, W] (the checkpoint's [C, 1, W]); cu_seqlens n_docs + 1 offsets (NULL = one document).
 * Inputs before a document's first token come from state_in[doc] (NULL = zeros). Conv state layout [n_docs, C, W−1]:
 * entry j of a channel is the input W−1−j tokens before the document's first (j = W−2 is the newest). */
#ifndef K3C_OPS_SHORT_CONV_H
#define K3C_OPS_SHORT_CONV_H

#include "ops/ops.h"

#include <stddef.h>
#include <stdint.h>

#define K3C_SHORT_CONV_MAX_W 16

typedef struct {
    int64_t T, C;
    int W;      /* kernel width, 1 .. K3C_SHORT_CONV_MAX_W (K3: 4) */
    int n_docs; /* ignored when cu_seqlens is NULL */
} k3c_short_conv_dims;

#define K3C_SHORT_CONV_API(real, S)                                                                                          \
    /* y[T, C]; state_out [n_docs, C, W−1] (may be NULL, may be the same pointer as state_in) receives the last W−1    \
       inputs of each document (older ones from state_in when the document is shorter than W−1). */ \
    int k3c_short_conv_fwd_##S(const k3c_short_conv_dims *d, const int32_t *cu_seqlens, const real *x, const real *w,        \
                               const real *state_in, real *y, real *state_out, k3c_err *err);                                \
    /* Workspace bytes of the backward (the pre-activation gradient: T·C reals). */                                         \
    size_t k3c_short_conv_bwd_workspace_##S(const k3c_short_conv_dims *d);                                                   \
    /* Recomputes a_t; adds dx [T, C], dw [C, W] and dstate_in [n_docs, C, W−1] (each may be NULL). Deterministic. */      \
    int k3c_short_conv_bwd_##S(const k3c_short_conv_dims *d, const int32_t *cu_seqlens, const real *x, const real *w,        \
                               const real *state_in, const real *dy, real *dx, real *dw, real *dstate_in, void *ws,          \
                               k3c_err *err);

K3C_DECLARE_REAL(K3C_SHORT_CONV_API)

#endif
