/* mem.c — the memory a machine has left for a new allocation, and the check commands make against it before they
 * allocate what a file asks for (docs/CODE.md "Errors": bad input fails fast with a clear message, never an OOM kill). */
#include "base/base.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

uint64_t k3c_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    if (f) fclose(f);
    if (found) return (uint64_t)kb * 1024u;
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : UINT64_MAX; /* unknown: do not refuse */
}

int k3c_mem_check(uint64_t bytes, const char *what, k3c_err *err) {
    uint64_t have = k3c_mem_available();
    if (bytes <= have) return K3C_OK;
    return k3c_errf(err, K3C_ENOMEM, "%s needs %.3g GiB of memory but the machine has %.3g GiB available", what,
                    (double)bytes / (1u << 30), (double)have / (1u << 30));
}
