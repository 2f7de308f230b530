/* test_ablate.c — the statistics of an ablation against hand-computed values (Student's t quantiles from the tables,
 * a paired t-interval worked by hand, the loss-spike counter, the summary of a metrics.jsonl) and a whole grid on a
 * tiny model: arms as merge patches, the same data order per seed in every arm, a report, a finished run read back
 * and an interrupted one resumed from its checkpoint. */
#include "test.h"

#include "k3c/exp.h"
#include "train/data.h"

#include <sys/stat.h>

static void test_t_quantile(void) {
    /* t_{0.975} for df 1, 2, 3, 4, 9, 30; t_{0.95, 5}; t_{0.995, 10} (printed tables) */
    static const double p[] = {0.975, 0.975, 0.975, 0.975, 0.975, 0.975, 0.95, 0.995};
    static const double df[] = {1, 2, 3, 4, 9, 30, 5, 10};
    static const double want[] = {12.706204736, 4.302652730, 3.182446305, 2.776445105,
                                  2.262157163,  2.042272456, 2.015048373, 3.169272673};
    double worst = 0;
    for (int i = 0; i < 8; i++) worst = fmax(worst, fabs(k3c_stat_t_quantile(p[i], df[i]) - want[i]) / want[i]);
    CHECK_LE(worst, 1e-8, "t quantile relative error");
    CHECK(fabs(k3c_stat_t_quantile(0.025, 3) + 3.182446305) < 1e-7, "lower tail by symmetry");
    CHECK(fabs(k3c_stat_t_quantile(0.5, 7)) < 1e-10, "median 0");
    CHECK(isnan(k3c_stat_t_quantile(1, 3)) && isnan(k3c_stat_t_quantile(0.9, 0.5)), "p = 1 and df < 1 are NAN");
}

static void test_paired(void) {
    /* d = a - b = {0.5, 0.3, 0.8, 0.1}: mean 0.425, sd 0.2986079, se 0.1493039, t_{0.975,3} 3.1824463 */
    const double a[] = {1, 2, 3, 4, 9}, b[] = {0.5, 1.7, 2.2, 3.9, NAN};
    double m, lo, hi;
    int n = k3c_stat_paired_t(a, b, 5, 0.95, &m, &lo, &hi);
    CHECK(n == 4, "the pair with a NAN left out (%d)", n);
    CHECK(fabs(m - 0.425) < 1e-12 && fabs(lo + 0.0501518) < 1e-6 && fabs(hi - 0.9001518) < 1e-6,
          "mean %.7f [%.7f, %.7f] vs 0.425 [-0.0501518, 0.9001518]", m, lo, hi);
    const double c[] = {2, 3, 4}, d[] = {1, 2, 3};
    n = k3c_stat_paired_t(c, d, 3, 0.95, &m, &lo, &hi);
    CHECK(n == 3 && m == 1 && lo == 1 && hi == 1, "a constant difference: [1, 1]");
    n = k3c_stat_paired_t(c, d, 1, 0.95, &m, &lo, &hi);
    CHECK(n == 1 && m == 1 && isnan(lo) && isnan(hi), "one pair: no interval");
    double sd;
    const double x[] = {2, 4, NAN, 4, 5, 5, 7, 9};
    /* {2, 4, 4, 5, 5, 7, 9}: mean 36/7, squared deviations sum 30.857143, sample sd sqrt(30.857143 / 6) */
    CHECK(k3c_stat_mean_sd(x, 8, &m, &sd) == 7 && fabs(m - 36.0 / 7) < 1e-12 && fabs(sd - 2.2677868) < 1e-6,
          "mean %.7f sd %.7f of the finite values", m, sd);
}

static void test_spikes(void) {
    /* window 4, factor 1.2: t = 4 (1.3 > 1.2 * median 1), t = 7 (5 > 1.2 * 1.05), t = 9 (NAN) */
    const double l[] = {1, 1, 1, 1, 1.3, 1, 1.1, 5, 1, NAN};
    CHECK(k3c_stat_spikes(l, 10, 4, 1.2) == 3, "3 spikes (%lld)", (long long)k3c_stat_spikes(l, 10, 4, 1.2));
    CHECK(k3c_stat_spikes(l, 10, 4, 5) == 1, "factor 5: the NAN only");
    CHECK(k3c_stat_spikes(l, 4, 4, 1.2) == 0, "no step with a full window");
    const double r[] = {3, 2, 1, 2.5}; /* median of {3, 2, 1} is 2: 2.5 > 2.4 */
    CHECK(k3c_stat_spikes(r, 4, 3, 1.2) == 1, "an odd window's median");
}

