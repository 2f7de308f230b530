/* rl_loss.c — the RL-with-verifiable-rewards math: group-relative advantages (GRPO, Dr. GRPO), zero-variance group
 * dropping, DAPO dynamic sampling's group selection, pass@k, overlong penalty, the clipped surrogate with clip-higher
 * and truncated importance sampling, k3 KL, three aggregations, and its gradient with
 * respect to each token's log-probability (what the model's weighted cross-entropy backward consumes). TRAINING.md §3. */
#include "base/base.h"

#include <math.h>

int k3c_rl_advantages(const double *r, int n_groups, int G, int std_norm, double *adv, uint8_t *keep) {
    int zero = 0;
    for (int g = 0; g < n_groups; g++) {
        const double *x = r + (size_t)g * G;
        double *a = adv + (size_t)g * G;
        double mean = 0, lo = x[0], hi = x[0];
        for (int i = 0; i < G; i++) {
            mean += x[i];
            lo = fmin(lo, x[i]);
            hi = fmax(hi, x[i]);
        }
        mean /= G;
        /* verl's convention for a group of one: mean 0, std 1 (the reward itself is the advantage). */
        double var = 0;
        for (int i = 0; i < G; i++) var += (x[i] - mean) * (x[i] - mean);
        double sd = G > 1 ? sqrt(var / (G - 1)) : 1; /* unbiased, as torch.std in verl and TRL */
        if (G == 1) mean = 0;
        int flat = G > 1 && hi - lo <= 1e-12;
        zero += flat;
        if (keep) keep[g] = !flat;
        for (int i = 0; i < G; i++) a[i] = flat ? 0 : std_norm ? (x[i] - mean) / (sd + K3C_RL_EPS_STD) : x[i] - mean;
    }
    return zero;
}

int k3c_rl_select_groups(const double *r, int n_groups, int G, int want, int *sel, int *n_sel) {
    int flat = 0;
    for (int g = 0; g < n_groups; g++) {
        const double *x = r + (size_t)g * G;
        double lo = x[0], hi = x[0];
        for (int i = 1; i < G; i++) lo = fmin(lo, x[i]), hi = fmax(hi, x[i]);
        if (hi - lo <= 1e-12) { /* the same test as k3c_rl_advantages' dropped groups */
            flat++;
        } else if (*n_sel < want) {
            sel[(*n_sel)++] = g;
        }
    }
    return flat;
}

double k3c_rl_pass_at_k(int n, int c, int k) {
    if (n - c < k) return 1.0;
    /* C(n−c, k) / C(n, k) = Π_{i=n−c+1}^{n} (1 − k / i): no large binomials (Chen et al. 2021) */
    double q = 1.0;
    for (int i = n - c + 1; i <= n; i++) q *= 1.0 - (double)k / i;
    return 1.0 - q;
}

double k3c_rl_overlong_penalty(int64_t len, int64_t max_len, int64_t buffer, double factor) {
    int64_t start = max_len - buffer;
    if (buffer <= 0 || len <= start) return 0;
    if (len >= max_len) return -factor;
    return -factor * (double)(len - start) / (double)buffer;
}

void k3c_logp_entropy(const float *z, int64_t V, int32_t y, double *logp, double *entropy) {
    double m = z[0];
    for (int64_t v = 1; v < V; v++) m = fmax(m, z[v]);
    double s = 0, sz = 0;
    for (int64_t v = 0; v < V; v++) {
        double e = exp(z[v] - m);
        s += e;
        sz += e * (z[v] - m);
    }
    double lse = log(s);
    if (logp) *logp = z[y] - m - lse;
    if (entropy) *entropy = lse - sz / s; /* −Σ p log p = lse − E[z − m] */
}

/* The weight of token t of sequence i in the aggregate (m_t times the variant's normaliser). */
static double agg_weight(const k3c_rl_tokens *t, const k3c_rl_loss_opts *o, int i, int64_t total) {
    int64_t n_i = 0;
    switch (o->agg) {
    case K3C_RL_SEQ_MEAN:
        for (int64_t k = t->off[i]; k < t->off[i + 1]; k++) n_i += t->mask[k] != 0;
        return n_i ? 1.0 / ((double)t->B * n_i) : 0;
    case K3C_RL_CONST_NORM: return 1.0 / ((double)t->B * (double)o->max_len);
    default: return total ? 1.0 / (double)total : 0;
    }
}

int k3c_rl_loss(const k3c_rl_tokens *t, const k3c_rl_loss_opts *o, double *dlogp, k3c_rl_loss_stats *s, k3c_err *err) {
    if (o->agg == K3C_RL_CONST_NORM && o->max_len <= 0)
        return k3c_errf(err, K3C_EINVAL, "rl loss: the Dr. GRPO normaliser needs max_len > 0");
    if (o->beta != 0 && !t->logp_ref) return k3c_errf(err, K3C_EINVAL, "rl loss: beta > 0 needs reference log-probs");
    if (o->tis_cap < 0 || (o->tis_cap > 0 && !t->logp_rollout))
        return k3c_errf(err, K3C_EINVAL, "rl loss: tis_cap must be >= 0, and > 0 needs the rollout's log-probs");
    *s = (k3c_rl_loss_stats){0};
    int64_t total = 0;
    for (int64_t k = 0; k < t->off[t->B]; k++) total += t->mask[k] != 0;
    s->n_tokens = total;
    for (int i = 0; i < t->B; i++) {
        double w = agg_weight(t, o, i, total), A = t->adv[i];
        for (int64_t k = t->off[i]; k < t->off[i + 1]; k++) {
            if (dlogp) dlogp[k] = 0;
            if (!t->mask[k]) continue;
            double rho = exp(t->logp[k] - t->logp_old[k]);
            double clipped = fmin(fmax(rho, 1 - o->eps_low), 1 + o->eps_high);
            /* TIS: the sampler's policy differs from π_old (engine numerics); the weight corrects the off-policy
             * gradient and is truncated so a rare token cannot dominate the batch. No gradient flows through it. */
            double tis = 1;
            if (o->tis_cap > 0) {
                tis = fmin(exp(t->logp_old[k] - t->logp_rollout[k]), o->tis_cap);
                s->tis_capped += tis >= o->tis_cap;
            }
            s->tis_mean += tis;
            double un = tis * rho * A, cl = tis * clipped * A;
            /* −min(ρA, clip(ρ)A): the clipped branch carries no gradient when it is the smaller one. */
            int clip_active = cl < un;
            double l = -(clip_active ? cl : un), g = clip_active ? 0 : -un;
            s->clip_low += clip_active && rho < 1 - o->eps_low;
            s->clip_high += clip_active && rho > 1 + o->eps_high;
            if (t->logp_ref) {
                double d = t->logp_ref[k] - t->logp[k], kl = exp(d) - d - 1;
                s->kl += kl;
                l += o->beta * kl;
                g += o->beta * (1 - exp(d));
            }
            s->loss += w * l;
            s->ratio_mean += rho;
            if (dlogp) dlogp[k] = w * g;
        }
    }
    if (total) {
        s->kl /= total;
        s->clip_low /= total;
        s->clip_high /= total;
        s->ratio_mean /= total;
        s->tis_mean /= total;
        s->tis_capped /= total;
    }
    return K3C_OK;
}
