/* kda_internal.cuh — the pieces shared by the KDA forward (kda_fwd.cu) and backward (kda_bwd.cu): workspace plan and the
 * launchers of the chunk-parallel intra kernel and the sequential state pass. docs/MODEL.md §3.2–§3.4. */
#ifndef K3C_CUDA_KDA_INTERNAL_CUH
#define K3C_CUDA_KDA_INTERNAL_CUH

#include "cuda/common.cuh"

namespace k3c_cu {
namespace K3C_ELEM_NS {

constexpr int KDA_C = 64;   /* chunk rows of the state pass */
constexpr int KDA_SUB = 16; /* sub-tile rows: the factored exponents stay finite only over 16 tokens (§3.3) */
constexpr float LOG2E = 1.4426950408889634f;

/* Device buffers of one forward (and the forward recompute inside the backward). Token-major like the op's arrays:
 * w, qg, kg [T, H, dk] elem; u, vnew [T, H, dv] elem; A [T, H, 64] elem (s·(Q Kᵀ ⊙ decay), causal incl. the diagonal);
 * Tinv [T, H, 64] fp32 ((I+L)⁻¹ rows, kept for the backward); gamma [NCmax, H, dk] fp32 (e^{G_C} per chunk);
 * hs [NCmax, H, dk, dv] elem (state entering each chunk). Backward only: dob [T, H, dv] elem (dout), dh [NCmax, H, dk,
 * dv] elem (gradient of the state leaving each chunk), dvn [T, H, dv] elem (gradient of Ṽ). */
struct kda_plan {
    int T, H, DK, DV, N, NCmax;
    float scale;
    int bounded;
    const int32_t *cu;
    int *coff;
    elem *qb, *kb, *vb; /* elem copies of float inputs (float twins only) */
    elem *w, *u, *qg, *kg, *A, *vnew, *hs, *dob, *dh, *dvn;
    float *gamma, *Tinv;
    float *gscale; /* fp16 backward: the gradient scale (k3c_cuda_pow2_scale), NULL for bf16 */
};

/* Lays the buffers out over ws (NULL: only counts). want_inputs: room for elem q/k/v (and, with want_bwd, dout)
 * copies; want_bwd: Tinv, vnew, hs, dh, dvn. Returns the bytes needed. */
size_t kda_plan_layout(const k3c_kda_dims *d, void *ws, int want_inputs, int want_bwd, kda_plan *p);
int kda_check_dims(const k3c_kda_dims *d, const char *op, k3c_err *err);
/* Converts float inputs to elem copies in the plan (float twins). */
int kda_convert_inputs(const kda_plan *p, const float *q, const float *k, const float *v, k3c_err *err);
/* Chunk offsets, then the intra kernel (w, u, qg, kg, A, gamma; with want_bwd also Tinv). */
int kda_run_intra(const kda_plan *p, const elem *q, const elem *k, const elem *v, const float *g, const float *beta,
                  int want_bwd, k3c_err *err);
/* The sequential state pass: o (float or elem, NULL = not written), ht, and with want_bwd hs and vnew. */
int kda_run_state(const kda_plan *p, const float *h0, void *o, int o_f32, float *ht, int want_bwd, k3c_err *err);

} // namespace K3C_ELEM_NS
} // namespace k3c_cu

#endif
