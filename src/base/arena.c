/* arena.c — workspaces: one 64-byte-aligned block, bump allocation, marks and peak tracking (docs/CODE.md "memory"). */
#include "base/base.h"

#include <stdlib.h>
#include <string.h>

#define ALIGN 64

void *k3c_aligned_alloc(size_t bytes) {
    size_t n = (bytes + ALIGN - 1) / ALIGN * ALIGN;
    void *p = aligned_alloc(ALIGN, n ? n : ALIGN);
    if (p) memset(p, 0, n ? n : ALIGN);
    return p;
}

void k3c_aligned_free(void *p) { free(p); }

int k3c_arena_init(k3c_arena *a, size_t cap, k3c_err *err) {
    memset(a, 0, sizeof *a);
    cap = (cap + ALIGN - 1) / ALIGN * ALIGN;
    a->base = aligned_alloc(ALIGN, cap ? cap : ALIGN);
    if (!a->base) return k3c_errf(err, K3C_ENOMEM, "arena: cannot allocate %zu bytes", cap);
    a->cap = cap;
    a->owns = 1;
    return K3C_OK;
}

void k3c_arena_init_from(k3c_arena *a, void *mem, size_t cap) {
    memset(a, 0, sizeof *a);
    a->base = mem;
    a->cap = cap;
}

void *k3c_arena_alloc(k3c_arena *a, size_t bytes) {
    size_t start = (a->used + ALIGN - 1) / ALIGN * ALIGN;
    if (start > a->cap || bytes > a->cap - start) return NULL;
    a->used = start + bytes;
    if (a->used > a->peak) a->peak = a->used;
    return a->base + start;
}

void *k3c_arena_calloc(k3c_arena *a, size_t bytes) {
    void *p = k3c_arena_alloc(a, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

size_t k3c_arena_mark(const k3c_arena *a) { return a->used; }
void k3c_arena_reset(k3c_arena *a, size_t mark) {
    if (mark <= a->used) a->used = mark;
}

void k3c_arena_free(k3c_arena *a) {
    if (a->owns) free(a->base);
    memset(a, 0, sizeof *a);
}
