/* stats.c — the statistics of an ablation: mean and standard deviation over seeds, Student's t quantile, the paired
 * t-interval against the base arm, the loss-spike counter, and the per-run summary of a trainer's metrics.jsonl.
 * Spec: docs/EXPERIMENTS.md "Statistics". */
#include "k3c/exp.h"

#include "base/json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int k3c_stat_mean_sd(const double *x, int n, double *mean, double *sd) {
    int k = 0;
    double s = 0, ss = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i])) s += x[i], k++;
    *mean = k ? s / k : NAN;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i])) ss += (x[i] - *mean) * (x[i] - *mean);
    *sd = k > 1 ? sqrt(ss / (k - 1)) : NAN;
    return k;
}

/* The continued fraction of the regularised incomplete beta function (modified Lentz), valid for x < (a+1)/(a+b+2). */
static double beta_cf(double a, double b, double x) {
    const double tiny = 1e-300;
    double c = 1, d = 1 - (a + b) * x / (a + 1);
    d = fabs(d) < tiny ? tiny : d;
    d = 1 / d;
    double h = d;
    for (int m = 1; m <= 500; m++) {
        for (int odd = 0; odd < 2; odd++) {
            double num = odd ? -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
                             : m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m));
            d = 1 + num * d;
            d = fabs(d) < tiny ? tiny : d;
            c = 1 + num / c;
            c = fabs(c) < tiny ? tiny : c;
            d = 1 / d;
            h *= d * c;
            if (odd && fabs(d * c - 1) < 1e-15) return h;
        }
    }
    return h;
}

static double beta_inc(double a, double b, double x) {
    if (x <= 0) return 0;
    if (x >= 1) return 1;
    double front = exp(lgamma(a + b) - lgamma(a) - lgamma(b) + a * log(x) + b * log1p(-x));
    return x < (a + 1) / (a + b + 2) ? front * beta_cf(a, b, x) / a : 1 - front * beta_cf(b, a, 1 - x) / b;
}

static double t_cdf(double t, double df) {
    double tail = 0.5 * beta_inc(df / 2, 0.5, df / (df + t * t));
    return t >= 0 ? 1 - tail : tail;
}

double k3c_stat_t_quantile(double p, double df) {
    if (!(p > 0 && p < 1) || !(df >= 1)) return NAN;
    if (p < 0.5) return -k3c_stat_t_quantile(1 - p, df);
    double lo = 0, hi = 1;
    while (t_cdf(hi, df) < p && hi < 1e12) lo = hi, hi *= 2;
    for (int i = 0; i < 200 && hi - lo > 1e-12 * (1 + hi); i++) {
        double mid = 0.5 * (lo + hi);
        if (t_cdf(mid, df) < p)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

int k3c_stat_paired_t(const double *a, const double *b, int n, double level, double *mean, double *lo, double *hi) {
    double *d = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    int k = 0;
    for (int i = 0; d && i < n; i++)
        if (isfinite(a[i]) && isfinite(b[i])) d[k++] = a[i] - b[i];
    double sd;
    k3c_stat_mean_sd(d, k, mean, &sd);
    free(d);
    *lo = *hi = NAN;
    if (k < 2) return k;
    double half = k3c_stat_t_quantile(0.5 + level / 2, k - 1) * sd / sqrt((double)k);
    *lo = *mean - half;
    *hi = *mean + half;
    return k;
}

static double median(double *w, int64_t n) {
    for (int64_t i = 1; i < n; i++) /* insertion sort: windows are short */
        for (int64_t j = i; j > 0 && w[j - 1] > w[j]; j--) {
            double t = w[j];
            w[j] = w[j - 1], w[j - 1] = t;
        }
    return n % 2 ? w[n / 2] : 0.5 * (w[n / 2 - 1] + w[n / 2]);
}

int64_t k3c_stat_spikes(const double *loss, int64_t n, int64_t window, double factor) {
    if (window < 1) return 0;
    double *w = malloc(sizeof(double) * (size_t)window);
    int64_t spikes = 0;
    for (int64_t t = window; w && t < n; t++) {
        memcpy(w, loss + t - window, sizeof(double) * (size_t)window);
        spikes += !isfinite(loss[t]) || loss[t] > factor * median(w, window);
    }
    free(w);
    return spikes;
}

double k3c_metric_get(const k3c_metric_set *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->name[i], name) == 0) return s->v[i];
    return NAN;
}

