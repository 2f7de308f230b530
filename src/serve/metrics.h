/* metrics.h — the server's counters in the Prometheus text exposition format (version 0.0.4): requests by endpoint and
 * status, prompt and generated tokens, queue and running gauges, request latency histograms. */
#ifndef K3C_SERVE_METRICS_H
#define K3C_SERVE_METRICS_H

#include "base/json.h"
#include "serve/sched.h"

typedef struct k3c_metrics k3c_metrics;

int k3c_metrics_new(k3c_metrics **out, k3c_err *err);
void k3c_metrics_free(k3c_metrics *m);
/* One finished request: its path (unknown paths count as "other"), HTTP status and seconds from arrival to the last
 * byte handed over. Thread-safe. */
void k3c_metrics_request(k3c_metrics *m, const char *path, int status, double seconds);
void k3c_metrics_tokens(k3c_metrics *m, int64_t prompt, int64_t generated);
/* Appends the exposition; sched comes from the scheduler (zeros before it exists), ready says whether the model is
 * loaded. */
void k3c_metrics_render(k3c_metrics *m, k3c_sbuf *s, const k3c_engine_stats *sched, int ready);

/* The HTTP layer's connections: open now, parked now (waiting for their generation), closed for missing the request
 * deadline, accepted beyond the per-address limit (answered 503). */
typedef struct {
    int open, parked;
    uint64_t timed_out, over_limit;
} k3c_conn_stats;
void k3c_metrics_render_conns(k3c_sbuf *s, const k3c_conn_stats *c);

#endif
