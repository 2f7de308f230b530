/* test_serve_hostile.c — `k3c serve` under hostile load, on loopback only: 1,000 idle and half-open connections from one
 * address (127.0.0.2) while another client (127.0.0.1) must be answered within 1 s, with no thread spent per
 * connection; the over-limit connections answered 503 with Retry-After; the idle ones closed at the request deadline,
 * not before; a slow body upload cut at that deadline; a burst of 200 concurrent streams with random hang-ups; then
 * every slot and connection free, resident memory near its baseline, as many threads as before. A second server checks
 * the generation and queue time limits (OpenAI error bodies, error events in streams). docs/SERVING.md §7. */
#include "serve_fixture.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#define N_IDLE 1000
#define PER_IP 512 /* the flood's first 512 connections are within the per-address limit, the rest over it */
#define DEADLINE 3 /* --request-timeout */
#define N_BURST 200
#define N_LIMITED 12 /* sent together to the time-limited server */
#define N_EXTRA 40   /* more from the flood's address: 2 × PER_IP - N_IDLE of them still fit, the rest are refused */

#define TEST_LIMIT_S 150 /* the whole test, whatever happens: a hung server fails it instead of hanging it */

static volatile pid_t g_server = -1; /* the server running now, for the alarm */

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL test_serve_hostile: still running after the time limit; server killed\n";
    if (write(1, msg, sizeof msg - 1) < 0) _exit(2);
    if (g_server > 0) kill(g_server, SIGKILL);
    _exit(1);
}

/* serve_start, the alarm told which server to kill. */
static serve_proc start(const char *dir, const char *const *flags) {
    serve_proc sv = serve_start(dir, flags);
    g_server = sv.pid;
    return sv;
}

static void stop(serve_proc *sv) {
    serve_stop(sv);
    g_server = -1;
}

static int n_threads(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

static long rss_kb(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = atol(line + 6);
    if (f) fclose(f);
    return kb;
}

/* A connection from a chosen loopback address (127.0.0.0/8 is all loopback on Linux). */
static int connect_from(int port, const char *src) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET}, b = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, src, &a.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &b.sin_addr);
    if (fd >= 0 && (bind(fd, (struct sockaddr *)&a, sizeof a) || connect(fd, (struct sockaddr *)&b, sizeof b))) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Waits until a metric reaches at least (want >= 0) or at most (-want) the given value; returns the last value. */
static double wait_metric(int port, const char *series, double value, int at_least, double seconds) {
    double v = -1;
    for (double t0 = k3c_now(); k3c_now() - t0 < seconds; usleep(20 * 1000)) {
        v = metric(port, series);
        if (v >= 0 && (at_least ? v >= value : v <= value)) break;
    }
    return v;
}

/* ---------------------------------------------------------------- idle connections */

#define HALF_HEADER "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"

