/* golden.h — comparison of a model's gradients with a golden safetensors file (grad.<name> tensors under checkpoint
 * names or transformers' internal Kimi-Linear names). Spec: shared/golden/README.md. */
#ifndef K3C_MODEL_GOLDEN_H
#define K3C_MODEL_GOLDEN_H

#include "model/model.h"

typedef struct {
    char name[192];
    double rel_err; /* ‖ours − ref‖ / ‖ref‖ (0 when ref is exactly zero) */
    double abs_err; /* max |ours − ref| (the measure for all-zero references) */
    double ref_norm;
} k3c_golden_row;

#define K3C_GOLDEN_API(real, S)                                                                                        \
    int k3c_golden_grads_##S(const k3c_model *m, const k3c_safetensors *golden, k3c_golden_row *rows, int max_rows,    \
                             int *n_rows, k3c_err *err);
K3C_DECLARE_REAL(K3C_GOLDEN_API)

#endif
