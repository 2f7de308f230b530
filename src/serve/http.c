/* http.c — the HTTP layer of `k3c serve` (server.h) on libmicrohttpd: a few polling threads over epoll, none per
 * connection; request bodies gathered up to a limit; replies handed to api.c; a generation's connection parked
 * (suspended) while it has nothing to send and resumed by the engine; metrics per request, and a graceful stop. The
 * connection guard (deadlines, per-address limits) is http_conn.c. docs/SERVING.md §4, §7. */
#include "serve/server.h"

#include <arpa/inet.h>
#include <math.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

void k3c_server_opts_default(k3c_server_opts *o) {
    *o = (k3c_server_opts){.host = "127.0.0.1",
                           .port = 8000,
                           .slots = 1,
                           .queue_max = 64,
                           .max_tokens_cap = 1024,
                           .max_body = 4 << 20,
                           .max_connections = 4096,
                           .max_conns_per_ip = 64,
                           .threads = 4,
                           .request_timeout = 30,
                           .max_gen_s = 600,
                           .max_queue_s = 60,
                           .model_name = "k3c",
                           .max_image_bytes = K3C_API_MAX_IMAGE_BYTES};
}

/* One request on a connection. call: its generation (whole answers and streams alike), owned here until the request
 * completes. */
typedef struct {
    http_conn *conn;
    k3c_sbuf body;
    int too_large;
    double t0;
    char path[32]; /* for metrics: the endpoint, or "other" */
    int status;
    api_stream *call;
} req_ctx;

/* What a streamed response's reader needs; the call itself belongs to the request (req_ctx). */
typedef struct {
    api_stream *call;
    http_conn *conn;
} stream_src;

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_src *src = cls;
    long n = k3c_api_stream_read(src->call, buf, max, http_guard_wake, src->conn);
    if (n == K3C_API_AGAIN) /* nothing yet: park the connection until the engine wakes it */
        return http_guard_park(src->conn, src->call) ? MHD_CONTENT_READER_END_WITH_ERROR : 0;
    return n > 0 ? (ssize_t)n : n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free(void *cls) { free(cls); }