static void idle_flood(const serve_proc *sv, int threads0) {
    static int fds[N_IDLE];
    int opened = 0;
    const double t_open = k3c_now();
    for (int i = 0; i < N_IDLE; i++) {
        fds[i] = connect_from(sv->port, "127.0.0.2");
        opened += fds[i] >= 0;
        if (fds[i] >= 0 && i % 2) send(fds[i], HALF_HEADER, strlen(HALF_HEADER), MSG_NOSIGNAL); /* and then nothing */
    }
    CHECK(opened == N_IDLE, "opened %d of %d idle connections", opened, N_IDLE);
    double conns = wait_metric(sv->port, "\nk3c_connections ", N_IDLE, 1, 2.0);
    CHECK(conns >= N_IDLE, "the server holds the %d idle connections (%g open)", N_IDLE, conns);
    /* beyond twice the per-address limit the address's connections are refused at accept */
    int extra[N_EXTRA], refused = 0;
    for (int i = 0; i < N_EXTRA; i++) extra[i] = connect_from(sv->port, "127.0.0.2");
    for (double t = k3c_now(); k3c_now() - t < 1.0 && refused < N_EXTRA - (2 * PER_IP - N_IDLE);) {
        refused = 0;
        for (int i = 0; i < N_EXTRA; i++) {
            struct pollfd q = {.fd = extra[i], .events = POLLIN};
            char b;
            refused += extra[i] < 0 || (poll(&q, 1, 0) > 0 && recv(extra[i], &b, 1, MSG_PEEK) <= 0);
        }
        usleep(20 * 1000);
    }
    for (int i = 0; i < N_EXTRA; i++)
        if (extra[i] >= 0) close(extra[i]);
    CHECK(refused == N_EXTRA - (2 * PER_IP - N_IDLE), "%d more connections: %d refused at accept (want %d)", N_EXTRA,
          refused, N_EXTRA - (2 * PER_IP - N_IDLE));
    /* another client is served at once */
    double worst = 0;
    int ok = 0;
    for (int i = 0; i < 5; i++) {
        http_resp r;
        const double t = k3c_now();
        int rc = http_do(sv->port, "POST", "/tokenize", NULL, "{\"prompt\":\"Hello world\"}", &r);
        const double dt = k3c_now() - t;
        ok += rc == 0 && r.status == 200 && strstr(r.body, "\"tokens\"") != NULL;
        worst = dt > worst ? dt : worst;
        http_resp_free(&r);
    }
    http_resp r;
    const double t = k3c_now();
    int rc =
        http_do(sv->port, "POST", "/v1/completions", NULL, "{\"prompt\":\"Hi\",\"max_tokens\":4,\"stream\":true}", &r);
    const double dt_stream = k3c_now() - t;
    CHECK(rc == 0 && r.status == 200 && strstr(r.body, "[DONE]"), "a stream amid the idle connections: %d", r.status);
    http_resp_free(&r);
    CHECK(ok == 5 && worst < 1.0 && dt_stream < 1.0,
          "another client amid %d idle connections: %d/5 answered, slowest %.3f s, a stream in %.3f s", N_IDLE, ok,
          worst, dt_stream);
    printf("  amid %d idle connections: slowest of 5 answers %.3f s, a stream %.3f s\n", N_IDLE, worst, dt_stream);
    const int threads = n_threads(sv->pid);
    CHECK(threads <= threads0 + 1, "no thread per connection: %d threads with %d idle connections, %d before", threads,
          N_IDLE, threads0);
    /* one of the flood's connections beyond the per-address limit asks something: 503 + Retry-After */
    const int last = N_IDLE - 2; /* an even index: nothing sent on it yet */
    rc = http_send(fds[last], "POST", "/tokenize", NULL, "{\"prompt\":\"x\"}", 14);
    if (!rc) rc = http_read(fds[last], &r);
    CHECK(rc == 0 && r.status == 503 && r.headers && strcasestr(r.headers, "\r\nRetry-After: 1") &&
              strstr(r.body, "too_many_connections"),
          "a connection over the per-address limit: %d %s", r.status, r.body ? r.body : "");
    http_resp_free(&r);
    close(fds[last]);
    fds[last] = -1;
    /* the rest are closed by the server once the request deadline passes, not before */
    int closed = 0, early = 0;
    struct pollfd *p = calloc(N_IDLE, sizeof *p);
    for (int i = 0; i < N_IDLE; i++) p[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
    while (closed < opened - 1 && k3c_now() - t_open < DEADLINE + 3) {
        if (poll(p, N_IDLE, 100) <= 0) continue;
        for (int i = 0; i < N_IDLE; i++) {
            if (p[i].fd < 0 || !p[i].revents) continue;
            char buf[256];
            ssize_t got = recv(p[i].fd, buf, sizeof buf, 0);
            if (got > 0) continue; /* nothing is sent to them: an answer would show as a failure below */
            closed++;
            early += k3c_now() - t_open < DEADLINE - 0.5;
            close(p[i].fd);
            p[i].fd = fds[i] = -1;
        }
    }
    const double t_closed = k3c_now() - t_open;
    for (int i = 0; i < N_IDLE; i++)
        if (fds[i] >= 0) close(fds[i]);
    free(p);
    CHECK(closed == opened - 1 && early == 0,
          "idle and half-open connections closed at the %d s deadline: %d of %d, %d early, last at %.2f s", DEADLINE,
          closed, opened - 1, early, t_closed);
    CHECK(metric(sv->port, "\nk3c_connections_timed_out_total ") >= N_IDLE - 1 &&
              metric(sv->port, "\nk3c_connections_over_limit_total ") >= N_IDLE - PER_IP,
          "metrics count the timed-out and over-limit connections");
}

/* A body sent a few bytes at a time: the connection is cut at the request deadline, unanswered. */
static void slow_body(const serve_proc *sv) {
    int fd = http_connect(sv->port);
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       "Content-Length: 4000\r\n\r\n{\"prompt\":\"";
    const double t0 = k3c_now();
    CHECK(fd >= 0 && send(fd, head, strlen(head), MSG_NOSIGNAL) > 0, "slow body: header sent");
    double t_end = -1;
    size_t got_bytes = 0;
    char buf[512];
    while (fd >= 0 && k3c_now() - t0 < DEADLINE + 3) {
        if (send(fd, "aaaaaaaaaa", 10, MSG_NOSIGNAL) != 10) {
            t_end = k3c_now() - t0;
            break;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 250) > 0) {
            ssize_t g = recv(fd, buf, sizeof buf, 0);
            if (g <= 0) {
                t_end = k3c_now() - t0;
                break;
            }
            got_bytes += (size_t)g;
        }
    }
    if (fd >= 0) close(fd);
    CHECK(t_end >= DEADLINE - 0.5 && t_end < DEADLINE + 1.5 && got_bytes == 0,
          "a slow upload is cut at the %d s deadline (after %.2f s, %zu bytes answered)", DEADLINE, t_end, got_bytes);
}