static void test_summarise(void) {
    const char *dir = test_tmpdir("ablate_sum");
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "%s", path);
    if (!f) return;
    fprintf(f, "{\"step\":1,\"loss\":5,\"grad_norm\":2.5,\"tokens_per_s\":100,\"max_load_ratio\":2,\"load_cv\":0.5,"
               "\"dead_experts\":1,\"load_entropy\":0.9}\n"
               "{\"step\":2,\"event\":\"skip\",\"reason\":\"spike\",\"loss\":\"nan\"}\n"
               "{\"step\":2,\"loss\":4,\"grad_norm\":0.5,\"tokens_per_s\":120,\"max_load_ratio\":1.5,\"load_cv\":0.3,"
               "\"dead_experts\":0,\"load_entropy\":0.95,\"val_loss\":4.2}\n"
               "{\"step\":3,\"loss\":3,\"grad_norm\":1.5,\"tokens_per_s\":130,\"max_load_ratio\":1,\"load_cv\":0.1,"
               "\"dead_experts\":2,\"load_entropy\":1}\n");
    fclose(f);
    k3c_metric_set m = {0};
    k3c_err err = {0};
    CHECK_OK(k3c_ablate_summarise(path, 2, 1.2, 1.0, &m, &err), &err);
    CHECK(k3c_metric_get(&m, "val_loss") == 4.2 && k3c_metric_get(&m, "final_loss") == 3 &&
              k3c_metric_get(&m, "steps") == 3 && k3c_metric_get(&m, "tokens_per_s") == 130,
          "validation loss of the last evaluation, final loss, steps, tokens/s");
    CHECK(k3c_metric_get(&m, "grad_norm_max") == 2.5 && fabs(k3c_metric_get(&m, "clip_fraction") - 2.0 / 3) < 1e-12 &&
              k3c_metric_get(&m, "skipped") == 1 && k3c_metric_get(&m, "spikes") == 0,
          "gradient norm max 2.5, 2 of 3 steps above the clip 1, one skip, no spike");
    CHECK(fabs(k3c_metric_get(&m, "load_max_mean") - 1.5) < 1e-12 &&
              fabs(k3c_metric_get(&m, "load_cv") - 0.3) < 1e-12 &&
              fabs(k3c_metric_get(&m, "dead_experts") - 1) < 1e-12 &&
              fabs(k3c_metric_get(&m, "load_entropy") - 0.95) < 1e-12,
          "load means over the steps");
    snprintf(path, sizeof path, "%s/none.jsonl", dir);
    CHECK(k3c_ablate_summarise(path, 2, 1.2, 1.0, &m, &err) == K3C_EIO || err.code != 0, "missing file: %s", err.msg);
}

/* ---------------------------------------------------------------- a whole grid */

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
}

static double first_loss(const char *run_dir) {
    char p[1300];
    snprintf(p, sizeof p, "%s/metrics.jsonl", run_dir);
    char *t;
    size_t n;
    if (k3c_read_file(p, &t, &n, NULL)) return NAN;
    const char *at = strstr(t, "\"loss\":");
    double v = at ? atof(at + 7) : NAN;
    free(t);
    return v;
}