static http_conn *conn_of(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static enum MHD_Result send_reply(struct MHD_Connection *conn, req_ctx *rc, api_reply *r, int close_after) {
    struct MHD_Response *resp = NULL;
    stream_src *src = NULL;
    if (r->call) {
        if ((src = malloc(sizeof *src))) {
            *src = (stream_src){r->call, rc->conn};
            resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, src, stream_free);
            if (!resp) free(src);
        }
        rc->call = r->call; /* closed when the request completes, however it ends */
    } else {
        resp = MHD_create_response_from_buffer(r->body.len, r->body.buf ? r->body.buf : "", MHD_RESPMEM_MUST_COPY);
    }
    k3c_sbuf_free(&r->body);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->content_type);
    if (r->call) MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    if (r->retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", r->retry_after);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    if (close_after) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    rc->status = r->status;
    http_guard_answering(rc->conn);
    enum MHD_Result ok = MHD_queue_response(conn, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static enum MHD_Result send_error(struct MHD_Connection *conn, req_ctx *rc, int status, const char *code,
                                  int retry_after, const char *msg) {
    api_reply r = {.status = status, .content_type = "application/json", .retry_after = retry_after};
    k3c_api_error e;
    k3c_api_fail(&e, status, status == 503 ? "server_error" : "invalid_request_error", code, NULL, "%s", msg);
    k3c_sbuf_init(&r.body);
    k3c_api_error_json(&r.body, &e);
    return send_reply(conn, rc, &r, 1);
}

/* A whole answer: sent once the generation ended, else the connection is parked until it does. */
static enum MHD_Result answer_whole(struct MHD_Connection *conn, req_ctx *rc) {
    api_reply r;
    if (!k3c_api_result(rc->call, &r, http_guard_wake, rc->conn))
        return http_guard_park(rc->conn, rc->call) ? MHD_NO : MHD_YES;
    k3c_api_stream_close(rc->call);
    rc->call = NULL;
    if (r.status == 0) { /* the client left while its answer was computed */
        k3c_sbuf_free(&r.body);
        rc->status = 499;
        return MHD_NO;
    }
    return send_reply(conn, rc, &r, 0);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    k3c_server *s = cls;
    req_ctx *rc = *con_cls;
    if (!rc) { /* first call: headers only */
        if (!(rc = calloc(1, sizeof *rc))) return MHD_NO;
        k3c_sbuf_init(&rc->body);
        rc->t0 = k3c_now();
        rc->conn = conn_of(conn);
        snprintf(rc->path, sizeof rc->path, "%s", strlen(url) < sizeof rc->path ? url : "other");
        *con_cls = rc;
        if (!rc->conn) return MHD_NO;
        if (http_guard_over(rc->conn)) {
            char msg[160];
            snprintf(msg, sizeof msg, "Too many connections from your address (more than %d); retry later",
                     s->o.max_conns_per_ip);
            return send_error(conn, rc, 503, "too_many_connections", 1, msg);
        }
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->o.max_body) rc->too_large = 1; /* answered before the body is read */
        if (!rc->too_large) return MHD_YES;
    }
    if (rc->call) return answer_whole(conn, rc); /* resumed */
    if (*upload_size) {
        if (rc->body.len + *upload_size > s->o.max_body)
            rc->too_large = 1;
        else
            k3c_sbuf_append(&rc->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (rc->too_large) {
        char msg[96];
        snprintf(msg, sizeof msg, "The request body is larger than %zu bytes", s->o.max_body);
        return send_error(conn, rc, 413, "request_too_large", 0, msg);
    }
    if (!rc->body.ok) return MHD_NO;
    http_guard_answering(rc->conn); /* the request is whole: its deadline is met */
    api_reply r;
    /* Anthropic's clients send the key as x-api-key */
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    const char *xkey = auth ? NULL : MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "x-api-key");
    char bearer[320];
    if (xkey && snprintf(bearer, sizeof bearer, "Bearer %s", xkey) < (int)sizeof bearer) auth = bearer;
    k3c_api_handle(s, method, url, auth, rc->body.buf ? rc->body.buf : "", rc->body.len, &r);
    if (r.call && !r.streamed) {
        k3c_sbuf_free(&r.body);
        rc->call = r.call;
        return answer_whole(conn, rc);
    }
    return send_reply(conn, rc, &r, 0);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode why) {
    (void)why;
    k3c_server *s = cls;
    req_ctx *rc = *con_cls;
    if (!rc) return;
    if (rc->call) { /* no wake may reach the connection after this */
        k3c_api_stream_disarm(rc->call);
        k3c_api_stream_close(rc->call);
    }
    if (rc->status) k3c_metrics_request(s->metrics, rc->path, rc->status, k3c_now() - rc->t0);
    if (rc->conn) http_guard_answered(rc->conn); /* a kept-alive connection waits for its next request */
    k3c_sbuf_free(&rc->body);
    free(rc);
    *con_cls = NULL;
    (void)conn;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    k3c_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        http_guard_close(*socket_context);
        *socket_context = NULL;
        return;
    }
    const union MHD_ConnectionInfo *fd = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD),
                                   *ad = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    uint32_t ip = 0;
    if (ad && ad->client_addr && ad->client_addr->sa_family == AF_INET)
        ip = ((const struct sockaddr_in *)(const void *)ad->client_addr)->sin_addr.s_addr;
    *socket_context = fd ? http_guard_open(s->guard, conn, fd->connect_fd, ip) : NULL;
    if (!*socket_context && fd) shutdown(fd->connect_fd, SHUT_RDWR); /* untracked: not served */
}

/* The open files the server may need: its connections, plus a margin for the listening socket, the epoll and ITC
 * descriptors of each thread, the model's files and the process's own. */
static int check_fd_limit(const k3c_server_opts *o, k3c_err *err) {
    struct rlimit rl;
    const rlim_t need = (rlim_t)o->max_connections + 64 + 4 * (rlim_t)o->threads;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need)
        return k3c_errf(err, K3C_EINVAL,
                        "serve: --max-conns %d needs %llu open files, the limit is %llu (raise it with ulimit -n, or "
                        "lower --max-conns)",
                        o->max_connections, (unsigned long long)need, (unsigned long long)rl.rlim_cur);
    return 0;
}

