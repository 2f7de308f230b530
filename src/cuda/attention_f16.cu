/* attention_f16.cu — the flash attention kernels (attention.cu) compiled a second time with fp16 elements:
 * k3c_attention_{fwd,bwd}_f16_cuda (cuda_ops.h). docs/MODEL.md §4. */
#define K3C_CU_F16 1
#include "cuda/attention.cu"
