/* fuzz.h — shared helpers of the libFuzzer targets in fuzz/: a private scratch directory and writing the fuzzer's
 * buffer to a file there for the readers that only take a path. */
#ifndef K3C_FUZZ_H
#define K3C_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A directory of this process's own (created once, e.g. /tmp/k3c_fuzz_XXXXXX). */
static inline const char *fuzz_dir(void) {
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/k3c_fuzz_XXXXXX");
        if (!mkdtemp(dir)) abort();
    }
    return dir;
}

/* Writes data[0..n) to fuzz_dir()/name and returns that path (static storage, one per name slot). */
static inline const char *fuzz_file(const char *name, const void *data, size_t n) {
    static char path[8][256];
    static int next;
    char *p = path[next++ & 7];
    snprintf(p, 256, "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(p, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n)) abort();
    fclose(f);
    return p;
}

#endif
