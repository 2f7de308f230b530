/* glu.c — SiLU-GLU, SiTU-GLU and GELU-GLU activations h = act(g) ⊙ c(u), forward and exact backward.
 * Implements docs/MODEL.md §8 (derivatives as in NeMo's _situ_bwd_core; GeGLU: docs/TRAINING.md §1.6). */
#include "base/real.h"
#include "ops/glu.h"

/* Below this many element operations a parallel region costs more than it saves (tiny models, FD tests). */
#define PAR_MIN_WORK 32768

static int check_sizes(const k3c_glu_sizes *s, const char *op, k3c_err *err) {
    if (!s || s->rows < 0 || s->inter < 0) return k3c_errf(err, K3C_EINVAL, "%s: bad sizes", op);
    if (k3c_glu_act_ok(&s->act)) return 0;
    return k3c_errf(err, K3C_EINVAL, "%s: activation %d with betas (%g, %g): need SiLU, GELU, or SiTU with betas > 0",
                    op, s->act.act, s->act.beta1, s->act.beta2);
}

/* tanh for float: libm's tanhf (via expm1f) dominated the CPU profile of a SiTU model. One expf for |x| ≥ 0.125
 * (relative error a few ulps there), an odd Taylor polynomial below (truncation < 1e-12). double keeps libm's tanh. */
#if K3C_REAL_DOUBLE
#define tanh_glu tanh
#else
static inline float tanh_glu(float x) {
    float a = fabsf(x);
    if (a < 0.125f) {
        float x2 = x * x;
        return x * (1.0f + x2 * (-1.0f / 3 + x2 * (2.0f / 15 + x2 * (-17.0f / 315 + x2 * (62.0f / 2835)))));
    }
    float e = expf(-2.0f * a), t = (1.0f - e) / (1.0f + e);
    return x < 0 ? -t : t;
}
#endif

/* 1/(1 + e^−g): exp overflows to +inf for g ≪ 0, giving exactly 0, which is the right limit. */
static inline real sigmoid(real g) { return (real)1 / ((real)1 + rexp(-g)); }

#define INV_SQRT2 0.7071067811865476
#define INV_SQRT_2PI 0.3989422804014327

/* One element: a = act(g), c = c(u) and their derivatives. SiLU: a = gσ(g), a' = σ + gσ(1−σ), c = u.
 * GELU: Φ = ½(1 + erf(g/√2)), a = gΦ, a' = Φ + g·φ(g) with φ(g) = e^(−g²/2)/√(2π), c = u.
 * SiTU: t = tanh(g/β1), a = β1·t·σ(g) (the sigmoid sees the uncapped g), a' = (1−t²)σ + β1·t·σ(1−σ);
 *       τ = tanh(u/β2), c = β2·τ, c' = 1−τ². */
static inline void glu_point(const k3c_glu_act *act, real b1, real b2, real g, real u, real *a, real *c, real *da,
                             real *dc) {
    if (act->act == K3C_ACT_GELU) {
        real phi = (real)0.5 * ((real)1 + rerf(g * (real)INV_SQRT2));
        *a = g * phi;
        *da = phi + g * (real)INV_SQRT_2PI * rexp((real)-0.5 * g * g);
        *c = u;
        *dc = 1;
        return;
    }
    real sg = sigmoid(g);
    if (act->act == K3C_ACT_SILU) {
        *a = g * sg;
        *da = sg + g * sg * ((real)1 - sg);
        *c = u;
        *dc = 1;
    } else {
        real t = tanh_glu(g / b1), tau = tanh_glu(u / b2);
        *a = b1 * t * sg;
        *da = ((real)1 - t * t) * sg + b1 * t * sg * ((real)1 - sg);
        *c = b2 * tau;
        *dc = (real)1 - tau * tau;
    }
}

int k3c_glu_fwd(const k3c_glu_sizes *s, const real *gate, const real *up, real *h, k3c_err *err) {
    if (check_sizes(s, "glu_fwd", err)) return K3C_EINVAL;
    const int64_t n = s->rows * s->inter;
    const real b1 = (real)s->act.beta1, b2 = (real)s->act.beta2;
#pragma omp parallel for schedule(static) if (n > PAR_MIN_WORK / 16)
    for (int64_t i = 0; i < n; i++) {
        real a, c, da, dc;
        glu_point(&s->act, b1, b2, gate[i], up[i], &a, &c, &da, &dc);
        h[i] = a * c;
    }
    return 0;
}

int k3c_glu_bwd(const k3c_glu_sizes *s, const real *gate, const real *up, const real *dh, real *dgate, real *dup,
                k3c_err *err) {
    if (check_sizes(s, "glu_bwd", err)) return K3C_EINVAL;
    const int64_t n = s->rows * s->inter;
    const real b1 = (real)s->act.beta1, b2 = (real)s->act.beta2;
#pragma omp parallel for schedule(static) if (n > PAR_MIN_WORK / 16)
    for (int64_t i = 0; i < n; i++) {
        real a, c, da, dc;
        glu_point(&s->act, b1, b2, gate[i], up[i], &a, &c, &da, &dc);
        if (dgate) dgate[i] += dh[i] * c * da;
        if (dup) dup[i] += dh[i] * a * dc;
    }
    return 0;
}
