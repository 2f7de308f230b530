/* metrics.h — training metrics as JSON Lines (one object per logged step; `k3c train` plots them, src/cli/plot.c).
 * Spec: the run experience of the trainer (metrics JSONL + PNG plots). */
#ifndef K3C_TRAIN_METRICS_H
#define K3C_TRAIN_METRICS_H

#include "base/base.h"

typedef struct {
    int64_t step, tokens;
    int stage;
    double loss, val_loss; /* val_loss NAN when not evaluated at this step */
    double lr, grad_norm, tokens_per_s;
    double max_load_ratio, load_cv; /* worst MoE layer: max/mean expert load, coefficient of variation */
    int n_moe;                      /* per MoE layer, in layer order: */
    const int *moe_layer;           /*   decoder layer index */
    const double *layer_max_ratio;  /*   max/mean expert load */
    const double *layer_cv;         /*   coefficient of variation of the loads */
    int qk_clipped;
    int64_t dead_experts; /* experts of every MoE layer that no token reached this step */
    double load_entropy;  /* entropy of each layer's load shares over log(experts), mean over the MoE layers */
} k3c_metrics_row;

/* Appends one JSON line to f (flushed). */
void k3c_metrics_write(FILE *f, const k3c_metrics_row *r);
/* Appends an event line (flushed): {"step":S,"event":"<event>","reason":"<reason>"<extra>}, extra being "" or more
 * members (",\"lr\":0.001"). Readers of the per-step rows skip lines with an "event" key. */
void k3c_metrics_event(FILE *f, int64_t step, const char *event, const char *reason, const char *extra);

#endif
