/* report.c — OUT/report.md of an ablation: every arm's metrics (mean ± sd over seeds), the paired differences of each
 * arm against the base with their 95% t-intervals, the plots per axis and the runs. Spec: docs/EXPERIMENTS.md
 * "Report". */
#include "exp/exp.h"

#include "base/json.h"

#include <math.h>
#include <string.h>

/* Every metric name any run has, in the order first seen. */
static void metric_names(const k3c_ablate_result *r, k3c_metric_set *names) {
    names->n = 0;
    for (int a = 0; a < r->n_arms; a++)
        for (int s = 0; s < r->n_seeds; s++)
            for (int i = 0; i < r->arm[a].run[s].n; i++)
                if (isnan(k3c_metric_get(names, r->arm[a].run[s].name[i])))
                    k3c_metric_set_value(names, r->arm[a].run[s].name[i], 0);
}

/* The metric across the seeds of arm a. */
static void values(const k3c_ablate_result *r, int a, const char *name, double *v) {
    for (int s = 0; s < r->n_seeds; s++) v[s] = k3c_metric_get(&r->arm[a].run[s], name);
}

static void number(k3c_sbuf *s, double v) {
    if (isfinite(v))
        k3c_sbuf_printf(s, fabs(v) >= 1e5 || (v != 0 && fabs(v) < 1e-3) ? "%.3e" : "%.4f", v);
    else
        k3c_sbuf_printf(s, "—");
}

static void arms_table(k3c_sbuf *s, const k3c_ablate_result *r, const k3c_metric_set *names) {
    k3c_sbuf_printf(s, "| metric |");
    for (int a = 0; a < r->n_arms; a++)
        k3c_sbuf_printf(s, " %s%s%s |", a ? r->arm[a].axis : "", a ? " = " : "", r->arm[a].arm);
    k3c_sbuf_printf(s, "\n|---|");
    for (int a = 0; a < r->n_arms; a++) k3c_sbuf_printf(s, "---|");
    k3c_sbuf_printf(s, "\n");
    for (int i = 0; i < names->n; i++) {
        k3c_sbuf_printf(s, "| %s |", names->name[i]);
        for (int a = 0; a < r->n_arms; a++) {
            double v[K3C_ABLATE_MAX_SEEDS], mean, sd;
            values(r, a, names->name[i], v);
            int n = k3c_stat_mean_sd(v, r->n_seeds, &mean, &sd);
            k3c_sbuf_printf(s, " ");
            number(s, mean);
            if (n > 1) {
                k3c_sbuf_printf(s, " ± ");
                number(s, sd);
            }
            if (n < r->n_seeds) k3c_sbuf_printf(s, " (%d of %d)", n, r->n_seeds);
            k3c_sbuf_printf(s, " |");
        }
        k3c_sbuf_printf(s, "\n");
    }
}

static void differences(k3c_sbuf *s, const k3c_ablate_result *r, int a, const k3c_metric_set *names) {
    const k3c_ablate_arm *arm = &r->arm[a];
    k3c_sbuf_printf(s, "\n### %s = %s vs base (headline: %s)\n\n", arm->axis, arm->arm, arm->metric);
    k3c_sbuf_printf(s, "| metric | arm − base | 95%% interval | pairs | outside 0 |\n|---|---|---|---|---|\n");
    for (int i = 0; i < names->n; i++) {
        double x[K3C_ABLATE_MAX_SEEDS], b[K3C_ABLATE_MAX_SEEDS], mean, lo, hi;
        values(r, a, names->name[i], x);
        values(r, 0, names->name[i], b);
        int n = k3c_stat_paired_t(x, b, r->n_seeds, 0.95, &mean, &lo, &hi);
        const int bold = !strcmp(names->name[i], arm->metric);
        k3c_sbuf_printf(s, "| %s%s%s | ", bold ? "**" : "", names->name[i], bold ? "**" : "");
        number(s, mean);
        k3c_sbuf_printf(s, " | [");
        number(s, lo);
        k3c_sbuf_printf(s, ", ");
        number(s, hi);
        k3c_sbuf_printf(s, "] | %d | %s |\n", n, isfinite(lo) && (lo > 0 || hi < 0) ? "yes" : "no");
    }
}

