/* http_client.h — a plain-socket HTTP/1.1 client for the serving tests (one request per connection, chunked bodies
 * undone), so they need no HTTP library of their own. Static inline: an includer uses what it needs. */
#ifndef K3C_HTTP_CLIENT_H
#define K3C_HTTP_CLIENT_H

#include "test.h"

#include "base/json.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

typedef struct {
    int status;
    char *headers, *body; /* body de-chunked, NUL-terminated */
    size_t body_len;
} http_resp;

/* A response body as JSON; NULL when it is not. */
static inline k3c_json *http_json(const char *s, size_t n) {
    k3c_json *j = NULL;
    k3c_err err = {0};
    return s && k3c_json_parse(s, n, "response", &j, &err) == K3C_OK ? j : NULL;
}

/* o's string member key; NULL when absent or not a string. */
static inline const char *json_str(const k3c_json *o, const char *key) {
    const k3c_json *v = k3c_json_get(o, key);
    return v && v->type == K3C_JSON_STRING ? v->string : NULL;
}

static inline void http_resp_free(http_resp *r) {
    free(r->headers);
    free(r->body);
    memset(r, 0, sizeof *r);
}

static inline int http_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static inline int http_send(int fd, const char *method, const char *path, const char *auth, const char *body,
                            size_t n) {
    char head[1024];
    int h = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
                     "%s%s%sContent-Length: %zu\r\n\r\n",
                     method, path, auth ? "Authorization: " : "", auth ? auth : "", auth ? "\r\n" : "", body ? n : 0);
    if (send(fd, head, (size_t)h, MSG_NOSIGNAL) != h) return -1;
    for (size_t off = 0; body && off < n;) {
        ssize_t w = send(fd, body + off, n - off, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        off += (size_t)w;
    }
    return 0;
}

/* Undoes Transfer-Encoding: chunked in place; returns the new length (or n when the body is not chunked). */
static inline size_t http_dechunk(char *b, size_t n) {
    size_t in = 0, out = 0;
    for (;;) {
        char *end;
        unsigned long len = strtoul(b + in, &end, 16);
        char *crlf = strstr(end, "\r\n");
        if (!crlf || end == b + in) return out;
        in = (size_t)(crlf - b) + 2;
        if (len == 0 || in + len > n) return out;
        memmove(b + out, b + in, len);
        out += len;
        in += len + 2;
    }
}

/* Reads the whole response (the server closes the connection). */
static inline int http_read(int fd, http_resp *r) {
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    char buf[65536];
    ssize_t got;
    while ((got = recv(fd, buf, sizeof buf, 0)) > 0) k3c_sbuf_append(&s, buf, (size_t)got);
    memset(r, 0, sizeof *r);
    char *sep = s.buf ? strstr(s.buf, "\r\n\r\n") : NULL;
    if (!sep || sscanf(s.buf, "HTTP/1.%*d %d", &r->status) != 1) {
        k3c_sbuf_free(&s);
        return -1;
    }
    *sep = 0;
    r->headers = strdup(s.buf);
    size_t n = s.len - (size_t)(sep + 4 - s.buf);
    r->body = malloc(n + 1);
    memcpy(r->body, sep + 4, n);
    if (strcasestr(r->headers, "transfer-encoding: chunked")) n = http_dechunk(r->body, n);
    r->body[n] = 0;
    r->body_len = n;
    k3c_sbuf_free(&s);
    return 0;
}

static inline int http_do(int port, const char *method, const char *path, const char *auth, const char *body,
                          http_resp *r) {
    int fd = http_connect(port);
    memset(r, 0, sizeof *r);
    if (fd < 0) return -1;
    int rc = http_send(fd, method, path, auth, body, body ? strlen(body) : 0);
    if (!rc) rc = http_read(fd, r);
    close(fd);
    return rc;
}

/* Reads a Prometheus counter line's value from /metrics (-1 if absent). */
static inline double metric(int port, const char *series) {
    http_resp r;
    double v = -1;
    if (http_do(port, "GET", "/metrics", NULL, NULL, &r) == 0 && r.status == 200) {
        const char *p = strstr(r.body, series);
        if (p) v = atof(p + strlen(series));
    }
    http_resp_free(&r);
    return v;
}

#endif