/* ---------------------------------------------------------------- a burst of streams */

typedef struct {
    int fd, mode; /* 0: hangs up at once, 1: after the first bytes, else reads to the end */
    k3c_sbuf got;
} burst_client;

static void burst(const serve_proc *sv) {
    static burst_client c[N_BURST];
    uint64_t rng = 12345;
    int sent = 0;
    for (int i = 0; i < N_BURST; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        c[i].mode = (int)(rng >> 33) % 4;
        k3c_sbuf_init(&c[i].got);
        char body[160];
        snprintf(body, sizeof body, "{\"prompt\":\"The weather in\",\"max_tokens\":12,\"seed\":%d,\"stream\":true}", i);
        c[i].fd = http_connect(sv->port);
        sent += c[i].fd >= 0 && http_send(c[i].fd, "POST", "/v1/completions", NULL, body, strlen(body)) == 0;
        if (c[i].mode == 0 && c[i].fd >= 0) close(c[i].fd), c[i].fd = -1;
    }
    CHECK(sent == N_BURST, "burst: %d of %d requests sent", sent, N_BURST);
    struct pollfd p[N_BURST];
    int open = 0;
    for (int i = 0; i < N_BURST; i++) open += c[i].fd >= 0;
    const double t0 = k3c_now();
    while (open > 0 && k3c_now() - t0 < 40) {
        for (int i = 0; i < N_BURST; i++) p[i] = (struct pollfd){.fd = c[i].fd, .events = POLLIN};
        if (poll(p, N_BURST, 200) <= 0) continue;
        for (int i = 0; i < N_BURST; i++) {
            if (c[i].fd < 0 || !p[i].revents) continue;
            char buf[8192];
            ssize_t g = recv(c[i].fd, buf, sizeof buf, 0);
            if (g > 0) k3c_sbuf_append(&c[i].got, buf, (size_t)g);
            if (g <= 0 || c[i].mode == 1) {
                close(c[i].fd);
                c[i].fd = -1;
                open--;
            }
        }
    }
    int readers = 0, complete = 0;
    for (int i = 0; i < N_BURST; i++) {
        if (c[i].fd >= 0) close(c[i].fd);
        if (c[i].mode >= 2) {
            readers++;
            const char *b = c[i].got.buf ? c[i].got.buf : "";
            complete += !strncmp(b, "HTTP/1.1 200", 12) && strstr(b, "\"finish_reason\":\"") &&
                        strstr(b, "data: [DONE]") && !strstr(b, "\"error\"");
        }
        k3c_sbuf_free(&c[i].got);
    }
    CHECK(open == 0 && complete == readers, "burst: %d of %d streams read to the end completed (%d still open)",
          complete, readers, open);
}

/* Every slot, queue place and connection free again (the one asking the metrics aside). */
static void all_free(const serve_proc *sv) {
    double running = wait_metric(sv->port, "\nk3c_running ", 0, 0, 10),
           queued = wait_metric(sv->port, "\nk3c_queue_length ", 0, 0, 10),
           parked = wait_metric(sv->port, "\nk3c_connections_parked ", 0, 0, 10),
           conns = wait_metric(sv->port, "\nk3c_connections ", 1, 0, 10);
    CHECK(running == 0 && queued == 0 && parked == 0 && conns == 1,
          "afterwards every slot and connection is free: running %g, queued %g, parked %g, connections %g", running,
          queued, parked, conns);
}

