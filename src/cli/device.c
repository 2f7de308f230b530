/* device.c — `--device cpu|cuda` of the model commands: opens the CUDA backend (ops/backend.h, its table holds the
 * training-step entries too) in a build made with `make cuda`, a clear error in a CPU-only build. */
#include "cli.h"
#include "k3c/device.h"

#include <stdlib.h>
#include <string.h>

/* --gemm: the CUDA backend's k3c_gemm_mode (fp32, the checking mode, by default); -1 when not a known name. */
static int gemm_mode(const char *gemm) {
    if (!gemm || strcmp(gemm, "fp32") == 0) return 0;
    if (strcmp(gemm, "tf32") == 0) return 1;
    if (strcmp(gemm, "bf16") == 0) return 2;
    return -1;
}

/* --kernels: the CUDA backend's k3c_kernel_mode (bf16 by default; fp32 the checking mode); -1 when not known. */
static int kernel_mode(const char *kernels) {
    if (!kernels || strcmp(kernels, "bf16") == 0) return 0;
    if (strcmp(kernels, "fp16") == 0) return 1;
    if (strcmp(kernels, "fp32") == 0) return 2;
    return -1;
}

cli_device_opts cli_device_opts_get(int argc, char **argv) {
    cli_device_opts o = {cli_opt(argc, argv, "--device"), cli_opt(argc, argv, "--gemm"),
                         cli_opt(argc, argv, "--kernels")};
    return o;
}

int cli_device_check(const char *cmd, const cli_device_opts *o) {
    if (o->name && strcmp(o->name, "cpu") != 0 && strcmp(o->name, "cuda") != 0)
        return cli_usage_error(cmd, "--device must be cpu or cuda (got '%s')", o->name);
    if (gemm_mode(o->gemm) < 0) return cli_usage_error(cmd, "--gemm must be fp32, tf32 or bf16 (got '%s')", o->gemm);
    if (kernel_mode(o->kernels) < 0)
        return cli_usage_error(cmd, "--kernels must be bf16, fp16 or fp32 (got '%s')", o->kernels);
    if ((o->gemm || o->kernels) && (!o->name || strcmp(o->name, "cuda") != 0))
        return cli_usage_error(cmd, "--gemm and --kernels apply to --device cuda (the CPU computes in the model's "
                                    "precision)");
    return 0;
}

int cli_local_rank(void) {
    const char *s = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!s) s = getenv("MPI_LOCALRANKID");
    return s ? atoi(s) : 0;
}

int cli_device_open(const cli_device_opts *o, cli_device *d, k3c_err *err) {
    memset(d, 0, sizeof *d);
    k3c_device *dev = NULL;
    /* one GPU per rank under mpirun */
    int rc = k3c_device_open(o->name, cli_local_rank(), o->gemm, o->kernels, &dev, err);
    if (rc) return rc;
    d->handle = dev;
    d->backend = k3c_device_backend(dev);
    return K3C_OK;
}

int cli_device_use(const cli_device *d, k3c_model *m, k3c_err *err) {
    return d->backend ? k3c_model_use_backend_f32(m, d->backend, err) : K3C_OK;
}

void cli_device_release(cli_device *d) {
    k3c_device_close(d->handle);
    memset(d, 0, sizeof *d);
}
