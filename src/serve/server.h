/* server.h — internal to `k3c serve`'s OpenAI-compatible HTTP server (its start / ready / stop: k3c/serve.h): the
 * server struct and what http.c (the HTTP layer), http_conn.c (its connection guard) and api.c (the endpoints) share.
 * docs/SERVING.md. */
#ifndef K3C_SERVE_SERVER_H
#define K3C_SERVE_SERVER_H

#include "k3c/serve.h"
#include "serve/metrics.h"
#include "serve/request.h"
#include "serve/response.h"

#include <stdatomic.h>

/* ---------------------------------------------------------------- between http.c, http_conn.c and api.c */
typedef struct http_guard http_guard; /* http_conn.c: connection tracking, deadlines, per-address counts */
typedef struct http_conn http_conn;   /* one tracked connection */
struct MHD_Connection;

struct k3c_server {
    k3c_server_opts o;
    char host[64], model_name[256], api_key[256];
    void *daemon; /* struct MHD_Daemon */
    http_guard *guard;
    int port;
    atomic_int ready, stopping;
    k3c_serve *sv;
    k3c_sched *sched;
    k3c_metrics *metrics;
    k3c_api_limits lim;
    k3c_vtrie *trie; /* the vocabulary trie of constrained decoding, read by every request's grammar */
    int32_t stop_ids[K3C_MAX_STOP_IDS];
    int n_stop_ids;
    atomic_ullong serial;
};

typedef struct api_stream api_stream; /* a generation call, read by the HTTP layer */

/* A reply: a whole body; a generation answered whole once it ends (call, !streamed, status 0 until
 * k3c_api_result); or a stream of server-sent events (call, streamed). retry_after: seconds for a Retry-After header. */
typedef struct {
    int status;
    const char *content_type;
    k3c_sbuf body;
    api_stream *call;
    int streamed, retry_after;
    int anthropic; /* /v1/messages: errors in Anthropic's shape */
} api_reply;

/* The connection guard (http_conn.c). A connection must receive a whole request within request_timeout seconds of
 * connecting or of its last answer's end; the watchdog shuts down late ones. Parked connections (suspended while their
 * generation has nothing to send) are resumed by http_guard_wake; the watchdog cancels the calls of those whose
 * client hung up. */
int http_guard_new(double request_timeout, int per_ip, http_guard **out, k3c_err *err);
void http_guard_free(http_guard *g);
http_conn *http_guard_open(http_guard *g, struct MHD_Connection *mhd, int fd, uint32_t ipv4); /* NULL: no memory */
void http_guard_close(http_conn *c);
int http_guard_over(http_conn *c);       /* 1: its address has more than per_ip connections, this one among the extra */
void http_guard_answering(http_conn *c); /* the request is whole (or answered early): its deadline no longer runs */
void http_guard_answered(http_conn *c);  /* the answer ended: the next request's deadline starts */
/* Suspends the connection (from a libmicrohttpd callback of it) until http_guard_wake(c); 1 when the server is stopping
 * (then nothing is suspended). */
int http_guard_park(http_conn *c, api_stream *call);
void http_guard_wake(void *conn);
/* Refuses further parking, waits up to `seconds` for every answer in flight to end (parked connections woken, their
 * last bytes sent), then resumes the connections still parked. */
void http_guard_stop(http_guard *g, double seconds);
void http_guard_stats(http_guard *g, k3c_conn_stats *st);

/* Called once, on the engine thread (or whichever ends the call), when an armed call has something to read: the HTTP
 * layer then resumes the connection it parked. Must not block or take the call's lock. */
typedef void (*k3c_api_wake)(void *ctx);
#define K3C_API_AGAIN (-2L)

/* Answers one request without waiting: a generation is only started. */
void k3c_api_handle(k3c_server *s, const char *method, const char *path, const char *authorization, const char *body,
                    size_t n, api_reply *out);
/* Copies up to max bytes of the stream into buf without waiting. Returns the count, 0 at the end of the stream, -1
 * when the client has gone away, or K3C_API_AGAIN: nothing yet, and wake(ctx) comes once there is. */
long k3c_api_stream_read(api_stream *st, char *buf, size_t max, k3c_api_wake wake, void *ctx);
/* A whole answer: 1 with *r filled once the generation ended (status 0: the client went away, answer nothing), else 0
 * and wake(ctx) comes when it ends. */
int k3c_api_result(api_stream *c, api_reply *r, k3c_api_wake wake, void *ctx);
/* No wake may come after this returns (the connection is going). */
void k3c_api_stream_disarm(api_stream *st);
/* The client went away: the generation is cancelled and reads answer -1. */
void k3c_api_stream_gone(api_stream *st);
/* One more reference, given back with k3c_api_stream_close; takes no lock, so a caller may hold its own. */
void k3c_api_stream_hold(api_stream *st);
/* The HTTP layer is done with the call (finished or the connection closed): cancels its generation if still on. */
void k3c_api_stream_close(api_stream *st);

#endif
