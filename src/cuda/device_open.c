/* device_open.c — k3c/device.h: a backend opened by name, the CUDA table in a build made with `make cuda` (this file
 * is compiled by the C compiler in both builds) and a clear error in a CPU-only one. docs/CODE.md "Ops". */
#include "base/base.h"
#include "ops/backend.h"

#include <stdlib.h>
#include <string.h>

#ifdef K3C_CUDA
#include "cuda/cuda_ops.h"
#endif

struct k3c_device {
#ifdef K3C_CUDA
    k3c_cuda_backend b;
#else
    int unused;
#endif
};

/* The index of value in names (NULL: 0), or −1. */
static int pick(const char *value, const char *const *names, int n) {
    if (!value) return 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(value, names[i])) return i;
    return -1;
}

int k3c_device_open(const char *name, int ordinal, const char *gemm, const char *kernels, k3c_device **out,
                    k3c_err *err) {
    static const char *const gemms[] = {"fp32", "tf32", "bf16"}, *const kerns[] = {"bf16", "fp16", "fp32"};
    *out = NULL;
    const int g = pick(gemm, gemms, 3), k = pick(kernels, kerns, 3);
    if (g < 0) return k3c_errf(err, K3C_EINVAL, "device: GEMM mode '%s' (fp32, tf32 or bf16)", gemm);
    if (k < 0) return k3c_errf(err, K3C_EINVAL, "device: kernels '%s' (bf16, fp16 or fp32)", kernels);
    if (!name || !strcmp(name, "cpu")) return K3C_OK;
    if (strcmp(name, "cuda") != 0) return k3c_errf(err, K3C_EINVAL, "device: '%s' is not cpu or cuda", name);
#ifdef K3C_CUDA
    k3c_device *d = calloc(1, sizeof *d);
    if (!d) return k3c_errf(err, K3C_ENOMEM, "device: out of memory");
    int rc = k3c_cuda_backend_init(&d->b, ordinal, g, err);
    if (rc) {
        free(d);
        return rc;
    }
    k3c_cuda_backend_kernels(&d->b, k);
    *out = d;
    return K3C_OK;
#else
    (void)ordinal;
    return k3c_errf(err, K3C_EUNSUPPORTED,
                    "--device cuda: this k3c was built without CUDA (build build/cuda/k3c with `make cuda` and run "
                    "that binary)");
#endif
}

const struct k3c_backend_f32 *k3c_device_backend(const k3c_device *d) {
#ifdef K3C_CUDA
    return d ? &d->b.table : NULL;
#else
    (void)d;
    return NULL;
#endif
}

void k3c_device_close(k3c_device *d) {
#ifdef K3C_CUDA
    if (d) k3c_cuda_backend_destroy(&d->b);
#endif
    free(d);
}
