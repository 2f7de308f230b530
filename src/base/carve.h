/* carve.h — the one measure-then-carve allocator: a buffer plan runs twice, first over a measuring carver (base NULL:
 * it only adds up aligned sizes), then over the block of that size; every piece keeps the plan's alignment. */
#ifndef K3C_BASE_CARVE_H
#define K3C_BASE_CARVE_H

#include <stddef.h>

typedef struct {
    unsigned char *base; /* NULL: measure only */
    size_t off;          /* bytes planned so far (a multiple of align) */
    size_t cap;          /* bytes at base (ignored when measuring) */
    size_t align;        /* a power of two; 0 means 64 */
    int oom;             /* set when a piece did not fit in cap */
} k3c_carver;

static inline k3c_carver k3c_carver_measure(size_t align) {
    k3c_carver c = {NULL, 0, 0, align ? align : 64, 0};
    return c;
}

static inline k3c_carver k3c_carver_at(void *base, size_t cap, size_t align) {
    k3c_carver c = {(unsigned char *)base, 0, cap, align ? align : 64, 0};
    return c;
}

/* The next piece of `bytes` (NULL when measuring or out of room; out of room also sets oom). */
static inline void *k3c_carve(k3c_carver *c, size_t bytes) {
    size_t a = c->align ? c->align : 64, start = c->off, n = (bytes + a - 1) & ~(a - 1);
    c->off += n;
    if (!c->base) return NULL;
    if (start > c->cap || n > c->cap - start) {
        c->oom = 1;
        return NULL;
    }
    return c->base + start;
}

#define K3C_CARVE(c, type, count) ((type *)k3c_carve((c), (size_t)(count) * sizeof(type)))

#endif
