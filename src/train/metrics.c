/* metrics.c — metrics JSON Lines and their PNG plot (gnuplot reads a whitespace table extracted from the JSON lines). */
#include "base/json.h"
#include "train/metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void num(FILE *f, const char *key, double v) {
    if (isfinite(v)) fprintf(f, ",\"%s\":%.9g", key, v);
}

void k3c_metrics_write(FILE *f, const k3c_metrics_row *r) {
    fprintf(f, "{\"step\":%lld,\"stage\":%d,\"tokens\":%lld", (long long)r->step, r->stage, (long long)r->tokens);
    num(f, "loss", r->loss);
    num(f, "val_loss", r->val_loss);
    num(f, "lr", r->lr);
    num(f, "grad_norm", r->grad_norm);
    num(f, "tokens_per_s", r->tokens_per_s);
    num(f, "max_load_ratio", r->max_load_ratio);
    num(f, "load_cv", r->load_cv);
    fprintf(f, ",\"qk_clipped\":%d", r->qk_clipped);
    if (r->n_moe > 0) {
        static const char *key[3] = {"moe_layers", "layer_max_load_ratio", "layer_load_cv"};
        for (int k = 0; k < 3; k++) {
            fprintf(f, ",\"%s\":[", key[k]);
            for (int i = 0; i < r->n_moe; i++) {
                if (k == 0)
                    fprintf(f, "%s%d", i ? "," : "", r->moe_layer[i]);
                else
                    fprintf(f, "%s%.5g", i ? "," : "", k == 1 ? r->layer_max_ratio[i] : r->layer_cv[i]);
            }
            fprintf(f, "]");
        }
    }
    fprintf(f, "}\n");
    fflush(f);
}

static double field(const k3c_json *o, const char *k) {
    const k3c_json *v = k3c_json_get(o, k);
    return v && v->type == K3C_JSON_NUMBER ? v->number : NAN;
}

int k3c_metrics_plot(const char *jsonl, const char *png, k3c_err *err) {
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