/* ---------------------------------------------------------------- time limits */

/* A prompt of n ids that starts differently for each salt, so no two share a cached prefix (each costs a whole
 * prefill). */
static char *long_body(int n, int stream, int salt) {
    k3c_sbuf b;
    k3c_sbuf_init(&b);
    k3c_sbuf_append(&b, "{\"prompt\":[", 11);
    for (int i = 0; i < n; i++) k3c_sbuf_printf(&b, "%s%d", i ? "," : "", 32 + (i * 37 + salt * 101) % 380);
    k3c_sbuf_printf(&b, "],\"max_tokens\":64,\"min_p\":0.0,\"seed\":1,\"stream\":%s}", stream ? "true" : "false");
    return b.buf;
}

/* SIGTERM with 4 answers running and 4 queued, streamed and whole: each still gets its answer, ended ("cancelled" or
 * its own finish), and the server exits cleanly. */
static void stop_in_flight(serve_proc *sv) {
    int fds[8], sent = 0;
    for (int i = 0; i < 8; i++) {
        char *b = long_body(4000, i % 2, 10 + i);
        fds[i] = http_connect(sv->port);
        sent += fds[i] >= 0 && http_send(fds[i], "POST", "/v1/completions", NULL, b, strlen(b)) == 0;
        free(b);
    }
    double queued = wait_metric(sv->port, "\nk3c_queue_length ", 4, 1, 10);
    CHECK(sent == 8 && queued >= 4, "8 in flight before SIGTERM (%d sent, %g queued)", sent, queued);
    stop(sv);
    int answered = 0;
    for (int i = 0; i < 8; i++) {
        http_resp r = {0};
        int rc = fds[i] >= 0 ? http_read(fds[i], &r) : -1;
        if (fds[i] >= 0) close(fds[i]);
        answered += rc == 0 && r.status == 200 && strstr(r.body, "\"finish_reason\":\"") &&
                    (i % 2 == 0 || strstr(r.body, "data: [DONE]"));
        http_resp_free(&r);
    }
    CHECK(answered == 8, "a graceful stop answers what was in flight: %d of 8", answered);
}

/* What a time-limited answer carries: 1 generation_timeout, 2 queue_timeout (with the right status, or as an error
 * event followed by [DONE] in a 200 stream), 0 anything else. */
static int limit_kind(const http_resp *r, int stream) {
    const char *b = r->body ? r->body : "";
    const int gen = strstr(b, "\"code\":\"generation_timeout\"") != NULL,
              queue = strstr(b, "\"code\":\"queue_timeout\"") != NULL;
    if (!strstr(b, "\"type\":\"server_error\"")) return 0;
    if (stream)
        return r->status == 200 && strstr(b, "data: {\"error\"") && strstr(b, "data: [DONE]") ? gen + 2 * queue : 0;
    if (gen) return r->status == 504;
    return queue && r->status == 503 && r->headers && strcasestr(r->headers, "\r\nRetry-After: 1") ? 2 : 0;
}

/* One slot, --gen-timeout of 1 ms: a 4,000-token prompt's first step (its prefill) outlasts it. Alone (a queue limit
 * far above the engine's admission delay, which a loaded sanitizer build stretches past 1 ms), a request ends at the
 * generation limit (504, or an error event). With --queue-timeout 1 ms too, of 12 sent together each ends at one of
 * the limits, and those queued behind another's first step at the queue limit (503 with Retry-After, or an error
 * event). */