int k3c_ablate_report(const k3c_ablate_result *r, const char *grid_path, const k3c_ablate_eval_spec *ev, k3c_err *err) {
    k3c_metric_set names;
    metric_names(r, &names);
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    k3c_sbuf_printf(&s, "# Ablation report\n\nGrid: `%s`. Seeds:", grid_path);
    for (int i = 0; i < r->n_seeds; i++) k3c_sbuf_printf(&s, " %llu", (unsigned long long)r->seed[i]);
    k3c_sbuf_printf(&s,
                    ". %d arms × %d seeds; every run of a seed has the same initialisation seed and data order and "
                    "trains the same tokens. Wall time of this invocation: %.1f s (runs finished before are read "
                    "back, not retrained).\n\n",
                    r->n_arms, r->n_seeds, r->wall_s);
    k3c_sbuf_printf(&s, "Evaluations on each run's last checkpoint, test split of seed %llu: MQAR pairs",
                    (unsigned long long)ev->seed);
    for (int i = 0; i < ev->n_pairs; i++) k3c_sbuf_printf(&s, " %d", ev->pairs[i]);
    k3c_sbuf_printf(&s, " (%lld documents each); needle lengths", (long long)ev->mqar_docs);
    for (int i = 0; i < ev->n_lengths; i++) k3c_sbuf_printf(&s, " %lld", (long long)ev->lengths[i]);
    k3c_sbuf_printf(&s, " × depths");
    for (int i = 0; i < ev->n_depths; i++) k3c_sbuf_printf(&s, " %g", ev->depths[i]);
    k3c_sbuf_printf(&s, " (%lld documents each); loss by position at L = %lld, buckets up to",
                    (long long)ev->needle_docs, (long long)ev->train_len);
    for (int i = 0; i < ev->n_factors; i++) k3c_sbuf_printf(&s, " %lldL", (long long)ev->factors[i]);
    k3c_sbuf_printf(&s, " (%lld documents).\n\n", (long long)ev->position_docs);
    k3c_sbuf_printf(&s, "## Arms (mean ± sd over seeds)\n\n");
    arms_table(&s, r, &names);
    k3c_sbuf_printf(&s, "\n## Paired differences against the base (95%% t-intervals over seeds)\n");
    for (int a = 1; a < r->n_arms; a++) differences(&s, r, a, &names);
    k3c_sbuf_printf(&s, "\n## Plots\n\nTraining loss, gradient norm and worst-layer max/mean expert load per step, "
                        "every seed of the base and of the axis's arms.\n\n");
    for (int a = 1; a < r->n_arms; a++)
        if (a == 1 || strcmp(r->arm[a].axis, r->arm[a - 1].axis))
            k3c_sbuf_printf(&s, "![%s](plot_%s.png)\n\n", r->arm[a].axis, r->arm[a].axis);
    k3c_sbuf_printf(&s, "## Runs\n\n| run | diverged | validation loss | steps |\n|---|---|---|---|\n");
    for (int a = 0; a < r->n_arms; a++)
        for (int i = 0; i < r->n_seeds; i++) {
            const k3c_metric_set *m = &r->arm[a].run[i];
            k3c_sbuf_printf(&s, "| `%s` | %s | ", r->arm[a].dir[i] + strlen(r->out_dir) + 1,
                            k3c_metric_get(m, "diverged") > 0 ? "yes" : "no");
            number(&s, k3c_metric_get(m, "val_loss"));
            k3c_sbuf_printf(&s, " | %.0f |\n", k3c_metric_get(m, "steps"));
        }
    int e = s.ok ? k3c_write_file_atomic(r->report, s.buf, s.len, err)
                 : k3c_errf(err, K3C_ENOMEM, "%s: out of memory", r->report);
    k3c_sbuf_free(&s);
    return e;
}
