/* kda_recurrent.c — the KDA token recurrence, forward and token-level backward (the CPU reference and the decode step).
 * Spec: docs/MODEL.md §3.1 step 7 (step form), §3.4 "Token-level reference backward", §3.5. */
#include "base/real.h"
#include "ops/kda.h"

#include <string.h>

#define PAR_MIN_WORK (1 << 17) /* below this many state elements × tokens, one thread (no fork/join cost) */

#define SIMD _Pragma("omp simd")

/* One token of one head, in place on S [dk, dv]: P = Diag(α) S; r = Pᵀk; δ = β (v − r); S = P + k δᵀ;
 * o = Sᵀ(s q) = Pᵀ(s q) + (k · s q) δ, so the state is read and written in two row passes. o may be NULL. */
static void kda_step(int64_t dk, int64_t dv, real *S, const real *q, const real *k, const real *v, const real *g,
                     real beta, real scale, real *o) {
    real r[K3C_KDA_MAX_HEAD_DIM], p[K3C_KDA_MAX_HEAD_DIM];
    memset(r, 0, (size_t)dv * sizeof(real));
    memset(p, 0, (size_t)dv * sizeof(real));
    real kq = 0;
    for (int64_t i = 0; i < dk; i++) {
        real a = rexp(g[i]), ki = k[i], qi = o ? scale * q[i] : 0;
        real *row = S + i * dv;
        SIMD for (int64_t j = 0; j < dv; j++) {
            row[j] *= a;
            r[j] += ki * row[j];
            p[j] += qi * row[j];
        }
        kq += ki * qi;
    }
    SIMD for (int64_t j = 0; j < dv; j++) r[j] = beta * (v[j] - r[j]); /* r is now δ */
    for (int64_t i = 0; i < dk; i++) {
        real ki = k[i], *row = S + i * dv;
        SIMD for (int64_t j = 0; j < dv; j++) row[j] += ki * r[j];
    }
    if (o) SIMD for (int64_t j = 0; j < dv; j++) o[j] = p[j] + kq * r[j];
}

size_t k3c_kda_recurrent_fwd_workspace(const k3c_kda_dims *d) {
    int64_t nd = d->n_docs > 0 ? d->n_docs : 1;
    return (size_t)(nd * d->H * d->dk * d->dv) * sizeof(real);
}

