/* metrics.c — training metrics as JSON Lines, one flushed object per logged step; part of the trainer (the PNG plot of
 * these lines is drawn by the CLI, src/cli/plot.c: the library runs no programs). */
#include "train/metrics.h"
#include "base/json.h"

#include <math.h>
#include <string.h>

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
    if (r->n_moe > 0) fprintf(f, ",\"dead_experts\":%lld", (long long)r->dead_experts);
    num(f, "load_entropy", r->load_entropy);
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

void k3c_metrics_event(FILE *f, int64_t step, const char *event, const char *reason, const char *extra) {
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    k3c_sbuf_json_string(&s, reason, strlen(reason));
    fprintf(f, "{\"step\":%lld,\"event\":\"%s\",\"reason\":%s%s}\n", (long long)step, event, s.ok ? s.buf : "\"\"",
            extra ? extra : "");
    k3c_sbuf_free(&s);
    fflush(f);
}
