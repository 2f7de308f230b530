/* kda_gate.c — the KDA forget-gate activation, softplus and lower-bound forms, forward and backward.
 * Spec: docs/MODEL.md §3.1 step 6, §3.4 stage 6. */
#include "base/real.h"
#include "ops/kda.h"

#define PAR_MIN_WORK 32768 /* elements below which a loop runs on one thread */

/* Both computed without overflow: exp is only taken of non-positive numbers. */
static real sigm(real x) {
    if (x >= 0) return 1 / (1 + rexp(-x));
    real e = rexp(x);
    return e / (1 + e);
}
static real softplus(real x) { return (x > 0 ? x : 0) + rlog1p(rexp(-rfabs(x))); }

static int gate_check(const k3c_kda_gate_dims *d, const char *op, k3c_err *err) {
    if (!d || d->T < 0 || d->H <= 0 || d->dk <= 0)
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes (T >= 0, H > 0, dk > 0)", op);
    if (d->form != K3C_GATE_SOFTPLUS && d->form != K3C_GATE_LOWER_BOUND)
        return k3c_errf(err, K3C_EINVAL, "%s: unknown gate form %d", op, d->form);
    if (d->form == K3C_GATE_LOWER_BOUND && d->g_min > 0)
        return k3c_errf(err, K3C_EINVAL, "%s: g_min = %g must be < 0", op, d->g_min);
    return 0;
}

static real gate_gmin(const k3c_kda_gate_dims *d) { return d->g_min != 0 ? (real)d->g_min : (real)-5; }

int k3c_kda_gate_fwd(const k3c_kda_gate_dims *d, const real *z, const real *dt_bias, const real *A_log, real *g,
                     k3c_err *err) {
    int rc = gate_check(d, "kda_gate_fwd", err);
    if (rc) return rc;
    const int64_t P = d->H * d->dk;
    const real gmin = gate_gmin(d);
    const int lb = d->form == K3C_GATE_LOWER_BOUND;
#pragma omp parallel for schedule(static) if (d->T * P > PAR_MIN_WORK)
    for (int64_t t = 0; t < d->T; t++)
        for (int64_t c = 0; c < P; c++) {
            const real a = A_log ? rexp(A_log[c / d->dk]) : 1;
            const real u = z[t * P + c] + (dt_bias ? dt_bias[c] : 0);
            g[t * P + c] = lb ? gmin * sigm(a * u) : -a * softplus(u);
        }
    return 0;
}

/* Parallel over heads: each head owns its dt_bias channels and its A_log entry, and sums over tokens in order, so the
 * reductions are deterministic and race-free. */
int k3c_kda_gate_bwd(const k3c_kda_gate_dims *d, const real *z, const real *dt_bias, const real *A_log, const real *dg,
                     real *dz, real *ddt_bias, real *dA_log, k3c_err *err) {
    int rc = gate_check(d, "kda_gate_bwd", err);
    if (rc) return rc;
    const int64_t P = d->H * d->dk, dk = d->dk;
    const real gmin = gate_gmin(d);
    const int lb = d->form == K3C_GATE_LOWER_BOUND;
#pragma omp parallel for schedule(dynamic, 1) if (d->T * P > PAR_MIN_WORK)
    for (int64_t h = 0; h < d->H; h++) {
        const real a = A_log ? rexp(A_log[h]) : 1;
        double dA = 0;
        for (int64_t t = 0; t < d->T; t++)
            for (int64_t c = h * dk; c < (h + 1) * dk; c++) {
                const real u = z[t * P + c] + (dt_bias ? dt_bias[c] : 0), G = dg[t * P + c];
                real du, dlogA;
                if (lb) { /* g = g_min σ(a u): ∂g/∂u = g_min a σ(1−σ); ∂g/∂A_log = g_min σ(1−σ) a u */
                    const real s = sigm(a * u), ds = gmin * s * (1 - s);
                    du = ds * a;
                    dlogA = ds * a * u;
                } else { /* g = −a softplus(u): ∂g/∂u = −a σ(u); ∂g/∂A_log = g */
                    du = -a * sigm(u);
                    dlogA = -a * softplus(u);
                }
                if (dz) dz[t * P + c] += G * du;
                if (ddt_bias) ddt_bias[c] += G * du;
                dA += (double)(G * dlogA);
            }
        if (dA_log && A_log) dA_log[h] += (real)dA;
    }
    return 0;
}