static void test_grid(void) {
    k3c_err err = {0};
    const char *tmp = test_tmpdir("ablate_grid");
    char dir[4200], p[4400], grid[4400], cwd[2048];
    if (!getcwd(cwd, sizeof cwd)) return;
    snprintf(dir, sizeof dir, "%s/%s", cwd, tmp);
    k3c_task_data_opts o = {300, 1, 2, 6, 16, 40, 0.5, 0.05};
    snprintf(p, sizeof p, "%s/tasks", dir);
    CHECK_OK(k3c_task_write_data(p, &o, &err), &err);
    snprintf(p, sizeof p, "%s/base.json", dir);
    char text[8192];
    snprintf(text, sizeof text,
             "{\"model\": \"%s/configs/ablate/model.json\", \"tokenizer\": \"tasks/tok.tiktoken\",\n"
             " \"out_dir\": \"unused\", \"data\": {\"tasks\": \"tasks/data\"}, \"kda_chunk\": 16, \"threads\": 1,\n"
             " \"log_every\": 1, \"eval_every\": 2, \"eval_batches\": 1, \"checkpoint_every\": 2,\n"
             " \"stages\": [{\"seq_len\": 64, \"tokens_per_step\": 256, \"steps\": 4, \"lr\": 0.01}]}\n",
             cwd);
    write_file(p, text);
    snprintf(grid, sizeof grid, "%s/grid.json", dir);
    write_file(grid, "{\"base\": \"base.json\", \"out_dir\": \"out\", \"seeds\": [3, 4], \"spike_window\": 2,\n"
                     " \"evals\": {\"mqar\": {\"pairs\": [4], \"docs\": 4},\n"
                     "           \"needle\": {\"lengths\": [32], \"depths\": [0, 1], \"docs\": 2},\n"
                     "           \"position\": {\"train_len\": 16, \"factors\": [1, 2], \"docs\": 1}},\n"
                     " \"axes\": [{\"name\": \"balancing\", \"metric\": \"load_max_mean\",\n"
                     "            \"arms\": {\"none\": {\"run\": {\"balancing\": \"none\"}}}},\n"
                     "           {\"name\": \"layout\", \"metric\": \"mqar_recall\",\n"
                     "            \"arms\": {\"all_kda\": {\"model\": {\"linear_attn_config\":\n"
                     "                        {\"full_attn_layers\": [], \"kda_layers\": [1, 2, 3, 4]}}}}}]}\n");
    k3c_ablate_opts ao = {NULL, NULL};
    k3c_ablate_result r;
    CHECK_OK(k3c_ablate_run(grid, &ao, &r, &err), &err);
    if (err.code) return;
    CHECK(r.n_arms == 3 && r.n_seeds == 2 && !strcmp(r.arm[1].axis, "balancing") && !strcmp(r.arm[2].arm, "all_kda"),
          "base + 2 arms x 2 seeds");
    /* the same seed: the same initialisation and first batch in the base and the balancing arm (balancing acts after
       the first step), another seed another loss */
    CHECK(first_loss(r.arm[0].dir[0]) == first_loss(r.arm[1].dir[0]) &&
              first_loss(r.arm[0].dir[0]) != first_loss(r.arm[0].dir[1]),
          "first losses %.9g %.9g %.9g", first_loss(r.arm[0].dir[0]), first_loss(r.arm[1].dir[0]),
          first_loss(r.arm[0].dir[1]));
    snprintf(p, sizeof p, "%s/model.json", r.arm[2].dir[0]);
    char *t = NULL;
    size_t n;
    CHECK(k3c_read_file(p, &t, &n, NULL) == 0 && strstr(t, "\"full_attn_layers\": []") &&
              strstr(t, "\"gate_lower_bound\": -5.0"),
          "the arm's model config: the patched lists, the rest as in the base");
    free(t);
    const k3c_metric_set *m = &r.arm[0].run[0];
    const double ent = k3c_metric_get(m, "load_entropy"), dead = k3c_metric_get(m, "dead_experts");
    CHECK(ent > 0 && ent <= 1 && dead >= 0 && dead <= 3 * 8, "the trainer's load entropy %g in (0, 1], dead %g", ent,
          dead);
    CHECK(k3c_metric_get(m, "steps") == 4 && isfinite(k3c_metric_get(m, "val_loss")) &&
              isfinite(k3c_metric_get(m, "mqar_recall")) && isfinite(k3c_metric_get(m, "needle_acc_32")) &&
              isfinite(k3c_metric_get(m, "pos_loss_2L")) && k3c_metric_get(m, "diverged") == 0,
          "a run's measurements and evaluations");
    CHECK(k3c_read_file(r.report, &t, &n, NULL) == 0 && strstr(t, "### balancing = none vs base") &&
              strstr(t, "| **mqar_recall** |") && strstr(t, "plot_layout.png"),
          "report.md: the differences per arm, the headline metric, the plots");
    free(t);
    const double v0 = k3c_metric_get(&r.arm[1].run[1], "val_loss");
    /* interrupted: the result of one run gone, its checkpoint at step 4 kept; another run back at step 2 */
    snprintf(p, sizeof p, "%s/result.json", r.arm[1].dir[1]);
    unlink(p);
    char cmd[14000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/result.json' '%s/step_00000004' && echo step_00000002 > '%s/latest'",
             r.arm[2].dir[1], r.arm[2].dir[1], r.arm[2].dir[1]);
    CHECK(system(cmd) == 0, "%s", cmd);
    const double v2 = k3c_metric_get(&r.arm[2].run[1], "val_loss");
    k3c_ablate_result_free(&r);
    char logbuf[8192] = {0};
    FILE *log = fmemopen(logbuf, sizeof logbuf, "w");
    ao.log = log;
    CHECK_OK(k3c_ablate_run(grid, &ao, &r, &err), &err);
    fclose(log);
    if (err.code) return;
    CHECK(strstr(logbuf, "base base seed 3: finished before, skipped") && strstr(logbuf, "none seed 4: resuming") &&
              strstr(logbuf, "all_kda seed 4: resuming"),
          "finished runs skipped, the others resumed:\n%s", logbuf);
    CHECK(k3c_metric_get(&r.arm[1].run[1], "val_loss") == v0 && k3c_metric_get(&r.arm[2].run[1], "val_loss") == v2,
          "resumed runs end where they ended before (%.9g %.9g)", k3c_metric_get(&r.arm[2].run[1], "val_loss"), v2);
    k3c_ablate_result_free(&r);
    /* bad grids: an unknown key, an arm changing the tokens */
    write_file(grid, "{\"base\": \"base.json\", \"out_dir\": \"out2\", \"seeds\": [1], \"axis\": []}");
    CHECK(k3c_ablate_run(grid, &ao, &r, &err) == K3C_ECONFIG && strstr(err.msg, "axis: unknown key"), "%s", err.msg);
    k3c_ablate_result_free(&r);
    write_file(grid, "{\"base\": \"base.json\", \"out_dir\": \"out3\", \"seeds\": [1], \"axes\": [{\"name\": \"long\","
                     " \"arms\": {\"more\": {\"run\": {\"stages\": [{\"seq_len\": 64, \"tokens_per_step\": 256,"
                     " \"steps\": 5, \"lr\": 0.01}]}}}}]}");
    ao.log = NULL;
    CHECK(k3c_ablate_run(grid, &ao, &r, &err) == K3C_ECONFIG && strstr(err.msg, "equal tokens"), "%s", err.msg);
    k3c_ablate_result_free(&r);
    write_file(grid, "{\"base\": \"base.json\", \"out_dir\": \"out4\", \"seeds\": [1], \"axes\": [{\"name\": \"s\","
                     " \"arms\": {\"x\": {\"run\": {\"seed\": 5}}}}]}");
    CHECK(k3c_ablate_run(grid, &ao, &r, &err) == K3C_ECONFIG && strstr(err.msg, "run.seed: set by the runner"), "%s",
          err.msg);
    k3c_ablate_result_free(&r);
    /* every loss NaN (the trainer's test fault hook): the guard's skips end in K3C_ENUMERIC, recorded as diverged */
    write_file(grid, "{\"base\": \"base.json\", \"out_dir\": \"out5\", \"seeds\": [1, 2], \"axes\": [{\"name\": \"lr\","
                     " \"metric\": \"diverged\", \"arms\": {\"x2\": {\"lr_scale\": 2}}}]}");
    setenv("K3C_TEST_FAULT", "loss:1:100000", 1);
    CHECK_OK(k3c_ablate_run(grid, &ao, &r, &err), &err);
    unsetenv("K3C_TEST_FAULT");
    if (!err.code)
        CHECK(k3c_metric_get(&r.arm[0].run[0], "diverged") == 1 && k3c_metric_get(&r.arm[1].run[1], "diverged") == 1 &&
                  isnan(k3c_metric_get(&r.arm[1].run[1], "mqar_recall")),
              "diverged runs recorded, without evaluations");
    k3c_ablate_result_free(&r);
}

int main(void) {
    test_t_quantile();
    test_paired();
    test_spikes();
    test_summarise();
    test_grid();
    return test_summary();
}
