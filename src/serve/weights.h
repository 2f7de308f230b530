/* weights.h — the inference engine's weights (the views of model/weights.h): built over a float32 model, opened from a
 * checkpoint as stored, copied to a device, absorbed and checked.
 * Spec: docs/MODEL.md §3.1 (KDA), §4.2 (MLA, absorbed form), §5.3 (AttnRes), §6.2 + §9.2 (MoE); docs/ENGINE.md. */
#ifndef K3C_SERVE_WEIGHTS_H
#define K3C_SERVE_WEIGHTS_H

#include "model/weights.h"

/* Views into the float32 parameters of an opened model, on its backend (nothing copied but the absorbed key side,
 * made in the backend's memory). The model must outlive the weights. */
int k3c_weights_from_model(const k3c_model *m, k3c_weights *w, k3c_err *err);
/* Derives uk_t / uv of every MLA layer from kv_b (a loader calls it after filling kv_b): uk_t is a transposed copy in
 * kv_b's type (float32 or bf16; exact), uv are row views. */
int k3c_weights_absorb(k3c_weights *w, k3c_err *err);
/* Checks every view the config needs is present with the right shape (names the layer and tensor). */
int k3c_weights_check(const k3c_weights *w, k3c_err *err);
/* The weights of a release checkpoint directory (config.json + model.safetensors, or model.safetensors.index.json +
 * shards), mmap'd read-only: bf16 / float32 matrices and MXFP4 experts (weight_packed + weight_scale) are views into
 * the mapping, kept as stored; vectors (norms, biases, A_log, conv kernels) are converted to float. Nothing is
 * dequantised. On failure nothing stays open and the error names the file and tensor. */
int k3c_weights_open(const char *dir, k3c_weights *w, k3c_err *err);
/* A copy of host weights (k3c_weights_open's, as stored) in backend be's memory: one block, every matrix in its stored
 * type (bf16, float32, MXFP4 and its scales), each MoE matrix's experts evenly spaced, vectors as float. src stays
 * as it was; the caller may free it once this returns. */
int k3c_weights_to_backend(const k3c_weights *src, const k3c_backend_f32 *be, k3c_weights *dst, k3c_err *err);

#endif
