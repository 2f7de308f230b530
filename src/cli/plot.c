/* plot.c — the training curves of `k3c train` as a PNG: gnuplot draws loss / validation loss, learning rate and the worst
 * MoE layer's max/mean expert load against step from the metrics.jsonl the trainer writes (part of the CLI). */
#include "base/json.h"
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double field(const k3c_json *o, const char *k) {
    const k3c_json *v = k3c_json_get(o, k);
    return v && v->type == K3C_JSON_NUMBER ? v->number : NAN;
}

int cli_plot_metrics(const char *jsonl, const char *png, k3c_err *err) {
    /* the paths go into a shell command line inside single quotes: refuse what would break out of them */
    if (strpbrk(png, "'\"\\$`\n"))
        return k3c_errf(err, K3C_EINVAL, "%s: quotes, backslashes, $ or ` in the path: no plot written", png);
    if (system("command -v gnuplot >/dev/null 2>&1") != 0)
        return k3c_errf(err, K3C_ENOTFOUND, "gnuplot not installed (apt-get install gnuplot-nox): no plot written");
    char *text;
    size_t n;
    int rc = k3c_read_file(jsonl, &text, &n, err);
    if (rc) return rc;
    char dat[4200], tmp_png[4200];
    snprintf(dat, sizeof dat, "%s.dat", png);
    snprintf(tmp_png, sizeof tmp_png, "%s.tmp.png", png);
    FILE *f = fopen(dat, "w");
    if (!f) {
        free(text);
        return k3c_errf(err, K3C_EIO, "%s: cannot write", dat);
    }
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        k3c_json *o;
        if (k3c_json_parse(line, strlen(line), jsonl, &o, NULL)) continue;
        if (k3c_json_get(o, "event")) { /* a trainer event, not a step's row */
            k3c_json_free(o);
            continue;
        }
        fprintf(f, "%g %g %g %g %g\n", field(o, "step"), field(o, "loss"), field(o, "val_loss"), field(o, "lr"),
                field(o, "max_load_ratio"));
        k3c_json_free(o);
    }
    fclose(f);
    free(text);
    char cmd[20000];
    snprintf(cmd, sizeof cmd,
             "gnuplot -e \"set terminal png size 1200,400 noenhanced; "
             "set output '%s'; set datafile missing 'nan'; set multiplot layout 1,3; set xlabel 'step'; set grid; "
             "set title 'loss'; plot '%s' u 1:2 w l t 'train', '' u 1:3 w lp pt 7 t 'validation'; "
             "set title 'learning rate'; set yrange [0:*]; set offsets 0,0,graph 0.1,0; plot '%s' u 1:4 w l notitle; "
             "set title 'max/mean expert load (worst layer)'; set offsets 0,0,0,0; set yrange [1:*]; plot '%s' u 1:5 w "
             "l notitle; unset multiplot\" "
             ">/dev/null 2>&1",
             tmp_png, dat, dat, dat);
    int sys = system(cmd);
    unlink(dat);
    if (sys != 0 || access(tmp_png, R_OK) != 0) {
        unlink(tmp_png);
        return k3c_errf(err, K3C_EIO, "%s: gnuplot failed", png);
    }
    if (rename(tmp_png, png) != 0) return k3c_errf(err, K3C_EIO, "%s: rename failed", png);
    return K3C_OK;
}

/* One panel per metric key (points where a line has it), for the post-training runs whose metrics differ from the
 * pre-training trainer's. */
int cli_plot_panels(const char *jsonl, const char *png, const char *const *keys, int n, k3c_err *err) {
    if (strpbrk(png, "'\"\\$`\n"))
        return k3c_errf(err, K3C_EINVAL, "%s: quotes, backslashes, $ or ` in the path: no plot written", png);
    if (n < 1 || n > 8) return k3c_errf(err, K3C_EINVAL, "plot: 1 to 8 panels");
    if (system("command -v gnuplot >/dev/null 2>&1") != 0)
        return k3c_errf(err, K3C_ENOTFOUND, "gnuplot not installed (apt-get install gnuplot-nox): no plot written");
    char *text;
    size_t len;
    int rc = k3c_read_file(jsonl, &text, &len, err);
    if (rc) return rc;
    char dat[4200], tmp_png[4200], cmd[8192];
    snprintf(dat, sizeof dat, "%s.dat", png);
    snprintf(tmp_png, sizeof tmp_png, "%s.tmp.png", png);
    FILE *f = fopen(dat, "w");
    if (!f) {
        free(text);
        return k3c_errf(err, K3C_EIO, "%s: cannot write", dat);
    }
    int rows = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        k3c_json *o;
        if (k3c_json_parse(line, strlen(line), jsonl, &o, NULL)) continue;
        fprintf(f, "%g", field(o, "step"));
        for (int k = 0; k < n; k++) fprintf(f, " %g", field(o, keys[k]));
        fprintf(f, "\n");
        rows++;
        k3c_json_free(o);
    }
    fclose(f);
    free(text);
    int at = snprintf(cmd, sizeof cmd,
                      "gnuplot -e \"set terminal png size %d,400 noenhanced; set output '%s'; set datafile missing "
                      "'nan'; set multiplot layout 1,%d; set xlabel 'step'; set grid; ",
                      300 * n + 200, tmp_png, n);
    for (int k = 0; k < n && at < (int)sizeof cmd; k++)
        at += snprintf(cmd + at, sizeof cmd - at, "set title '%s'; plot '%s' u 1:%d w lp pt 7 ps 0.5 notitle; ",
                       keys[k], dat, k + 2);
    if (at < (int)sizeof cmd) snprintf(cmd + at, sizeof cmd - at, "unset multiplot\" >/dev/null 2>&1");
    int sys = rows ? system(cmd) : 1;
    unlink(dat);
    if (sys != 0 || access(tmp_png, R_OK) != 0) {
        unlink(tmp_png);
        return k3c_errf(err, K3C_EIO, "%s: gnuplot failed (a metric without any value?)", png);
    }
    return rename(tmp_png, png) == 0 ? K3C_OK : k3c_errf(err, K3C_EIO, "%s: rename failed", png);
}

