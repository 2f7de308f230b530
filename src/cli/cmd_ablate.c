/* cmd_ablate.c — `k3c ablate --config GRID.json`: runs (or resumes) an ablation grid (k3c/exp.h), draws a plot per
 * axis (plot.c) and prints one line per compared arm with its headline metric's paired difference and 95% interval.
 * docs/EXPERIMENTS.md. */
#include "cli.h"

#include "k3c/exp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* OUT/plot_<axis>.png: the base's runs and the axis's arms' runs overlaid. */
static void plot_axis(const k3c_ablate_result *r, int first, FILE *log) {
    const char *axis = r->arm[first].axis;
    enum { CAP = 256 };
    char(*paths)[1200] = malloc(CAP * sizeof *paths), (*labels)[160] = malloc(CAP * sizeof *labels);
    const char *jsonl[CAP], *label[CAP];
    int group[CAP], n = 0;
    if (!paths || !labels) {
        free(paths);
        free(labels);
        return;
    }
    for (int a = 0; a < r->n_arms; a++) {
        if (a && strcmp(r->arm[a].axis, axis)) continue;
        for (int s = 0; s < r->n_seeds && n < CAP; s++, n++) {
            snprintf(paths[n], sizeof paths[n], "%s/metrics.jsonl", r->arm[a].dir[s]);
            snprintf(labels[n], sizeof labels[n], "%s seed %llu", r->arm[a].arm, (unsigned long long)r->seed[s]);
            jsonl[n] = paths[n], label[n] = labels[n], group[n] = a ? a - first + 1 : 0;
        }
    }
    static const char *const keys[] = {"loss", "grad_norm", "max_load_ratio"};
    char png[1300];
    snprintf(png, sizeof png, "%s/plot_%s.png", r->out_dir, axis);
    k3c_err err = {0};
    if (cli_plot_overlay(png, jsonl, label, group, n, keys, 3, &err) && log) fprintf(log, "note: %s\n", err.msg);
    free(paths);
    free(labels);
}

int cmd_ablate(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        printf("usage: k3c ablate --config GRID.json [--quiet] [--device cpu|cuda] [--gemm MODE] [--kernels MODE]\n\n"
               "Runs an ablation grid (see configs/ablate/ and docs/EXPERIMENTS.md): a base run config, axes whose\n"
               "arms are JSON merge patches of the run config (\"run\") and of the model config (\"model\") or a\n"
               "learning-rate multiplier (\"lr_scale\"), seeds (one run per arm and seed, the same initialisation\n"
               "and data order in every arm, equal tokens) and evaluations (MQAR, needle, loss by position).\n"
               "Runs go one after another into OUT/<axis>-<arm>/seed<N> (the base in OUT/base/seed<N>): a finished\n"
               "run is read back, an interrupted one resumes from its checkpoint. Writes each run's metrics.jsonl,\n"
               "OUT/report.md (every metric's mean ± sd per arm, paired differences against the base with 95%%\n"
               "t-intervals) and OUT/plot_<axis>.png, then prints one line per compared arm:\n"
               "  ablate: AXIS ARM vs base: METRIC DIFF [LO, HI] (95%%)\n");
        return 0;
    }
    const char *path = cli_opt(argc, argv, "--config");
    if (!path) return cli_usage_error("ablate", "--config is required");
    const cli_device_opts dopt = cli_device_opts_get(argc, argv);
    if (cli_device_check("ablate", &dopt)) return 2;
    k3c_err err = {0};
    cli_device dev;
    if (cli_device_open(&dopt, &dev, &err)) return cli_fail("ablate", &err);
    FILE *log = cli_flag(argc, argv, "--quiet") ? NULL : stderr;
    k3c_ablate_opts o = {log, dev.backend};
    k3c_ablate_result r;
    int failed = k3c_ablate_run(path, &o, &r, &err);
    cli_device_release(&dev);
    if (failed) {
        k3c_ablate_result_free(&r);
        return cli_fail("ablate", &err);
    }
    for (int a = 1; a < r.n_arms; a++)
        if (a == 1 || strcmp(r.arm[a].axis, r.arm[a - 1].axis)) plot_axis(&r, a, log);
    printf("report: %s (%d arms x %d seeds, %.1f s)\n", r.report, r.n_arms, r.n_seeds, r.wall_s);
    for (int a = 1; a < r.n_arms; a++) {
        double x[K3C_ABLATE_MAX_SEEDS], b[K3C_ABLATE_MAX_SEEDS], mean, lo, hi;
        for (int s = 0; s < r.n_seeds; s++) {
            x[s] = k3c_metric_get(&r.arm[a].run[s], r.arm[a].metric);
            b[s] = k3c_metric_get(&r.arm[0].run[s], r.arm[a].metric);
        }
        k3c_stat_paired_t(x, b, r.n_seeds, 0.95, &mean, &lo, &hi);
        printf("ablate: %s %s vs base: %s %+.4g [%+.4g, %+.4g] (95%%)\n", r.arm[a].axis, r.arm[a].arm, r.arm[a].metric,
               mean, lo, hi);
    }
    k3c_ablate_result_free(&r);
    return 0;
}
