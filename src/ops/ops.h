/* ops.h — the op convention shared by every CPU op (src/ops) and its CUDA twin (src/cuda), and the list of op headers.
 *
 * Convention (docs/CODE.md "Ops"):
 *  - An op is k3c_<op>_fwd / k3c_<op>_bwd, written once on `real` (base/real.h) and compiled as _f32 and _f64.
 *  - Arguments: a small const struct of sizes, then contiguous row-major arrays, then an optional workspace
 *    (`void *ws`, size from k3c_<op>_workspace(sizes) in bytes). No allocation inside an op. Returns 0 or a k3c_status.
 *  - Activations are token-major: x[T, D] over the T tokens of a packed batch. Document boundaries are
 *    `const int32_t *cu_seqlens` (n_docs + 1 offsets, 0 .. T); every sequence-mixing op resets its state there.
 *  - Linear weights use the checkpoint layout W[out, in]: y = x Wᵀ.
 *  - Backward ADDS into every gradient buffer it is given (inputs and parameters alike); callers zero them first.
 *    A NULL gradient pointer means "not needed".
 */
#ifndef K3C_OPS_H
#define K3C_OPS_H

#include "base/real_decl.h"
#include "base/base.h"

#endif
