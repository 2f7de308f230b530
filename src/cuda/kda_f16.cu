/* kda_f16.cu — the chunked KDA forward and backward kernels (kda_fwd.cu, kda_bwd.cu) compiled a second time with fp16
 * elements: k3c_kda_chunk_{fwd,bwd}_f16_cuda (cuda_ops.h). docs/MODEL.md §3.2–§3.4. */
#define K3C_CU_F16 1
#include "cuda/kda_fwd.cu"
#include "cuda/kda_bwd.cu"
