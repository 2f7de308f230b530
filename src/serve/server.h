/* server.h — `k3c serve`: an OpenAI-compatible HTTP server (libmicrohttpd, a thread per connection) in front of the
 * scheduler (docs/SERVING.md). http.c is the HTTP layer, api.c the endpoints. */
#ifndef K3C_SERVE_SERVER_H
#define K3C_SERVE_SERVER_H

#include "serve/metrics.h"
#include "serve/request.h"
#include "serve/response.h"

#include <stdatomic.h>

typedef struct {
    const char *host;       /* listen address, default 127.0.0.1 */
    int port;               /* 0: any free port (k3c_server_port tells which) */
    int slots;              /* sequences in flight */
    int queue_max;          /* requests waiting for a slot before "overloaded" (503) */
    const char *api_key;    /* NULL: none; else every endpoint but /health and /metrics wants "Bearer KEY" */
    int64_t max_tokens_cap; /* completion tokens per request at most */
    size_t max_body;        /* request body bytes at most (413 beyond) */
    int max_connections;
    const char *model_name; /* what /v1/models lists and requests may name */
    size_t max_image_bytes; /* encoded bytes of one image part at most (413 beyond) */
    int thinking_off;       /* requests default to thinking off (the checkpoint was fine-tuned without thinking) */
} k3c_server_opts;

void k3c_server_opts_default(k3c_server_opts *o);

typedef struct k3c_server k3c_server;

/* Starts listening at once (/health answers 503 until k3c_server_ready). */
int k3c_server_start(const k3c_server_opts *o, k3c_server **out, k3c_err *err);
int k3c_server_port(const k3c_server *s);
/* Hands over the loaded model (owned by the caller, kept open until k3c_server_stop returns) and starts serving. */
int k3c_server_ready(k3c_server *s, k3c_serve *sv, k3c_err *err);
/* Graceful: stops accepting, ends every generation (streams get their closing events), waits for the connections. */
void k3c_server_stop(k3c_server *s);

/* ---------------------------------------------------------------- between http.c and api.c */
struct k3c_server {
    k3c_server_opts o;
    char host[64], model_name[256], api_key[256];
    void *daemon; /* struct MHD_Daemon */
    int port;
    atomic_int ready, stopping;
    k3c_serve *sv;
    k3c_sched *sched;
    k3c_metrics *metrics;
    k3c_api_limits lim;
    int32_t stop_ids[K3C_SCHED_MAX_STOP_IDS];
    int n_stop_ids;
    atomic_ullong serial;
};

typedef struct api_stream api_stream; /* a streamed generation, read by the HTTP layer */

/* A reply: a whole body, or a stream of server-sent events. */
typedef struct {
    int status;
    const char *content_type;
    k3c_sbuf body;
    api_stream *stream;
} api_reply;

/* Answers one request. client_fd lets a long wait notice a client that went away. */
void k3c_api_handle(k3c_server *s, const char *method, const char *path, const char *authorization, const char *body,
                    size_t n, int client_fd, api_reply *out);
/* Copies up to max bytes of the stream into buf, waiting for them. Returns the count, 0 at the end of the stream, or
 * -1 when the client has gone away. */
long k3c_api_stream_read(api_stream *st, char *buf, size_t max);
/* The HTTP layer is done with the stream (finished or the connection closed): cancels its generation if still on. */
void k3c_api_stream_close(api_stream *st);

#endif
