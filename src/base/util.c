/* util.c — threads, monotonic time, progress bar, atomic file writes (docs/CODE.md "base"). */
#include "base/base.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

int k3c_num_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

void k3c_set_num_threads(int n) {
#ifdef _OPENMP
    if (n > 0) omp_set_num_threads(n);
#else
    (void)n;
#endif
}

double k3c_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void k3c_progress_init(k3c_progress *p, const char *label, int64_t total, const char *unit_name, FILE *out, int force) {
    memset(p, 0, sizeof *p);
    snprintf(p->label, sizeof p->label, "%s", label);
    p->total = total;
    p->unit_name = unit_name ? unit_name : "it";
    p->out = out ? out : stderr;
    p->enabled = force || isatty(fileno(p->out));
    p->t0 = k3c_now();
}

static void fmt_hms(double s, char *buf, size_t n) {
    if (!(s >= 0) || s > 1e7) {
        snprintf(buf, n, "--:--:--");
        return;
    }
    long t = (long)(s + 0.5);
    snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

int k3c_progress_line(const k3c_progress *p, const char *extra, char *buf, size_t n) {
    double el = k3c_now() - p->t0;
    double rate = el > 0 ? p->units / el : 0;
    char eta[32];
    fmt_hms(p->done > 0 && p->total > 0 ? el * (double)(p->total - p->done) / (double)p->done : -1, eta, sizeof eta);
    char bar[21];
    int fill = p->total > 0 ? (int)(20 * p->done / p->total) : 0;
    for (int i = 0; i < 20; i++) bar[i] = i < fill ? '#' : '.';
    bar[20] = 0;
    return snprintf(buf, n, "%s [%s] %lld/%lld %.1f %s/s ETA %s%s%s", p->label, bar, (long long)p->done,
                    (long long)p->total, rate, p->unit_name, eta, extra && *extra ? " | " : "", extra ? extra : "");
}

void k3c_progress_update(k3c_progress *p, int64_t done, double units, const char *extra) {
    p->done = done;
    p->units += units;
    if (!p->enabled) return;
    double now = k3c_now();
    if (now - p->last_draw < 0.1 && done < p->total) return;
    p->last_draw = now;
    char line[512];
    k3c_progress_line(p, extra, line, sizeof line);
    fprintf(p->out, "\r%s\033[K", line);
    fflush(p->out);
}

void k3c_progress_finish(k3c_progress *p, const char *extra) {
    if (!p->enabled) return;
    char line[512];
    k3c_progress_line(p, extra, line, sizeof line);
    fprintf(p->out, "\r%s\033[K\n", line);
    fflush(p->out);
}

int k3c_write_file_atomic(const char *path, const void *data, size_t n, k3c_err *err) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return k3c_errf(err, K3C_EINVAL, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return k3c_errf(err, K3C_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    const unsigned char *p = data;
    size_t left = n;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            unlink(tmp);
            return k3c_errf(err, K3C_EIO, "%s: write failed: %s", tmp, strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        unlink(tmp);
        return k3c_errf(err, K3C_EIO, "%s: fsync/close failed: %s", tmp, strerror(errno));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return k3c_errf(err, K3C_EIO, "%s: rename failed: %s", path, strerror(e));
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return K3C_OK;
}

int k3c_read_file(const char *path, char **data, size_t *n, k3c_err *err) {
    *data = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return k3c_errf(err, K3C_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return k3c_errf(err, K3C_EIO, "%s: not a regular file", path);
    }
    size_t size = (size_t)st.st_size;
    char *buf = malloc(size + 1);
    if (!buf) {
        fclose(f);
        return k3c_errf(err, K3C_ENOMEM, "%s: cannot allocate %zu bytes", path, size);
    }
    size_t got = fread(buf, 1, size, f);
    fclose(f);
    if (got != size) {
        free(buf);
        return k3c_errf(err, K3C_EIO, "%s: short read", path);
    }
    buf[size] = 0;
    *data = buf;
    if (n) *n = size;
    return K3C_OK;
}
