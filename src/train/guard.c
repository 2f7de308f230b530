/* guard.c — the step guard of the trainer: non-finite loss or gradient norm and loss spikes against the running median
 * skip a step; repeated failures ask for a rollback. Host arithmetic on the two numbers every step already downloads,
 * so it is the same on every backend. Spec: docs/TRAINING.md §8.1. */
#include "train/guard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void k3c_guard_init(k3c_guard *g) {
    memset(g, 0, sizeof *g);
    g->lr_scale = 1.0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const k3c_guard *g) {
    double v[K3C_GUARD_MAX_WINDOW];
    memcpy(v, g->loss, sizeof(double) * (size_t)g->n);
    qsort(v, (size_t)g->n, sizeof *v, cmp_double);
    return g->n % 2 ? v[g->n / 2] : 0.5 * (v[g->n / 2 - 1] + v[g->n / 2]);
}

int k3c_guard_judge(const k3c_guard *g, const k3c_run_config *rc, double loss, double grad_norm, char *why, size_t n) {
    if (!isfinite(loss)) return snprintf(why, n, "loss is %g", loss), 1;
    if (!isfinite(grad_norm)) return snprintf(why, n, "gradient norm is %g", grad_norm), 1;
    int64_t need = rc->guard_window < K3C_GUARD_MIN_HISTORY ? rc->guard_window : K3C_GUARD_MIN_HISTORY;
    if (rc->guard_spike_factor > 0 && g->n > 0 && g->n >= need) {
        double med = median(g);
        if (loss > rc->guard_spike_factor * med)
            return snprintf(why, n, "loss %.6g is above %g x the running median %.6g", loss, rc->guard_spike_factor,
                            med),
                   1;
    }
    return 0;
}

void k3c_guard_accept(k3c_guard *g, const k3c_run_config *rc, double loss) {
    int w = (int)rc->guard_window;
    g->fails = 0;
    if (w <= 0) return;
    g->loss[g->next] = loss;
    g->next = (g->next + 1) % w;
    if (g->n < w) g->n++;
}

int k3c_guard_reject(k3c_guard *g, const k3c_run_config *rc) {
    g->skipped++;
    g->fails++;
    return rc->guard_max_skips > 0 && g->fails >= rc->guard_max_skips;
}

void k3c_guard_to_json(const k3c_guard *g, k3c_sbuf *s) {
    k3c_sbuf_printf(s, ", \"guard\": {\"lr_scale\": %.17g, \"next\": %d, \"losses\": [", g->lr_scale, g->next);
    for (int i = 0; i < g->n; i++) k3c_sbuf_printf(s, "%s%.17g", i ? ", " : "", g->loss[i]);
    k3c_sbuf_printf(s, "]}");
}

int k3c_guard_from_json(k3c_guard *g, const k3c_json *state, const char *file, k3c_err *err) {
    const k3c_json *j = k3c_json_get(state, "guard");
    if (!j) return K3C_OK; /* a checkpoint from before the guard: a fresh one */
    const k3c_json *s = k3c_json_get(j, "lr_scale"), *nx = k3c_json_get(j, "next"), *l = k3c_json_get(j, "losses");
    if (!s || s->type != K3C_JSON_NUMBER || !(s->number > 0) || !nx || !nx->is_integer || !l ||
        l->type != K3C_JSON_ARRAY || l->n > K3C_GUARD_MAX_WINDOW || nx->integer < 0 ||
        nx->integer >= K3C_GUARD_MAX_WINDOW)
        return k3c_errf(err, K3C_EFORMAT, "%s: guard: needs lr_scale > 0, next and at most %d losses", file,
                        K3C_GUARD_MAX_WINDOW);
    g->lr_scale = s->number;
    g->next = (int)nx->integer;
    g->n = (int)l->n;
    for (size_t i = 0; i < l->n; i++) {
        if (l->items[i].type != K3C_JSON_NUMBER)
            return k3c_errf(err, K3C_EFORMAT, "%s: guard.losses[%zu]: not a number", file, i);
        g->loss[i] = l->items[i].number;
    }
    return K3C_OK;
}
