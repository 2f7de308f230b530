/* kda_step.cuh — one token of the delta rule on a thread's slice of a state column, shared by the recurrent KDA forward
 * (kda_recurrent.cu) and the engine's decode step (decode.cu). docs/MODEL.md §3.1 step 7. */
#ifndef K3C_CUDA_KDA_STEP_CUH
#define K3C_CUDA_KDA_STEP_CUH

namespace k3c_cu {

/* Four consecutive lanes share one state column, each holding KP of its rows in S: S ← diag(e) S, then
 * S += k·β(v − kᵀS) and the column's output qᵀS. The lane-partial dot products close with two shuffles, so all 32 lanes
 * of the warp must call it (dead lanes pass live = false and never read *v). q arrives pre-scaled. */
template <int KP>
__device__ __forceinline__ float kda_token_step(float (&S)[KP], const float *e, const float *k, const float *q,
                                                float beta, const float *v, bool live) {
    float rr = 0.f;
#pragma unroll
    for (int i = 0; i < KP; i++) {
        S[i] *= e[i];
        rr += S[i] * k[i];
    }
    rr += __shfl_xor_sync(0xffffffffu, rr, 1);
    rr += __shfl_xor_sync(0xffffffffu, rr, 2);
    const float delta = live ? beta * (*v - rr) : 0.f;
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < KP; i++) {
        S[i] += k[i] * delta;
        acc += S[i] * q[i];
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    acc += __shfl_xor_sync(0xffffffffu, acc, 2);
    return acc;
}

} // namespace k3c_cu

#endif