int k3c_kda_recurrent_fwd(const k3c_kda_dims *d, const int32_t *cu_seqlens, const real *q, const real *k, const real *v,
                          const real *g, const real *beta, const real *h0, real *o, real *ht, void *ws, k3c_err *err) {
    int rc = k3c_kda_check_(d, cu_seqlens, "kda_recurrent_fwd", err);
    if (rc) return rc;
    if (!ht && !ws) return k3c_errf(err, K3C_EINVAL, "kda_recurrent_fwd: ws is NULL and ht is NULL");
    const int64_t H = d->H, dk = d->dk, dv = d->dv, SS = dk * dv;
    const int nd = k3c_kda_ndocs_(d, cu_seqlens);
    const real scale = (real)k3c_kda_scale_(d);
    const int64_t items = (int64_t)nd * H;
#pragma omp parallel for schedule(dynamic, 1) if (d->T * H * dk * dv > PAR_MIN_WORK)
    for (int64_t it = 0; it < items; it++) {
        const int doc = (int)(it / H);
        const int64_t h = it % H;
        real *S = ht ? ht + it * SS : (real *)ws + it * SS;
        if (!h0)
            memset(S, 0, (size_t)SS * sizeof(real));
        else if (h0 + it * SS != S)
            memcpy(S, h0 + it * SS, (size_t)SS * sizeof(real));
        const int64_t t1 = k3c_kda_bos_(cu_seqlens, d->T, doc + 1);
        for (int64_t t = k3c_kda_bos_(cu_seqlens, d->T, doc); t < t1; t++) {
            const int64_t xk = (t * H + h) * dk, xv = (t * H + h) * dv;
            kda_step(dk, dv, S, q + xk, k + xk, v + xv, g + xk, beta[t * H + h], scale, o + xv);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- backward
 * Workspace: per (doc, head) a checkpoint at the start of every segment of `seg` tokens, one segment's states
 * (seg + 1 of them: the checkpoint and the state after each token) and the running dS. Offsets come from prefix sums
 * over the documents, stored at the front of the workspace. */
static int64_t rec_seg(const k3c_kda_dims *d) { return d->chunk > 0 ? d->chunk : 64; }

typedef struct {
    int64_t *pre_seg;  /* [nd + 1]: Σ segments of earlier documents */
    int64_t *pre_rows; /* [nd + 1]: Σ (min(len, seg) + 2) of earlier documents */
    real *ckpt, *rows;
    int64_t nseg_total, nrows_total;
} rec_ws;

static size_t rec_header_bytes(int64_t nd) { return ((size_t)(2 * (nd + 1)) * sizeof(int64_t) + 63) & ~(size_t)63; }

size_t k3c_kda_recurrent_bwd_workspace(const k3c_kda_dims *d) {
    const int64_t nd = d->n_docs > 0 ? d->n_docs : 1, seg = rec_seg(d), SS = d->dk * d->dv;
    int64_t rows = d->T < nd * seg ? d->T : nd * seg;
    int64_t nseg = d->T / seg + nd, nrows = rows + 2 * nd;
    return rec_header_bytes(nd) + (size_t)(d->H * (nseg + nrows) * SS) * sizeof(real);
}

static rec_ws rec_layout(const k3c_kda_dims *d, const int32_t *cu, int nd, void *ws) {
    rec_ws w;
    const int64_t seg = rec_seg(d);
    w.pre_seg = (int64_t *)ws;
    w.pre_rows = w.pre_seg + nd + 1;
    w.pre_seg[0] = w.pre_rows[0] = 0;
    for (int i = 0; i < nd; i++) {
        int64_t len = k3c_kda_bos_(cu, d->T, i + 1) - k3c_kda_bos_(cu, d->T, i);
        w.pre_seg[i + 1] = w.pre_seg[i] + (len + seg - 1) / seg;
        w.pre_rows[i + 1] = w.pre_rows[i] + (len < seg ? len : seg) + 2;
    }
    w.nseg_total = w.pre_seg[nd];
    w.nrows_total = w.pre_rows[nd];
    w.ckpt = (real *)((char *)ws + rec_header_bytes(nd));
    w.rows = w.ckpt + d->H * w.nseg_total * d->dk * d->dv;
    return w;
}

typedef struct {
    const real *q, *k, *v, *g, *do_;
    real beta, scale;
} tok_in;

/* Backward of one token (§3.4 token-level): S_prev, S_cur the states around it, dS the gradient w.r.t. S_cur (without
 * this token's readout); on return dS is the gradient w.r.t. S_prev. Gradients are added into the non-NULL outputs. */
static void kda_step_bwd(int64_t dk, int64_t dv, const real *Sp, const real *Sc, real *dS, const tok_in *x, real *dq,
                         real *dkk, real *dvv, real *dg, real *dbeta) {
    real r[K3C_KDA_MAX_HEAD_DIM], dd[K3C_KDA_MAX_HEAD_DIM];
    memset(r, 0, (size_t)dv * sizeof(real));
    memset(dd, 0, (size_t)dv * sizeof(real));
    const real s = x->scale;
    for (int64_t i = 0; i < dk; i++) { /* readout into dS and dq; r = Pᵀk; dδ = dSᵀk */
        const real a = rexp(x->g[i]), ki = x->k[i], sqi = s * x->q[i];
        const real *sp = Sp + i * dv, *sc = Sc + i * dv;
        real *ds = dS + i * dv, acc = 0;
        _Pragma("omp simd reduction(+ : acc)") for (int64_t j = 0; j < dv; j++) {
            real doj = x->do_ ? x->do_[j] : 0;
            ds[j] += sqi * doj;
            acc += sc[j] * doj;
            r[j] += ki * a * sp[j];
            dd[j] += ki * ds[j];
        }
        if (dq) dq[i] += s * acc;
    }
    real dbs = 0;
    for (int64_t j = 0; j < dv; j++) {
        real vr = x->v[j] - r[j];
        if (dvv) dvv[j] += x->beta * dd[j];
        dbs += dd[j] * vr;
        r[j] = x->beta * vr;      /* r is now δ */
        dd[j] = -x->beta * dd[j]; /* dd is now dr */
    }
    if (dbeta) *dbeta += dbs;
    for (int64_t i = 0; i < dk; i++) { /* dk = dS δ + P dr; dP = dS + k drᵀ; dg = Σ P⊙dP; dS_prev = α dP */
        const real a = rexp(x->g[i]), ki = x->k[i];
        const real *sp = Sp + i * dv;
        real *ds = dS + i * dv, acck = 0, accg = 0;
        _Pragma("omp simd reduction(+ : acck, accg)") for (int64_t j = 0; j < dv; j++) {
            real P = a * sp[j], dP = ds[j] + ki * dd[j];
            acck += ds[j] * r[j] + P * dd[j];
            accg += P * dP;
            ds[j] = a * dP;
        }
        if (dkk) dkk[i] += acck;
        if (dg) dg[i] += accg;
    }
}

int k3c_kda_recurrent_bwd(const k3c_kda_dims *d, const int32_t *cu_seqlens, const real *q, const real *k, const real *v,
                          const real *g, const real *beta, const real *h0, const real *dout, const real *dht, real *dq,
                          real *dk, real *dv, real *dg, real *dbeta, real *dh0, void *ws, k3c_err *err) {
    int rc = k3c_kda_check_(d, cu_seqlens, "kda_recurrent_bwd", err);
    if (rc) return rc;
    if (!ws) return k3c_errf(err, K3C_EINVAL, "kda_recurrent_bwd: ws is NULL (k3c_kda_recurrent_bwd_workspace bytes)");
    const int64_t H = d->H, DK = d->dk, DV = d->dv, SS = DK * DV, seg = rec_seg(d);
    const int nd = k3c_kda_ndocs_(d, cu_seqlens);
    const real scale = (real)k3c_kda_scale_(d);
    const rec_ws w = rec_layout(d, cu_seqlens, nd, ws);
    const int64_t items = (int64_t)nd * H;
#pragma omp parallel for schedule(dynamic, 1) if (d->T * H * SS > PAR_MIN_WORK)
    for (int64_t it = 0; it < items; it++) {
        const int doc = (int)(it / H);
        const int64_t h = it % H;
        const int64_t t0 = k3c_kda_bos_(cu_seqlens, d->T, doc), t1 = k3c_kda_bos_(cu_seqlens, d->T, doc + 1);
        const int64_t nseg = w.pre_seg[doc + 1] - w.pre_seg[doc];
        real *ck = w.ckpt + (h * w.nseg_total + w.pre_seg[doc]) * SS;
        real *st = w.rows + (h * w.nrows_total + w.pre_rows[doc]) * SS; /* states of one segment */
        real *dS = st + (w.pre_rows[doc + 1] - w.pre_rows[doc] - 1) * SS;
        /* Forward: checkpoint the state entering every segment. */
        if (h0)
            memcpy(st, h0 + it * SS, (size_t)SS * sizeof(real));
        else
            memset(st, 0, (size_t)SS * sizeof(real));
        for (int64_t s = 0; s < nseg; s++) {
            memcpy(ck + s * SS, st, (size_t)SS * sizeof(real));
            if (s == nseg - 1) break;
            for (int64_t t = t0 + s * seg; t < t0 + (s + 1) * seg; t++)
                kda_step(DK, DV, st, q, k + (t * H + h) * DK, v + (t * H + h) * DV, g + (t * H + h) * DK,
                         beta[t * H + h], scale, NULL);
        }
        if (dht)
            memcpy(dS, dht + it * SS, (size_t)SS * sizeof(real));
        else
            memset(dS, 0, (size_t)SS * sizeof(real));
        /* Backward, segment by segment from the last: recompute the segment's states, then walk its tokens back. */
        for (int64_t s = nseg - 1; s >= 0; s--) {
            const int64_t a = t0 + s * seg, b = a + seg < t1 ? a + seg : t1;
            memcpy(st, ck + s * SS, (size_t)SS * sizeof(real));
            for (int64_t t = a; t < b; t++) {
                real *nx = st + (t - a + 1) * SS;
                memcpy(nx, nx - SS, (size_t)SS * sizeof(real));
                kda_step(DK, DV, nx, q, k + (t * H + h) * DK, v + (t * H + h) * DV, g + (t * H + h) * DK,
                         beta[t * H + h], scale, NULL);
            }
            for (int64_t t = b - 1; t >= a; t--) {
                const int64_t xk = (t * H + h) * DK, xv = (t * H + h) * DV;
                tok_in x = {q + xk, k + xk, v + xv, g + xk, dout ? dout + xv : NULL, beta[t * H + h], scale};
                kda_step_bwd(DK, DV, st + (t - a) * SS, st + (t - a + 1) * SS, dS, &x, dq ? dq + xk : NULL,
                             dk ? dk + xk : NULL, dv ? dv + xv : NULL, dg ? dg + xk : NULL,
                             dbeta ? dbeta + t * H + h : NULL);
            }
        }
        if (dh0)
            for (int64_t e = 0; e < SS; e++) dh0[it * SS + e] += dS[e];
    }
    return 0;
}
