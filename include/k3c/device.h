/* k3c/device.h — the public API of backends by name: the CPU reference, or one GPU of a CUDA build (`make cuda`),
 * whose table models, vision towers and served weights move onto. docs/CODE.md "Ops". */
#ifndef K3C_DEVICE_H
#define K3C_DEVICE_H

#include "k3c.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k3c_device k3c_device;

/* Opens backend `name`: "cpu" (or NULL: *out is NULL, which every use_backend call reads as the CPU) or "cuda", GPU
 * `ordinal`, with the GEMM mode gemm ("fp32", the checking mode and the default when NULL; "tf32"; "bf16") and the
 * KDA / attention kernels ("bf16", the default; "fp16"; "fp32", the checking kernels). K3C_EINVAL names an unknown
 * value; a build without CUDA answers K3C_EUNSUPPORTED. */
int k3c_device_open(const char *name, int ordinal, const char *gemm, const char *kernels, k3c_device **out,
                    k3c_err *err);
/* Its op table (NULL for the CPU), for k3c_model_use_backend_f32, k3c_vision_use_backend_f32, k3c_serve_use_backend. */
const struct k3c_backend_f32 *k3c_device_backend(const k3c_device *d);
/* Releases the device; everything moved onto it must be freed first. NULL: nothing. */
void k3c_device_close(k3c_device *d);

#ifdef __cplusplus
}
#endif
#endif
