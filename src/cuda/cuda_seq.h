/* cuda_seq.h — fp32 CUDA twins of the short convolution, the KDA forget gate, the sigmoid gate / sigmoid and the masked
 * cross-entropy (seq_ops.cu). ARCHITECTURE.md §3.1 steps 2 and 6, §3.4 stage 6, §4.2; TRAINING.md §5.3;
 * ops/short_conv.h, ops/kda.h, ops/basic.h.
 *
 * Conventions are those of cuda/cuda_ops.h: each twin takes the CPU op's float arguments, every array (cu_seqlens,
 * targets and mask included) a DEVICE pointer, runs on cudaStreamPerThread and returns without synchronising, except
 * where a function says otherwise. Backward twins ADD into every gradient they are given (NULL = not needed), as
 * the CPU ops do. Sizes are checked on the host; cu_seqlens lives on the device and is NOT validated (it must hold
 * n_docs + 1 non-decreasing offsets from 0 to T, as the CPU op checks). Every parameter-gradient reduction is
 * deterministic (fixed order, no atomics). */
#ifndef K3C_CUDA_SEQ_H
#define K3C_CUDA_SEQ_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "k3c.h"

#ifdef __cplusplus
extern "C" {
#endif
#include "ops/basic.h"
#include "ops/kda.h"
#include "ops/short_conv.h"

/* ---------------------------------------------------------------- short convolution + SiLU (ops/short_conv.h)
 * Forward: y [T, C]; state_in / state_out [n_docs, C, W−1] optional, state_out may be the same pointer as state_in. */
int k3c_short_conv_fwd_cuda(const k3c_short_conv_dims *d, const int32_t *cu_seqlens, const float *x, const float *w,
                            const float *state_in, float *y, float *state_out, k3c_err *err);
/* Workspace bytes of the backward: the pre-activation gradient (T·C floats) plus per-segment partial sums of dw
 * (one segment = 256 tokens or more; ⌈T / segment⌉ · C · W floats), each part 256-byte aligned. */
size_t k3c_short_conv_bwd_workspace_cuda(const k3c_short_conv_dims *d);
/* Adds dx [T, C], dw [C, W], dstate_in [n_docs, C, W−1] (each may be NULL). dw: each (token segment, channel) sums its
 * tokens in order, then each weight sums its segments in order (deterministic; the CPU sums all tokens in one run, so
 * the two agree within float rounding of that order). ws: k3c_short_conv_bwd_workspace_cuda bytes (may be NULL when
 * T = 0). */
int k3c_short_conv_bwd_cuda(const k3c_short_conv_dims *d, const int32_t *cu_seqlens, const float *x, const float *w,
                            const float *state_in, const float *dy, float *dx, float *dw, float *dstate_in, void *ws,
                            k3c_err *err);

/* ---------------------------------------------------------------- KDA forget gate (ops/kda.h), both forms */
int k3c_kda_gate_fwd_cuda(const k3c_kda_gate_dims *d, const float *z, const float *dt_bias, const float *A_log,
                          float *g, k3c_err *err);
/* Adds dz [T, H·dk], ddt_bias [H·dk] (Σ over tokens), dA_log [H] (Σ over tokens and channels, in double; only when
 * A_log is given). One cluster of 8 blocks per head (sm_90 thread-block clusters, distributed shared memory for the
 * partial sums): deterministic. dz must not overlap z or dg. */
int k3c_kda_gate_bwd_cuda(const k3c_kda_gate_dims *d, const float *z, const float *dt_bias, const float *A_log,
                          const float *dg, float *dz, float *ddt_bias, float *dA_log, k3c_err *err);

/* ---------------------------------------------------------------- sigmoid gate and sigmoid (ops/basic.h) */
int k3c_sigmoid_gate_fwd_cuda(int64_t n, const float *x, const float *z, float *y, k3c_err *err);
int k3c_sigmoid_gate_bwd_cuda(int64_t n, const float *x, const float *z, const float *dy, float *dx, float *dz,
                              k3c_err *err);
/* y = σ(x) (y may alias x). Returns int, unlike the CPU k3c_sigmoid (launch errors need a channel). */
int k3c_sigmoid_cuda(int64_t n, const float *x, float *y, k3c_err *err);
/* dx += dy · y · (1 − y), y = σ(x) being the forward's OUTPUT (dx may be NULL: nothing to do). */
int k3c_sigmoid_bwd_cuda(int64_t n, const float *y, const float *dy, float *dx, k3c_err *err);

/* ---------------------------------------------------------------- masked cross-entropy (ops/basic.h)
 * Forward: lse [T] on the device; loss and count are HOST pointers (count may be NULL). One block per row (online max /
 * sum, the sum in double), then one block sums the counted rows in double in a fixed order. SYNCHRONISES (to return
 * the loss and to report a counted target >= V as K3C_EINVAL naming it; lse is written even then) and ALLOCATES
 * T·8 + 32 bytes of stream-ordered scratch (cudaMallocAsync / cudaFreeAsync, no device-wide synchronisation). */
int k3c_xent_fwd_cuda(const k3c_xent_sizes *s, const float *logits, const int32_t *targets, const uint8_t *mask,
                      float *lse, double *loss, int64_t *count, k3c_err *err);
/* dlogits[t, :] += (softmax − onehot(target)) · dloss / divisor on counted rows. Does not synchronise, so it cannot
 * report a counted target >= V (the forward does): such a row is skipped and not counted. With s->norm = 0 the divisor
 * (the count) is computed on the device into 8 bytes of stream-ordered scratch (cudaMallocAsync / cudaFreeAsync). */
int k3c_xent_bwd_cuda(const k3c_xent_sizes *s, const float *logits, const int32_t *targets, const uint8_t *mask,
                      const float *lse, double dloss, float *dlogits, k3c_err *err);

#ifdef __cplusplus
}
#endif
#endif