static void time_limits(const char *dir) {
    const char *alone[] = {"--slots", "1", "--max-tokens-cap", "64", "--gen-timeout", "0.001", "--queue-timeout",
                           "30",      NULL};
    const char *flags[] = {"--slots", "1", "--max-tokens-cap", "64", "--gen-timeout", "0.001", "--queue-timeout",
                           "0.001",   NULL};
    serve_proc sv = start(dir, alone);
    if (!sv.port) return;
    for (int stream = 0; stream < 2; stream++) {
        char *b = long_body(4000, stream, 1 + stream);
        http_resp r;
        int rc = http_do(sv.port, "POST", "/v1/completions", NULL, b, &r);
        CHECK(rc == 0 && limit_kind(&r, stream) == 1, "alone, %s: generation_timeout (%d %.300s)",
              stream ? "streamed" : "whole", r.status, r.body ? r.body : "");
        http_resp_free(&r);
        free(b);
    }
    stop(&sv);
    sv = start(dir, flags);
    if (!sv.port) return;
    int fds[N_LIMITED], kinds[3][2] = {{0}};
    for (int i = 0; i < N_LIMITED; i++) {
        char *b = long_body(4000, i % 2, 20 + i);
        fds[i] = http_connect(sv.port);
        if (fds[i] >= 0 && http_send(fds[i], "POST", "/v1/completions", NULL, b, strlen(b))) close(fds[i]), fds[i] = -1;
        free(b);
    }
    for (int i = 0; i < N_LIMITED; i++) {
        http_resp r = {0};
        if (fds[i] >= 0 && http_read(fds[i], &r) == 0) kinds[limit_kind(&r, i % 2)][i % 2]++;
        if (fds[i] >= 0) close(fds[i]);
        http_resp_free(&r);
    }
    CHECK(kinds[0][0] + kinds[0][1] == 0 && kinds[1][0] + kinds[1][1] >= 1 && kinds[2][0] + kinds[2][1] >= 1,
          "%d together: %d whole / %d streamed past the generation limit, %d / %d past the queue limit, %d / %d other",
          N_LIMITED, kinds[1][0], kinds[1][1], kinds[2][0], kinds[2][1], kinds[0][0], kinds[0][1]);
    printf("  time limits, %d together: generation %d + %d, queue %d + %d (whole + streamed)\n", N_LIMITED, kinds[1][0],
           kinds[1][1], kinds[2][0], kinds[2][1]);
    stop(&sv);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    signal(SIGALRM, on_alarm);
    alarm(TEST_LIMIT_S);
    struct rlimit rl; /* the flood needs a descriptor per connection */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur >= N_IDLE + 256, "open files limit %llu",
          (unsigned long long)rl.rlim_cur);
#ifdef __SANITIZE_ADDRESS__
    /* ASan keeps freed memory in quarantine (256 MB) to catch late uses, which reads as growth in the resident memory
     * checks: the servers (which inherit this) reuse freed memory at once (leaks and bad accesses are still caught) */
    char opts[1024];
    snprintf(opts, sizeof opts, "%s%squarantine_size_mb=0:thread_local_quarantine_size_kb=0",
             getenv("ASAN_OPTIONS") ? getenv("ASAN_OPTIONS") : "", getenv("ASAN_OPTIONS") ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
#endif
    const char *dir = test_tmpdir("serve_hostile");
    if (serve_model_dir(dir) != 0) return test_summary();
    char per_ip[16], deadline[16];
    snprintf(per_ip, sizeof per_ip, "%d", PER_IP);
    snprintf(deadline, sizeof deadline, "%d", DEADLINE);
    const char *flags[] = {"--slots",           "4",      "--queue",   "256", "--max-tokens-cap",   "16",
                           "--max-conns",       "2000",   "--threads", "2",   "--max-conns-per-ip", per_ip,
                           "--request-timeout", deadline, NULL};
    serve_proc sv = start(dir, flags);
    if (sv.port) {
        http_resp r; /* warm up: the allocator and the engine's first steps */
        for (int i = 0; i < 4; i++) {
            http_do(sv.port, "POST", "/v1/completions", NULL, "{\"prompt\":\"Hi\",\"max_tokens\":8,\"stream\":true}",
                    &r);
            http_resp_free(&r);
        }
        const int threads0 = n_threads(sv.pid);
        const long rss0 = rss_kb(sv.pid);
        const double t0 = k3c_now();
        idle_flood(&sv, threads0);
        slow_body(&sv);
        burst(&sv);
        all_free(&sv);
        const long rss1 = rss_kb(sv.pid);
        burst(&sv); /* again: memory a request left behind would grow with it */
        all_free(&sv);
        const int threads1 = n_threads(sv.pid);
        const long rss2 = rss_kb(sv.pid);
        CHECK(threads1 == threads0, "threads %d before, %d after", threads0, threads1);
        CHECK(rss0 > 0 && rss1 - rss0 < 32 * 1024 && rss2 - rss1 < 8 * 1024,
              "resident memory %ld kB before, %ld kB after the load, %ld kB after another burst", rss0, rss1, rss2);
        printf("  hostile load: %.1f s, threads %d, resident %ld -> %ld -> %ld kB\n", k3c_now() - t0, threads0, rss0,
               rss1, rss2);
        stop_in_flight(&sv);
    }
    stop(&sv);
    time_limits(dir);
    return test_summary();
}