void k3c_metric_set_value(k3c_metric_set *s, const char *name, double v) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->name[i], name) == 0) {
            s->v[i] = v;
            return;
        }
    if (s->n == K3C_ABLATE_MAX_METRICS) return;
    snprintf(s->name[s->n], sizeof s->name[0], "%s", name);
    s->v[s->n++] = v;
}

/* ---------------------------------------------------------------- a run's metrics.jsonl */

typedef struct {
    double *v;
    int64_t n, cap;
} series;

static int push(series *s, double v) {
    if (s->n == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 256;
        double *p = realloc(s->v, sizeof(double) * (size_t)cap);
        if (!p) return 0;
        s->v = p, s->cap = cap;
    }
    s->v[s->n++] = v;
    return 1;
}

static double num(const k3c_json *o, const char *k) {
    const k3c_json *v = k3c_json_get(o, k);
    return v && v->type == K3C_JSON_NUMBER ? v->number : NAN;
}

static double mean_of(const series *s) {
    double m, sd;
    return k3c_stat_mean_sd(s->v, (int)s->n, &m, &sd) ? m : NAN;
}

enum { S_LOSS, S_GNORM, S_LOAD, S_CV, S_DEAD, S_ENT, N_SERIES };

int k3c_ablate_summarise(const char *metrics_jsonl, int64_t spike_window, double spike_factor, double grad_clip,
                         k3c_metric_set *out, k3c_err *err) {
    static const char *const key[N_SERIES] = {"loss",    "grad_norm",    "max_load_ratio",
                                              "load_cv", "dead_experts", "load_entropy"};
    char *text;
    size_t len;
    int e = k3c_read_file(metrics_jsonl, &text, &len, err);
    if (e) return e;
    series s[N_SERIES] = {{0}};
    double val = NAN, tps = NAN, last_step = 0, skips = 0;
    int ok = 1;
    for (char *line = strtok(text, "\n"); line && ok; line = strtok(NULL, "\n")) {
        k3c_json *o;
        if ((e = k3c_json_parse(line, strlen(line), metrics_jsonl, &o, err))) break;
        const k3c_json *ev = k3c_json_get(o, "event");
        if (ev) {
            skips += ev->type == K3C_JSON_STRING && strcmp(ev->string, "skip") == 0;
        } else {
            for (int k = 0; k < N_SERIES; k++) ok = ok && push(&s[k], num(o, key[k]));
            if (isfinite(num(o, "val_loss"))) val = num(o, "val_loss");
            tps = num(o, "tokens_per_s");
            last_step = num(o, "step");
        }
        k3c_json_free(o);
    }
    free(text);
    if (!e && !ok) e = k3c_errf(err, K3C_ENOMEM, "%s: out of memory", metrics_jsonl);
    if (!e) {
        double gmax = NAN, clipped = 0;
        for (int64_t i = 0; i < s[S_GNORM].n; i++) {
            double g = s[S_GNORM].v[i];
            if (isfinite(g) && !(g <= gmax)) gmax = g;
            clipped += grad_clip > 0 && g > grad_clip;
        }
        k3c_metric_set_value(out, "val_loss", val);
        k3c_metric_set_value(out, "final_loss", s[S_LOSS].n ? s[S_LOSS].v[s[S_LOSS].n - 1] : NAN);
        k3c_metric_set_value(out, "steps", last_step);
        k3c_metric_set_value(out, "spikes",
                             (double)k3c_stat_spikes(s[S_LOSS].v, s[S_LOSS].n, spike_window, spike_factor));
        k3c_metric_set_value(out, "grad_norm_max", gmax);
        k3c_metric_set_value(out, "clip_fraction",
                             grad_clip > 0 && s[S_GNORM].n ? clipped / (double)s[S_GNORM].n : NAN);
        k3c_metric_set_value(out, "skipped", skips);
        k3c_metric_set_value(out, "load_max_mean", mean_of(&s[S_LOAD]));
        k3c_metric_set_value(out, "load_cv", mean_of(&s[S_CV]));
        k3c_metric_set_value(out, "dead_experts", mean_of(&s[S_DEAD]));
        k3c_metric_set_value(out, "load_entropy", mean_of(&s[S_ENT]));
        k3c_metric_set_value(out, "tokens_per_s", tps);
    }
    for (int k = 0; k < N_SERIES; k++) free(s[k].v);
    return e;
}
