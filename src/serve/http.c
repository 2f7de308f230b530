/* http.c — the HTTP layer of `k3c serve` (server.h) on libmicrohttpd: a thread per connection, request bodies gathered
 * up to a limit, replies handed to api.c, streams pulled through a content-reader callback, metrics per request, and
 * a graceful stop. */
#include "serve/server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void k3c_server_opts_default(k3c_server_opts *o) {
    *o = (k3c_server_opts){.host = "127.0.0.1",
                           .port = 8000,
                           .slots = 1,
                           .queue_max = 64,
                           .max_tokens_cap = 1024,
                           .max_body = 4 << 20,
                           .max_connections = 256,
                           .model_name = "k3c",
                           .max_image_bytes = K3C_API_MAX_IMAGE_BYTES};
}

/* One request on a connection. */
typedef struct {
    k3c_sbuf body;
    int too_large;
    double t0;
    char path[32]; /* for metrics: the endpoint, or "other" */
    int status;
} req_ctx;

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    long n = k3c_api_stream_read(cls, buf, max);
    return n > 0 ? (ssize_t)n : n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free(void *cls) { k3c_api_stream_close(cls); }

static enum MHD_Result send_reply(struct MHD_Connection *conn, req_ctx *rc, api_reply *r) {
    struct MHD_Response *resp;
    if (r->stream) {
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, r->stream, stream_free);
        if (!resp) k3c_api_stream_close(r->stream);
    } else {
        resp = MHD_create_response_from_buffer(r->body.len, r->body.buf ? r->body.buf : "", MHD_RESPMEM_MUST_COPY);
    }
    k3c_sbuf_free(&r->body);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->content_type);
    if (r->stream) MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    rc->status = r->status;
    enum MHD_Result ok = MHD_queue_response(conn, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static enum MHD_Result too_large(struct MHD_Connection *conn, k3c_server *s, req_ctx *rc) {
    api_reply r = {0};
    k3c_api_error e;
    k3c_api_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
                 "The request body is larger than %zu bytes", s->o.max_body);
    k3c_sbuf_init(&r.body);
    r.status = 413;
    r.content_type = "application/json";
    k3c_api_error_json(&r.body, &e);
    return send_reply(conn, rc, &r);
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
        snprintf(rc->path, sizeof rc->path, "%s", strlen(url) < sizeof rc->path ? url : "other");
        *con_cls = rc;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->o.max_body) return too_large(conn, s, rc); /* body never read */
        return MHD_YES;
    }
    if (*upload_size) {
        if (rc->body.len + *upload_size > s->o.max_body)
            rc->too_large = 1;
        else
            k3c_sbuf_append(&rc->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (rc->too_large) return too_large(conn, s, rc);
    if (!rc->body.ok) return MHD_NO;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    api_reply r;
    k3c_api_handle(s, method, url, MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION),
                   rc->body.buf ? rc->body.buf : "", rc->body.len, ci ? ci->connect_fd : -1, &r);
    if (r.status == 0) { /* the client left while its answer was computed */
        k3c_sbuf_free(&r.body);
        rc->status = 499;
        return MHD_NO;
    }
    return send_reply(conn, rc, &r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode why) {
    (void)conn;
    k3c_server *s = cls;
    req_ctx *rc = *con_cls;
    if (!rc) return;
    if (rc->status) k3c_metrics_request(s->metrics, rc->path, rc->status, k3c_now() - rc->t0);
    k3c_sbuf_free(&rc->body);
    free(rc);
    *con_cls = NULL;
    (void)why;
}

int k3c_server_start(const k3c_server_opts *o, k3c_server **out, k3c_err *err) {
    *out = NULL;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    if (!o->host || inet_pton(AF_INET, o->host, &addr.sin_addr) != 1)
        return k3c_errf(err, K3C_EINVAL, "serve: --host %s is not an IPv4 address", o->host ? o->host : "(null)");
    if (o->port < 0 || o->port > 65535 || o->slots < 1 || o->max_tokens_cap < 1 || o->max_body < 64)
        return k3c_errf(err, K3C_EINVAL, "serve: bad options (port %d, slots %d, max tokens %lld, body %zu)", o->port,
                        o->slots, (long long)o->max_tokens_cap, o->max_body);
    k3c_server *s = calloc(1, sizeof *s);
    if (!s) return k3c_errf(err, K3C_ENOMEM, "serve: out of memory");
    s->o = *o;
    snprintf(s->host, sizeof s->host, "%s", o->host);
    snprintf(s->model_name, sizeof s->model_name, "%s", o->model_name ? o->model_name : "k3c");
    snprintf(s->api_key, sizeof s->api_key, "%s", o->api_key ? o->api_key : "");
    s->o.host = s->host;
    s->o.model_name = s->model_name;
    s->o.api_key = s->api_key;
    int rc = k3c_metrics_new(&s->metrics, err);
    if (rc) {
        free(s);
        return rc;
    }
    s->daemon = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC,
                                 (uint16_t)o->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &addr,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_LIMIT,
                                 (unsigned)o->max_connections, MHD_OPTION_CONNECTION_TIMEOUT, 600u, MHD_OPTION_END);
    if (!s->daemon) {
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
    MHD_socket listen_fd = MHD_quiesce_daemon(s->daemon);  /* no new connections */
    if (s->sched) k3c_sched_close(s->sched);               /* generations end; streams send their closing events */
    MHD_stop_daemon(s->daemon);                            /* waits for every connection thread */
    if (listen_fd != MHD_INVALID_SOCKET) close(listen_fd); /* ours after a quiesce, once the threads are gone */
    k3c_sched_free(s->sched);
    k3c_metrics_free(s->metrics);
    free(s);
}