int k3c_server_start(const k3c_server_opts *o, k3c_server **out, k3c_err *err) {
    *out = NULL;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    if (!o->host || inet_pton(AF_INET, o->host, &addr.sin_addr) != 1)
        return k3c_errf(err, K3C_EINVAL, "serve: --host %s is not an IPv4 address", o->host ? o->host : "(null)");
    if (o->port < 0 || o->port > 65535 || o->slots < 1 || o->max_tokens_cap < 1 || o->max_body < 64)
        return k3c_errf(err, K3C_EINVAL, "serve: bad options (port %d, slots %d, max tokens %lld, body %zu)", o->port,
                        o->slots, (long long)o->max_tokens_cap, o->max_body);
    if (o->max_connections < 1 || o->max_conns_per_ip < 1 || o->threads < 1 || o->threads > 256 ||
        !(o->request_timeout >= 1 && o->request_timeout <= 86400) || !(o->max_gen_s >= 0) || !(o->max_queue_s >= 0))
        return k3c_errf(err, K3C_EINVAL,
                        "serve: bad connection options (max conns %d, per address %d, threads %d, request timeout "
                        "%g s, generation %g s, queue %g s)",
                        o->max_connections, o->max_conns_per_ip, o->threads, o->request_timeout, o->max_gen_s,
                        o->max_queue_s);
    int rc = check_fd_limit(o, err);
    if (rc) return rc;
    k3c_server *s = calloc(1, sizeof *s);
    if (!s) return k3c_errf(err, K3C_ENOMEM, "serve: out of memory");
    s->o = *o;
    snprintf(s->host, sizeof s->host, "%s", o->host);
    snprintf(s->model_name, sizeof s->model_name, "%s", o->model_name ? o->model_name : "k3c");
    snprintf(s->api_key, sizeof s->api_key, "%s", o->api_key ? o->api_key : "");
    s->o.host = s->host;
    s->o.model_name = s->model_name;
    s->o.api_key = s->api_key;
    rc = k3c_metrics_new(&s->metrics, err);
    if (!rc) rc = http_guard_new(o->request_timeout, o->max_conns_per_ip, &s->guard, err);
    if (rc) {
        k3c_metrics_free(s->metrics);
        free(s);
        return rc;
    }
    /* beyond max_conns_per_ip an address's connections are answered 503 (http_conn.c); beyond twice that
     * libmicrohttpd refuses them at accept, so one address cannot take the whole connection limit. Its idle timeout,
     * a second past the request deadline (which the watchdog keeps), ends answers the client stopped reading. */
    const unsigned hard_per_ip = 2u * (unsigned)o->max_conns_per_ip;
    s->daemon =
        MHD_start_daemon(MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME, (uint16_t)o->port, NULL, NULL,
                         on_request, s, MHD_OPTION_SOCK_ADDR, &addr, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)o->threads,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                         hard_per_ip < (unsigned)o->max_connections ? hard_per_ip : (unsigned)o->max_connections,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)ceil(o->request_timeout) + 1, MHD_OPTION_END);
    if (!s->daemon) {
        http_guard_free(s->guard);
        k3c_metrics_free(s->metrics);
        free(s);
        return k3c_errf(err, K3C_EIO, "serve: cannot listen on %s:%d (in use, or not allowed)", o->host, o->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    *out = s;
    return 0;
}

int k3c_server_port(const k3c_server *s) { return s->port; }

void k3c_server_stop(k3c_server *s) {
    if (!s) return;
    atomic_store(&s->stopping, 1);
    MHD_socket listen_fd = MHD_quiesce_daemon(s->daemon); /* no new connections */
    if (s->sched) k3c_sched_close(s->sched);              /* generations end; streams send their closing events */
    /* every parked connection is woken by its generation's end and sends its last bytes (a client that reads too
     * slowly is cut after a grace); libmicrohttpd must not stop with a connection suspended */
    http_guard_stop(s->guard, 10);
    MHD_stop_daemon(s->daemon);                            /* closes every connection, joins its threads */
    if (listen_fd != MHD_INVALID_SOCKET) close(listen_fd); /* ours after a quiesce, once the threads are gone */
    http_guard_free(s->guard);
    k3c_sched_free(s->sched);
    k3c_vtrie_free(s->trie); /* after the engine: the last sequences' constraints walk it */
    k3c_metrics_free(s->metrics);
    free(s);
}
