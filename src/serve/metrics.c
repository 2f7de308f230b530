/* metrics.c — Prometheus counters of the server (metrics.h): fixed tables of endpoints and statuses under one lock, so
 * recording is a few additions and the exposition is a walk over the tables. */
#include "serve/metrics.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static const char *const ENDPOINTS[] = {
    "/v1/models", "/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize", "/health", "/metrics",
    "other"};
#define N_EP (int)(sizeof ENDPOINTS / sizeof *ENDPOINTS)
static const int STATUSES[] = {200, 400, 401, 404, 405, 413, 415, 429, 499, 500, 503, 504};
#define N_ST (int)(sizeof STATUSES / sizeof *STATUSES)
static const double BUCKETS[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
#define N_BK (int)(sizeof BUCKETS / sizeof *BUCKETS)

struct k3c_metrics {
    pthread_mutex_t mu;
    uint64_t requests[N_EP][N_ST + 1]; /* last column: any other status */
    uint64_t hist[N_EP][N_BK];         /* per bucket, not cumulative */
    uint64_t count[N_EP];
    double sum[N_EP];
    uint64_t prompt_tokens, generated_tokens;
};

int k3c_metrics_new(k3c_metrics **out, k3c_err *err) {
    if (!(*out = calloc(1, sizeof **out))) return k3c_errf(err, K3C_ENOMEM, "metrics: out of memory");
    pthread_mutex_init(&(*out)->mu, NULL);
    return 0;
}

void k3c_metrics_free(k3c_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static int endpoint_index(const char *path) {
    for (int i = 0; i < N_EP - 1; i++)
        if (path && !strcmp(path, ENDPOINTS[i])) return i;
    return N_EP - 1;
}

void k3c_metrics_request(k3c_metrics *m, const char *path, int status, double seconds) {
    int e = endpoint_index(path), s = N_ST, b = 0;
    for (int i = 0; i < N_ST; i++)
        if (STATUSES[i] == status) s = i;
    while (b < N_BK && seconds > BUCKETS[b]) b++;
    pthread_mutex_lock(&m->mu);
    m->requests[e][s]++;
    if (b < N_BK) m->hist[e][b]++;
    m->count[e]++;
    m->sum[e] += seconds;
    pthread_mutex_unlock(&m->mu);
}

void k3c_metrics_tokens(k3c_metrics *m, int64_t prompt, int64_t generated) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)prompt;
    m->generated_tokens += (uint64_t)generated;
    pthread_mutex_unlock(&m->mu);
}

void k3c_metrics_render(k3c_metrics *m, k3c_sbuf *s, const k3c_engine_stats *sched, int ready) {
    pthread_mutex_lock(&m->mu);
    k3c_sbuf_printf(s, "# HELP k3c_requests_total HTTP requests by endpoint and status.\n"
                       "# TYPE k3c_requests_total counter\n");
    for (int e = 0; e < N_EP; e++)
        for (int i = 0; i <= N_ST; i++)
            if (m->requests[e][i]) {
                char st[8] = "other";
                if (i < N_ST) snprintf(st, sizeof st, "%d", STATUSES[i]);
                k3c_sbuf_printf(s, "k3c_requests_total{endpoint=\"%s\",status=\"%s\"} %llu\n", ENDPOINTS[e], st,
                                (unsigned long long)m->requests[e][i]);
            }
    k3c_sbuf_printf(s,
                    "# HELP k3c_prompt_tokens_total Prompt tokens of admitted generation requests.\n"
                    "# TYPE k3c_prompt_tokens_total counter\nk3c_prompt_tokens_total %llu\n"
                    "# HELP k3c_generation_tokens_total Generated tokens.\n"
                    "# TYPE k3c_generation_tokens_total counter\nk3c_generation_tokens_total %llu\n"
                    "# HELP k3c_queue_length Generation requests waiting for a slot.\n"
                    "# TYPE k3c_queue_length gauge\nk3c_queue_length %d\n"
                    "# HELP k3c_running Generation requests in a slot.\n"
                    "# TYPE k3c_running gauge\nk3c_running %d\n"
                    "# HELP k3c_engine_steps_total Batched decode steps of the inference engine.\n"
                    "# TYPE k3c_engine_steps_total counter\nk3c_engine_steps_total %llu\n"
                    "# HELP k3c_engine_step_sequences_total Sequences those steps ran, summed.\n"
                    "# TYPE k3c_engine_step_sequences_total counter\nk3c_engine_step_sequences_total %llu\n"
                    "# HELP k3c_engine_batch_max The most sequences one engine step ran.\n"
                    "# TYPE k3c_engine_batch_max gauge\nk3c_engine_batch_max %d\n"
                    "# HELP k3c_engine_prefills_shared_total Sequences that forked from another's prefill of their "
                    "prompt.\n"
                    "# TYPE k3c_engine_prefills_shared_total counter\nk3c_engine_prefills_shared_total %lld\n"
                    "# HELP k3c_ready 1 once the model is loaded.\n# TYPE k3c_ready gauge\nk3c_ready %d\n"
                    "# HELP k3c_request_duration_seconds Time from a request's arrival to its last byte.\n"
                    "# TYPE k3c_request_duration_seconds histogram\n",
                    (unsigned long long)m->prompt_tokens, (unsigned long long)m->generated_tokens, sched->queued,
                    sched->running, (unsigned long long)sched->steps, (unsigned long long)sched->step_seqs,
                    sched->batch_max, (long long)sched->prefills_shared, ready);
    for (int e = 0; e < N_EP; e++) {
        if (!m->count[e]) continue;
        uint64_t cum = 0;
        for (int b = 0; b < N_BK; b++) {
            cum += m->hist[e][b];
            k3c_sbuf_printf(s, "k3c_request_duration_seconds_bucket{endpoint=\"%s\",le=\"%g\"} %llu\n", ENDPOINTS[e],
                            BUCKETS[b], (unsigned long long)cum);
        }
        k3c_sbuf_printf(s,
                        "k3c_request_duration_seconds_bucket{endpoint=\"%s\",le=\"+Inf\"} %llu\n"
                        "k3c_request_duration_seconds_sum{endpoint=\"%s\"} %.6f\n"
                        "k3c_request_duration_seconds_count{endpoint=\"%s\"} %llu\n",
                        ENDPOINTS[e], (unsigned long long)m->count[e], ENDPOINTS[e], m->sum[e], ENDPOINTS[e],
                        (unsigned long long)m->count[e]);
    }
    pthread_mutex_unlock(&m->mu);
}

void k3c_metrics_render_conns(k3c_sbuf *s, const k3c_conn_stats *c) {
    k3c_sbuf_printf(s,
                    "# HELP k3c_connections Open HTTP connections.\n# TYPE k3c_connections gauge\nk3c_connections %d\n"
                    "# HELP k3c_connections_parked Connections waiting for their generation (no thread held).\n"
                    "# TYPE k3c_connections_parked gauge\nk3c_connections_parked %d\n"
                    "# HELP k3c_connections_timed_out_total Connections closed for not sending a whole request in "
                    "time.\n# TYPE k3c_connections_timed_out_total counter\nk3c_connections_timed_out_total %llu\n"
                    "# HELP k3c_connections_over_limit_total Connections accepted beyond the per-address limit (their "
                    "requests are answered 503).\n# TYPE k3c_connections_over_limit_total "
                    "counter\nk3c_connections_over_limit_total %llu\n",
                    c->open, c->parked, (unsigned long long)c->timed_out, (unsigned long long)c->over_limit);
}
