/* kda_gate.cu — fp32 CUDA twin of the KDA forget gate (softplus and lower-bound forms), forward and backward
 * (ops/kda_gate.c term by term). docs/MODEL.md §3.1 step 6, §3.4 stage 6; declarations in cuda/cuda_ops.h. */
#include <cooperative_groups.h>
#include <limits.h>

#include "cuda/kernels.cuh"

namespace cg = cooperative_groups;

namespace {

/* ================================================================ KDA forget gate (kda_gate.c) */
__global__ void gate_fwd_kernel(int64_t n, int64_t P, int64_t dk, int lb, float gmin, const float *z,
                                const float *dt_bias, const float *A_log, float *g) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = i % P;
        const float a = A_log ? exp_cr(A_log[c / dk]) : 1.f;
        const float u = z[i] + (dt_bias ? dt_bias[c] : 0.f);
        g[i] = lb ? gmin * sigm(a * u) : -a * softplus(u);
    }
}

#define GATE_THREADS 512
#define GATE_CLUSTER 8 /* blocks per head: the portable cluster size */
/* One thread-block cluster per head (it owns that head's dt_bias channels and its A_log entry, so no reduction leaves
 * the cluster and no workspace is needed): lanes take 32 consecutive channels (coalesced), the cluster's warps take
 * every (8·nw)-th token. Rank 0 adds the partial ddt_bias sums of every block's warps, read through distributed shared
 * memory in (rank, warp) order, and dA_log (double, as on the CPU) from each block's reduction in rank order:
 * deterministic. Every branch around a cluster barrier depends on kernel arguments only, so all threads reach it. */
__global__ void __cluster_dims__(GATE_CLUSTER, 1, 1)
    gate_bwd_kernel(int64_t T, int64_t P, int64_t dk, int lb, float gmin, const float *__restrict__ z,
                    const float *__restrict__ dt_bias, const float *__restrict__ A_log, const float *__restrict__ dg,
                    float *__restrict__ dz, float *__restrict__ ddt_bias, float *__restrict__ dA_log) {
    __shared__ float part[GATE_THREADS / 32][33];
    __shared__ double red[32];
    __shared__ double block_dA;
    cg::cluster_group cl = cg::this_cluster();
    const unsigned rank = cl.block_rank();
    const int64_t h = blockIdx.x / GATE_CLUSTER, cend = (h + 1) * dk;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t tstride = (int64_t)nw * GATE_CLUSTER;
    const float a = A_log ? exp_cr(A_log[h]) : 1.f;
    double dA = 0;
    for (int64_t c0 = h * dk; c0 < cend; c0 += 32) {
        const int64_t c = c0 + lane;
        float db = 0.f;
        if (c < cend) {
            const float bias = dt_bias ? dt_bias[c] : 0.f;
#pragma unroll 4
            for (int64_t t = rank * nw + warp; t < T; t += tstride) {
                const float u = z[t * P + c] + bias, G = dg[t * P + c];
                float du, dlogA;
                if (lb) { /* g = g_min σ(a u): ∂g/∂u = g_min a σ(1−σ); ∂g/∂A_log = g_min σ(1−σ) a u */
                    const float s = sigm(a * u), ds = gmin * s * (1.f - s);
                    du = ds * a;
                    dlogA = ds * a * u;
                } else { /* g = −a softplus(u): ∂g/∂u = −a σ(u); ∂g/∂A_log = g */
                    du = -a * sigm(u);
                    dlogA = -a * softplus(u);
                }
                if (dz) dz[t * P + c] += G * du;
                db += G * du;
                dA += (double)(G * dlogA);
            }
        }
        if (ddt_bias) {
            cl.sync(); /* rank 0 has finished reading every block's part for the previous channel group */
            part[warp][lane] = db;
            cl.sync();
            if (rank == 0 && warp == 0 && c < cend) {
                float s = ddt_bias[c];
                for (unsigned r = 0; r < GATE_CLUSTER; r++) {
                    const float *pr = cl.map_shared_rank(&part[0][0], r);
                    for (int i = 0; i < nw; i++) s += pr[i * 33 + lane];
                }
                ddt_bias[c] = s;
            }
        }
    }
    if (dA_log && A_log) {
        dA = block_reduce(dA, op_sum(), red);
        if (threadIdx.x == 0) block_dA = dA;
        cl.sync();
        if (rank == 0 && threadIdx.x == 0) {
            double s = 0;
            for (unsigned r = 0; r < GATE_CLUSTER; r++) s += *cl.map_shared_rank(&block_dA, r);
            dA_log[h] += (float)s;
        }
    }
    cl.sync(); /* no block leaves while rank 0 may still read its shared memory */
}

int gate_check(const k3c_kda_gate_dims *d, const char *op, k3c_err *err) {
    if (!d || d->T < 0 || d->H <= 0 || d->dk <= 0)
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes (T >= 0, H > 0, dk > 0)", op);
    if (d->H > INT_MAX / 8) return k3c_errf(err, K3C_EINVAL, "%s: H = %lld heads is too many", op, (long long)d->H);
    if (d->form != K3C_GATE_SOFTPLUS && d->form != K3C_GATE_LOWER_BOUND)
        return k3c_errf(err, K3C_EINVAL, "%s: unknown gate form %d", op, d->form);
    if (d->form == K3C_GATE_LOWER_BOUND && d->g_min > 0)
        return k3c_errf(err, K3C_EINVAL, "%s: g_min = %g must be < 0", op, d->g_min);
    return 0;
}

} // namespace

/* ================================================================ C entry points: KDA gate */
extern "C" int k3c_kda_gate_fwd_cuda(const k3c_kda_gate_dims *d, const float *z, const float *dt_bias,
                                     const float *A_log, float *g, k3c_err *err) {
    int rc = gate_check(d, "kda_gate_fwd_cuda", err);
    if (rc) return rc;
    const int64_t P = d->H * d->dk, n = d->T * P;
    if (n == 0) return 0;
    const float gmin = d->g_min != 0 ? (float)d->g_min : -5.f;
    gate_fwd_kernel<<<grid_for(n, 256), 256, 0, K3C_STREAM>>>(n, P, d->dk, d->form == K3C_GATE_LOWER_BOUND, gmin, z,
                                                              dt_bias, A_log, g);
    K3C_CU_LAUNCHED("kda_gate_fwd");
    return 0;
}

extern "C" int k3c_kda_gate_bwd_cuda(const k3c_kda_gate_dims *d, const float *z, const float *dt_bias,
                                     const float *A_log, const float *dg, float *dz, float *ddt_bias, float *dA_log,
                                     k3c_err *err) {
    int rc = gate_check(d, "kda_gate_bwd_cuda", err);
    if (rc) return rc;
    if (d->T == 0 || (!dz && !ddt_bias && !(dA_log && A_log))) return 0;
    const float gmin = d->g_min != 0 ? (float)d->g_min : -5.f;
    gate_bwd_kernel<<<(unsigned)(d->H * GATE_CLUSTER), GATE_THREADS, 0, K3C_STREAM>>>(
        d->T, d->H * d->dk, d->dk, d->form == K3C_GATE_LOWER_BOUND, gmin, z, dt_bias, A_log, dg, dz, ddt_bias, dA_log);
    K3C_CU_LAUNCHED("kda_gate_bwd");
    return 0;
}
