/* cuda_mix.h — CUDA twins (fp32) of the AttnRes depth mix, of the QK-Clip S_max reduction and of the activation moves
 * (zero, add, strided 2-D copy). Spec: ARCHITECTURE.md §5.1, §5.3, §5.4 (AttnRes), §10.2 (QK-Clip); ops/attnres.h.
 *
 * Conventions as src/cuda/cuda_ops.h: every array a DEVICE pointer, work on the calling thread's default stream
 * (cudaStreamPerThread), no synchronisation unless stated, backward ADDS into every gradient it is given. */
#ifndef K3C_CUDA_MIX_H
#define K3C_CUDA_MIX_H

#include <stddef.h>
#include <stdint.h>

#include "k3c.h"

#ifdef __cplusplus
extern "C" {
#endif
#include "ops/attention.h"
#include "ops/attnres.h"

/* ---------------------------------------------------------------- AttnRes (ops/attnres.h)
 * v and dv are HOST arrays of `sources` DEVICE pointers (dv itself, or any dv[i], may be NULL; a dv[i] may alias
 * another dv[j] and then receives both contributions; no dv[i] may alias a source or dh). saved has the CPU layout
 * (k3c_attnres_saved_elems_f32 floats: rstd [T, N] then α [T, N]); the forward writes it when non-NULL, the backward
 * reads it when non-NULL and otherwise recomputes rstd and α from v (as the CPU op).
 * ws: k3c_attnres_workspace_cuda bytes (256-aligned): the per-(token, source) coefficients of dv (α, dz·rstd,
 * dz·rstd²·z/D) and per-token-chunk partial sums of dŵ in double, so dw and dgamma are reduced over tokens in a fixed
 * order (deterministic, no atomics). It may be NULL only when T = 0 or no gradient is requested. Its size is not the
 * CPU op's k3c_attnres_workspace_f32. */
size_t k3c_attnres_workspace_cuda(const k3c_attnres_sizes *s);
int k3c_attnres_fwd_cuda(const k3c_attnres_sizes *s, const float *const *v, const float *w, const float *gamma,
                         float *h, float *saved, k3c_err *err);
int k3c_attnres_bwd_cuda(const k3c_attnres_sizes *s, const float *const *v, const float *w, const float *gamma,
                         const float *saved, const float *dh, float *const *dv, float *dw, float *dgamma, void *ws,
                         k3c_err *err);

/* ---------------------------------------------------------------- QK-Clip S_max (ops/attention.h)
 * Twin of k3c_attention_max_logit_f32: smax[h] (H floats, DEVICE, overwritten) = max of s->scale · q_i·k_j over the
 * causal pairs j ≤ i inside each document (q, k [T, H, dqk], fp32 dot products). T = 0: smax = −inf, returns 0 without
 * synchronising. Otherwise it SYNCHRONISES the stream once: it copies smax and cu_seqlens back to check them and
 * returns K3C_EINVAL for malformed cu_seqlens (not from 0 to T, decreasing) and K3C_ENUMERIC when a head's maximum is
 * not finite (smax is written either way). Needs no workspace; T ≤ 2^30, H ≤ 65535. */
int k3c_attention_max_logit_cuda(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const float *q,
                                 const float *k, float *smax, k3c_err *err);

/* ---------------------------------------------------------------- activation moves (ops/basic.h k3c_zero / add / copy2d)
 * x = 0 (n floats); y += x (x may equal y); dst[r·ld_dst + c] = src[r·ld_src + c] (accumulate = 0) or += (1) for
 * r < rows, c < cols; ld_src, ld_dst ≥ cols when rows > 1; src and dst must not overlap. */
int k3c_zero_cuda(float *x, int64_t n, k3c_err *err);
int k3c_add_cuda(int64_t n, const float *x, float *y, k3c_err *err);
int k3c_copy2d_cuda(int64_t rows, int64_t cols, const float *src, int64_t ld_src, float *dst, int64_t ld_dst,
                    int accumulate, k3c_err *err);

#ifdef __cplusplus
}
#endif
#endif
