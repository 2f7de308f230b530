/* http_conn.c — the connection guard of `k3c serve` (server.h): every connection tracked from accept to close, the
 * deadline for receiving a whole request, connections counted per client address, parked (suspended) connections and a
 * watchdog thread that closes late ones and notices clients that hang up while parked (docs/SERVING.md §7). */
#include "serve/server.h"

#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#define N_BUCKETS 1024
#define SWEEP_NS (100 * 1000 * 1000) /* the watchdog's period: the deadline's precision */

typedef struct ip_count {
    uint32_t ip;
    int n;
    struct ip_count *next;
} ip_count;

typedef enum { LIST_NONE, LIST_WAITING, LIST_PARKED } conn_list;

struct http_conn {
    http_conn *prev, *next; /* in the guard's waiting list (oldest first) or its parked list */
    conn_list list;
    http_guard *g;
    struct MHD_Connection *mhd;
    int fd;
    uint32_t ip;
    int over;       /* accepted while its address had max_conns_per_ip others open */
    double t_ready; /* connected, or the last answer ended: the request deadline counts from here */
    int woken;      /* the wake came before the connection was parked */
    api_stream *call;
};

struct http_guard {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled when a parked connection resumes, and to stop the watchdog */
    http_conn *wait_head, *wait_tail, *parked;
    ip_count *buckets[N_BUCKETS];
    double timeout;
    int per_ip, n_open, n_waiting, n_parked, stop, started, closing;
    uint64_t timed_out, over_limit;
    pthread_t thread;
};

/* ---------------------------------------------------------------- lists (mu held) */

static void unlink_conn(http_guard *g, http_conn *c) {
    if (c->list == LIST_NONE) return;
    http_conn **head = c->list == LIST_WAITING ? &g->wait_head : &g->parked;
    if (c->prev)
        c->prev->next = c->next;
    else
        *head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else if (c->list == LIST_WAITING)
        g->wait_tail = c->prev;
    if (c->list == LIST_PARKED) g->n_parked--;
    if (c->list == LIST_WAITING) g->n_waiting--;
    c->prev = c->next = NULL;
    c->list = LIST_NONE;
}

static void push_waiting(http_guard *g, http_conn *c, double now) {
    unlink_conn(g, c);
    c->t_ready = now;
    c->prev = g->wait_tail;
    if (g->wait_tail)
        g->wait_tail->next = c;
    else
        g->wait_head = c;
    g->wait_tail = c;
    c->list = LIST_WAITING;
    g->n_waiting++;
}

static void push_parked(http_guard *g, http_conn *c) {
    unlink_conn(g, c);
    c->next = g->parked;
    if (g->parked) g->parked->prev = c;
    g->parked = c;
    c->list = LIST_PARKED;
    g->n_parked++;
}

/* The count of ip's open connections, changed by d (an entry is made at the first and dropped at the last). */
static int ip_add(http_guard *g, uint32_t ip, int d) {
    ip_count **pp = &g->buckets[(ip * 2654435761u) >> 22 & (N_BUCKETS - 1)];
    while (*pp && (*pp)->ip != ip) pp = &(*pp)->next;
    if (!*pp) {
        if (d <= 0 || !(*pp = calloc(1, sizeof **pp))) return 0;
        (*pp)->ip = ip;
    }
    int n = (*pp)->n += d;
    if (n <= 0) {
        ip_count *e = *pp;
        *pp = e->next;
        free(e);
    }
    return n;
}

/* ---------------------------------------------------------------- the watchdog */

/* 1 when the peer closed its side or the socket failed. */
static int client_gone(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

#define GONE_BATCH 64

/* One sweep: connections past their request deadline are shut down (libmicrohttpd then sees the socket end and closes
 * it); calls of parked connections whose client hung up are cancelled, outside the lock (a cancel may end the call,
 * whose wake takes it). */
static void sweep(http_guard *g) {
    api_stream *gone[GONE_BATCH];
    int n_gone = 0;
    pthread_mutex_lock(&g->mu);
    const double now = k3c_now();
    while (g->wait_head && now - g->wait_head->t_ready >= g->timeout) {
        http_conn *c = g->wait_head;
        unlink_conn(g, c);
        shutdown(c->fd, SHUT_RDWR); /* the fd stays ours until the close notification, which takes mu */
        g->timed_out++;
    }
    for (http_conn *c = g->parked; c && n_gone < GONE_BATCH; c = c->next)
        if (c->call && client_gone(c->fd)) {
            k3c_api_stream_hold(c->call);
            gone[n_gone++] = c->call;
            c->call = NULL; /* once */
        }
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < n_gone; i++) {
        k3c_api_stream_gone(gone[i]);
        k3c_api_stream_close(gone[i]);
    }
}