/* Runs overlaid: one panel per key (1 to 4), one line per metrics file, coloured by group[i] (an arm), titled by
 * label[i] (the ablation's plot per axis). */
int cli_plot_overlay(const char *png, const char *const *jsonl, const char *const *label, const int *group, int n,
                     const char *const *keys, int n_keys, k3c_err *err) {
    if (strpbrk(png, "'\"\\$`\n"))
        return k3c_errf(err, K3C_EINVAL, "%s: quotes, backslashes, $ or ` in the path: no plot written", png);
    if (n < 1 || n_keys < 1 || n_keys > 4) return k3c_errf(err, K3C_EINVAL, "plot: 1 or more runs, 1 to 4 panels");
    if (system("command -v gnuplot >/dev/null 2>&1") != 0)
        return k3c_errf(err, K3C_ENOTFOUND, "gnuplot not installed (apt-get install gnuplot-nox): no plot written");
    char tmp_png[4200];
    snprintf(tmp_png, sizeof tmp_png, "%s.tmp.png", png);
    k3c_sbuf cmd;
    k3c_sbuf_init(&cmd);
    k3c_sbuf_printf(&cmd,
                    "gnuplot -e \"set terminal png size %d,450 noenhanced; set output '%s'; set datafile missing "
                    "'nan'; set multiplot layout 1,%d; set xlabel 'step'; set grid; set key font ',8'; ",
                    420 * n_keys + 100, tmp_png, n_keys);
    int e = K3C_OK;
    for (int i = 0; i < n && !e; i++) { /* one data file per run: step and the keys */
        char dat[4300];
        snprintf(dat, sizeof dat, "%s.%d.dat", png, i);
        char *text;
        size_t len;
        if ((e = k3c_read_file(jsonl[i], &text, &len, err))) break;
        FILE *f = fopen(dat, "w");
        if (!f) {
            free(text);
            e = k3c_errf(err, K3C_EIO, "%s: cannot write", dat);
            break;
        }
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            k3c_json *o;
            if (k3c_json_parse(line, strlen(line), jsonl[i], &o, NULL)) continue;
            if (!k3c_json_get(o, "event")) {
                fprintf(f, "%g", field(o, "step"));
                for (int k = 0; k < n_keys; k++) fprintf(f, " %g", field(o, keys[k]));
                fprintf(f, "\n");
            }
            k3c_json_free(o);
        }
        fclose(f);
        free(text);
    }
    for (int k = 0; k < n_keys && !e; k++) {
        k3c_sbuf_printf(&cmd, "set title '%s'; plot ", keys[k]);
        for (int i = 0; i < n; i++)
            k3c_sbuf_printf(&cmd, "%s'%s.%d.dat' u 1:%d w l lc %d t '%s'", i ? ", " : "", png, i, k + 2, group[i] + 1,
                            strpbrk(label[i], "'\"\\$`") ? "run" : label[i]);
        k3c_sbuf_printf(&cmd, "; ");
    }
    k3c_sbuf_printf(&cmd, "unset multiplot\" >/dev/null 2>&1");
    int sys = !e && cmd.ok ? system(cmd.buf) : 1;
    k3c_sbuf_free(&cmd);
    for (int i = 0; i < n; i++) {
        char dat[4300];
        snprintf(dat, sizeof dat, "%s.%d.dat", png, i);
        unlink(dat);
    }
    if (e) return e;
    if (sys != 0 || access(tmp_png, R_OK) != 0) {
        unlink(tmp_png);
        return k3c_errf(err, K3C_EIO, "%s: gnuplot failed", png);
    }
    return rename(tmp_png, png) == 0 ? K3C_OK : k3c_errf(err, K3C_EIO, "%s: rename failed", png);
}
