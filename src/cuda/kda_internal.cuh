/* kda_internal.cuh — the pieces shared by the KDA forward (kda_fwd.cu) and backward (kda_bwd.cu): workspace plan and the
 * launchers of the chunk-parallel intra kernel and the sequential state pass. ARCHITECTURE.md §3.2–§3.4. */
#ifndef K3C_CUDA_KDA_INTERNAL_CUH
#define K3C_CUDA_KDA_INTERNAL_CUH

#include "cuda/common.cuh"

namespace k3c_cu {

constexpr int KDA_C = 64;   /* chunk rows of the state pass */
constexpr int KDA_SUB = 16; /* sub-tile rows: the factored exponents stay finite only over 16 tokens (§3.3) */
constexpr float LOG2E = 1.4426950408889634f;

/* Device buffers of one forward (and the forward recompute inside the backward). Token-major like the op's arrays:
 * w, qg, kg [T, H, dk] bf16; u, vnew [T, H, dv] bf16; A [T, H, 64] bf16 (s·(Q Kᵀ ⊙ decay), causal incl. the diagonal);
 * Tinv [T, H, 64] fp32 ((I+L)⁻¹ rows, kept for the backward); gamma [NCmax, H, dk] fp32 (e^{G_C} per chunk);
 * hs [NCmax, H, dk, dv] bf16 (state entering each chunk). Backward only: dob [T, H, dv] bf16 (dout), dh [NCmax, H, dk,
 * dv] bf16 (gradient of the state leaving each chunk), dvn [T, H, dv] bf16 (gradient of Ṽ). */
struct kda_plan {
    int T, H, DK, DV, N, NCmax;
    float scale;
    int bounded;
    const int32_t *cu;
    int *coff;
    bf16 *qb, *kb, *vb; /* bf16 copies of float inputs (float twins only) */
    bf16 *w, *u, *qg, *kg, *A, *vnew, *hs, *dob, *dh, *dvn;
    float *gamma, *Tinv;
};

/* Lays the buffers out over ws (NULL: only counts). want_inputs: room for bf16 q/k/v (and, with want_bwd, dout)
 * copies; want_bwd: Tinv, vnew, hs, dh, dvn. Returns the bytes needed. */
size_t kda_plan_layout(const k3c_kda_dims *d, void *ws, int want_inputs, int want_bwd, kda_plan *p);
int kda_check_dims(const k3c_kda_dims *d, const char *op, k3c_err *err);
/* Converts float inputs to bf16 copies in the plan (float twins). */
int kda_convert_inputs(const kda_plan *p, const float *q, const float *k, const float *v, k3c_err *err);
/* Chunk offsets, then the intra kernel (w, u, qg, kg, A, gamma; with want_bwd also Tinv). */
int kda_run_intra(const kda_plan *p, const bf16 *q, const bf16 *k, const bf16 *v, const float *g, const float *beta,
                  int want_bwd, k3c_err *err);
/* The sequential state pass: o (float or bf16, NULL = not written), ht, and with want_bwd hs and vnew. */
int kda_run_state(const kda_plan *p, const float *h0, void *o, int o_f32, float *ht, int want_bwd, k3c_err *err);

} // namespace k3c_cu

#endif