static void *watchdog(void *arg) {
    http_guard *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += SWEEP_NS;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        if (g->stop) break;
        pthread_mutex_unlock(&g->mu);
        sweep(g);
        pthread_mutex_lock(&g->mu);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* ---------------------------------------------------------------- the guard's interface (server.h) */

int http_guard_new(double timeout, int per_ip, http_guard **out, k3c_err *err) {
    *out = NULL;
    http_guard *g = calloc(1, sizeof *g);
    if (!g) return k3c_errf(err, K3C_ENOMEM, "serve: out of memory");
    g->timeout = timeout;
    g->per_ip = per_ip;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (pthread_create(&g->thread, NULL, watchdog, g)) {
        http_guard_free(g);
        return k3c_errf(err, K3C_ENOMEM, "serve: cannot start the connection watchdog thread");
    }
    g->started = 1;
    *out = g;
    return 0;
}

void http_guard_free(http_guard *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->stop = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (g->started) pthread_join(g->thread, NULL);
    for (int b = 0; b < N_BUCKETS; b++)
        while (g->buckets[b]) {
            ip_count *e = g->buckets[b];
            g->buckets[b] = e->next;
            free(e);
        }
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

http_conn *http_guard_open(http_guard *g, struct MHD_Connection *mhd, int fd, uint32_t ip) {
    http_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->g = g, c->mhd = mhd, c->fd = fd, c->ip = ip;
    pthread_mutex_lock(&g->mu);
    c->over = ip_add(g, ip, 1) > g->per_ip;
    g->over_limit += (uint64_t)c->over;
    g->n_open++;
    push_waiting(g, c, k3c_now());
    pthread_mutex_unlock(&g->mu);
    return c;
}

void http_guard_close(http_conn *c) {
    if (!c) return;
    http_guard *g = c->g;
    pthread_mutex_lock(&g->mu);
    unlink_conn(g, c);
    ip_add(g, c->ip, -1);
    g->n_open--;
    pthread_mutex_unlock(&g->mu);
    free(c);
}

int http_guard_over(http_conn *c) {
    http_guard *g = c->g;
    pthread_mutex_lock(&g->mu);
    if (c->over) c->over = ip_add(g, c->ip, 0) > g->per_ip; /* others may have closed since it connected */
    int over = c->over;
    pthread_mutex_unlock(&g->mu);
    return over;
}

void http_guard_answering(http_conn *c) {
    pthread_mutex_lock(&c->g->mu);
    if (c->list == LIST_WAITING) unlink_conn(c->g, c);
    pthread_mutex_unlock(&c->g->mu);
}

void http_guard_answered(http_conn *c) {
    pthread_mutex_lock(&c->g->mu);
    c->call = NULL;
    push_waiting(c->g, c, k3c_now());
    if (c->g->closing) pthread_cond_broadcast(&c->g->cv);
    pthread_mutex_unlock(&c->g->mu);
}

int http_guard_park(http_conn *c, api_stream *call) {
    http_guard *g = c->g;
    pthread_mutex_lock(&g->mu);
    if (g->closing) {
        pthread_mutex_unlock(&g->mu);
        return 1;
    }
    MHD_suspend_connection(c->mhd);
    if (c->woken) { /* the wake came first: resume at once (libmicrohttpd allows a resume right after a suspend) */
        c->woken = 0;
        MHD_resume_connection(c->mhd);
    } else {
        c->call = call;
        push_parked(g, c);
    }
    pthread_mutex_unlock(&g->mu);
    return 0;
}

void http_guard_wake(void *ctx) {
    http_conn *c = ctx;
    http_guard *g = c->g;
    pthread_mutex_lock(&g->mu);
    if (c->list == LIST_PARKED) {
        unlink_conn(g, c);
        c->call = NULL;
        MHD_resume_connection(c->mhd);
    } else {
        c->woken = 1;
    }
    pthread_mutex_unlock(&g->mu);
}

void http_guard_stop(http_guard *g, double seconds) {
    const double end = k3c_now() + seconds;
    pthread_mutex_lock(&g->mu);
    g->closing = 1;
    while (g->n_open > g->n_waiting && k3c_now() < end) { /* answers in flight: parked or sending */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += SWEEP_NS;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    while (g->parked) { /* a call that did not end in time: its connection closes unanswered */
        http_conn *c = g->parked;
        unlink_conn(g, c);
        c->call = NULL;
        MHD_resume_connection(c->mhd);
    }
    pthread_mutex_unlock(&g->mu);
}

void http_guard_stats(http_guard *g, k3c_conn_stats *st) {
    pthread_mutex_lock(&g->mu);
    *st = (k3c_conn_stats){g->n_open, g->n_parked, g->timed_out, g->over_limit};
    pthread_mutex_unlock(&g->mu);
}
