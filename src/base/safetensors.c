/* safetensors.c — the validating mmap reader, sharded checkpoint directories (index.json + shards) and the atomic
 * streaming writer for the safetensors format (docs/FORMATS.md §1.2; rules of the official huggingface/safetensors). */
#include "base/json.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER 100000000ull /* the official library's limit on the JSON header */

/* ------------------------------------------------------------------ name → index hash table
 * Open addressing over caller-owned entries (names are read back through a callback), so the same table serves a
 * file's tensors, a checkpoint's tensor pointers, shard names and the writer's duplicate check. */
typedef const char *(*name_fn)(const void *ctx, int i);
typedef struct {
    size_t mask;
    int *slot; /* entry index + 1; 0 = empty */
    name_fn name;
    const void *ctx;
} name_index;

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int nidx_init(name_index *ix, int n, name_fn name, const void *ctx) {
    size_t cap = 16;
    while (cap < 2 * (size_t)n) cap *= 2;
    ix->slot = calloc(cap, sizeof *ix->slot);
    ix->mask = cap - 1;
    ix->name = name;
    ix->ctx = ctx;
    return ix->slot ? 0 : -1;
}

static void nidx_free(name_index *ix) {
    free(ix->slot);
    ix->slot = NULL;
}

/* Index of the entry called `key`, or -1; *hole receives the slot where it would be inserted. */
static int nidx_lookup(const name_index *ix, const char *key, size_t *hole) {
    size_t h = (size_t)fnv1a(key) & ix->mask;
    for (; ix->slot[h]; h = (h + 1) & ix->mask) {
        int j = ix->slot[h] - 1;
        if (strcmp(ix->name(ix->ctx, j), key) == 0) return j;
    }
    if (hole) *hole = h;
    return -1;
}

static int nidx_get(const name_index *ix, const char *key) { return ix->slot ? nidx_lookup(ix, key, NULL) : -1; }

/* Inserts entry i; returns the index of an earlier entry with the same name instead (nothing inserted), else -1. */
static int nidx_put(name_index *ix, int i) {
    size_t hole;
    int j = nidx_lookup(ix, ix->name(ix->ctx, i), &hole);
    if (j < 0) ix->slot[hole] = i + 1;
    return j;
}

/* ------------------------------------------------------------------ one file */

struct k3c_safetensors {
    char *path;
    unsigned char *map;
    size_t size;
    int n, nmeta;
    k3c_st_tensor *t;
    uint64_t *begin; /* data_offsets[0] per tensor, for the tiling check */
    char **meta;     /* nmeta key, value pairs */
    char *strings;   /* one block holding tensor names and metadata */
    name_index idx;
};

static const char *st_name_at(const void *ctx, int i) { return ((const k3c_safetensors *)ctx)->t[i].name; }

static int64_t shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

/* A JSON number that is an exact non-negative integer literal. */
static int json_uint(const k3c_json *v, uint64_t *out) {
    if (!v || v->type != K3C_JSON_NUMBER || !v->is_integer || v->integer < 0) return 0;
    *out = (uint64_t)v->integer;
    return 1;
}

/* Fills ndim/shape and the byte size; returns 0 or which rule failed: 1 not an array, 2 too many dims,
 * 3 an entry is not a non-negative integer, 4 overflow. */
static int parse_shape(const k3c_json *s, k3c_st_tensor *t, uint64_t *bytes) {
    if (s->type != K3C_JSON_ARRAY) return 1;
    if (s->n > K3C_MAX_DIMS) return 2;
    uint64_t numel = 1;
    t->ndim = (int)s->n;
    for (size_t d = 0; d < s->n; d++) {
        uint64_t x;
        if (!json_uint(&s->items[d], &x)) return 3;
        t->shape[d] = (int64_t)x;
        if (__builtin_mul_overflow(numel, x, &numel) || numel > (uint64_t)INT64_MAX) return 4;
    }
    return __builtin_mul_overflow(numel, (uint64_t)k3c_dtype_size(t->dtype), bytes) ? 4 : 0;
}

/* Validates one tensor entry `name: {dtype, shape, data_offsets}` against the data region of `data_size` bytes. */
static int parse_entry(k3c_safetensors *st, const char *name, const k3c_json *e, size_t data_size, k3c_st_tensor *t,
                       uint64_t *begin_out, k3c_err *err) {
    const char *p = st->path;
    if (e->type != K3C_JSON_OBJECT)
        return k3c_errf(err, K3C_EFORMAT, "%s: tensor '%s': entry is not a JSON object", p, name);
    for (size_t i = 0; i < e->n; i++)
        if (strcmp(e->keys[i], "dtype") && strcmp(e->keys[i], "shape") && strcmp(e->keys[i], "data_offsets"))
            return k3c_errf(err, K3C_EFORMAT, "%s: tensor '%s': unexpected field '%s'", p, name, e->keys[i]);
    static const char *need[] = {"dtype", "shape", "data_offsets"};
    for (int i = 0; i < 3; i++)
        if (!k3c_json_get(e, need[i]))
            return k3c_errf(err, K3C_EFORMAT, "%s: tensor '%s': missing %s", p, name, need[i]);
    const k3c_json *dt = k3c_json_get(e, "dtype"), *sh = k3c_json_get(e, "shape"),
                   *off = k3c_json_get(e, "data_offsets");
    if (dt->type != K3C_JSON_STRING)
        return k3c_errf(err, K3C_EFORMAT, "%s: tensor '%s': dtype is not a string", p, name);
    if (k3c_dtype_parse(dt->string, &t->dtype) != K3C_OK)
        return k3c_errf(err, K3C_EUNSUPPORTED, "%s: tensor '%s': unknown or unsupported dtype '%.40s'", p, name,
                        dt->string);
    uint64_t bytes = 0;
    switch (parse_shape(sh, t, &bytes)) {
    case 1: return k3c_errf(err, K3C_EFORMAT, "%s: tensor '%s': shape is not an array", p, name);
    case 2:
        return k3c_errf(err, K3C_EFORMAT, "%s: tensor '%s': shape has %zu dims (max %d)", p, name, sh->n, K3C_MAX_DIMS);
    case 3: return k3c_errf(err, K3C_EFORMAT, "%s: tensor '%s': shape entries must be non-negative integers", p, name);
    case 4: return k3c_errf(err, K3C_EFORMAT, "%s: tensor '%s': shape overflows 64 bits", p, name);
    default: break;
    }
    uint64_t b, en;
    if (off->type != K3C_JSON_ARRAY || off->n != 2 || !json_uint(&off->items[0], &b) || !json_uint(&off->items[1], &en))
        return k3c_errf(err, K3C_EFORMAT, "%s: tensor '%s': data_offsets must be two non-negative integers", p, name);
    if (b > en)
        return k3c_errf(err, K3C_EFORMAT, "%s: tensor '%s': data_offsets begin %llu > end %llu", p, name,
                        (unsigned long long)b, (unsigned long long)en);
    if (en > data_size)
        return k3c_errf(err, K3C_EFORMAT,
                        "%s: tensor '%s': data_offsets [%llu, %llu) out of range (data region is %zu bytes)", p, name,
                        (unsigned long long)b, (unsigned long long)en, data_size);
    if (en - b != bytes)
        return k3c_errf(err, K3C_EFORMAT,
                        "%s: tensor '%s': data_offsets span %llu bytes but %s x %lld elements need %llu", p, name,
                        (unsigned long long)(en - b), k3c_dtype_name(t->dtype),
                        (long long)shape_numel(t->ndim, t->shape), (unsigned long long)bytes);
    t->nbytes = (size_t)bytes;
    *begin_out = b;
    return K3C_OK;
}

static int parse_metadata(k3c_safetensors *st, const k3c_json *m, char **cursor, k3c_err *err) {
    if (m->type != K3C_JSON_OBJECT)
        return k3c_errf(err, K3C_EFORMAT, "%s: __metadata__ is not a JSON object", st->path);
    st->meta = calloc(2 * m->n + 1, sizeof *st->meta);
    if (!st->meta) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", st->path);
    for (size_t i = 0; i < m->n; i++) {
        if (m->items[i].type != K3C_JSON_STRING)
            return k3c_errf(err, K3C_EFORMAT, "%s: __metadata__ value of '%s' is not a string", st->path, m->keys[i]);
        st->meta[2 * i] = strcpy(*cursor, m->keys[i]);
        *cursor += strlen(m->keys[i]) + 1;
        st->meta[2 * i + 1] = strcpy(*cursor, m->items[i].string);
        *cursor += strlen(m->items[i].string) + 1;
    }
    st->nmeta = (int)m->n;
    return K3C_OK;
}

/* Bytes needed to copy every key (and metadata value) out of the header. */
static size_t strings_size(const k3c_json *h) {
    size_t sum = 0;
    for (size_t i = 0; i < h->n; i++) {
        sum += strlen(h->keys[i]) + 1;
        const k3c_json *m = &h->items[i];
        if (strcmp(h->keys[i], "__metadata__") == 0 && m->type == K3C_JSON_OBJECT)
            for (size_t j = 0; j < m->n; j++)
                sum +=
                    strlen(m->keys[j]) + 1 + (m->items[j].type == K3C_JSON_STRING ? strlen(m->items[j].string) + 1 : 0);
    }
    return sum;
}

static int cmp_by_begin(const void *a, const void *b, void *ctx) {
    const k3c_safetensors *st = ctx;
    int i = *(const int *)a, j = *(const int *)b;
    if (st->begin[i] != st->begin[j]) return st->begin[i] < st->begin[j] ? -1 : 1;
    uint64_t ei = st->begin[i] + st->t[i].nbytes, ej = st->begin[j] + st->t[j].nbytes;
    return ei < ej ? -1 : ei > ej ? 1 : 0;
}

/* Like the official library: the tensors, sorted by offset, must tile [0, data_size) exactly — no overlap, no hole. */
static int check_tiling(k3c_safetensors *st, size_t data_size, k3c_err *err) {
    int *order = malloc(((size_t)st->n + 1) * sizeof *order);
    if (!order) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", st->path);
    for (int i = 0; i < st->n; i++) order[i] = i;
    qsort_r(order, (size_t)st->n, sizeof *order, cmp_by_begin, st);
    uint64_t at = 0;
    int prev = -1, rc = K3C_OK;
    for (int k = 0; k < st->n && rc == K3C_OK; k++) {
        int i = order[k];
        const char *pn = prev >= 0 ? st->t[prev].name : "(start of data)";
        if (st->begin[i] < at)
            rc = k3c_errf(err, K3C_EFORMAT, "%s: tensors '%s' and '%s' overlap (byte %llu of the data region)",
                          st->path, pn, st->t[i].name, (unsigned long long)st->begin[i]);
        else if (st->begin[i] > at)
            rc = k3c_errf(err, K3C_EFORMAT,
                          "%s: hole in the data region: bytes [%llu, %llu) between '%s' and '%s' belong to no tensor",
                          st->path, (unsigned long long)at, (unsigned long long)st->begin[i], pn, st->t[i].name);
        at = st->begin[i] + st->t[i].nbytes;
        prev = i;
    }
    if (rc == K3C_OK && at != data_size)
        rc = k3c_errf(err, K3C_EFORMAT,
                      "%s: tensors end at byte %llu of a %zu-byte data region (trailing bytes belong to no tensor)",
                      st->path, (unsigned long long)at, data_size);
    free(order);
    return rc;
}

static int parse_header(k3c_safetensors *st, const k3c_json *h, size_t hdr_end, k3c_err *err) {
    size_t data_size = st->size - hdr_end;
    if (h->type != K3C_JSON_OBJECT) return k3c_errf(err, K3C_EFORMAT, "%s: header is not a JSON object", st->path);
    int rc;
    st->strings = malloc(strings_size(h) + 1);
    st->t = calloc(h->n + 1, sizeof *st->t);
    st->begin = calloc(h->n + 1, sizeof *st->begin);
    if (!st->strings || !st->t || !st->begin || h->n > (size_t)INT32_MAX - 1 ||
        nidx_init(&st->idx, (int)h->n, st_name_at, st))
        return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", st->path);
    char *cursor = st->strings;
    for (size_t i = 0; i < h->n; i++) {
        const char *name = h->keys[i];
        if (strcmp(name, "__metadata__") == 0) {
            if ((rc = parse_metadata(st, &h->items[i], &cursor, err))) return rc;
            continue;
        }
        k3c_st_tensor *t = &st->t[st->n];
        if ((rc = parse_entry(st, name, &h->items[i], data_size, t, &st->begin[st->n], err))) return rc;
        t->name = strcpy(cursor, name);
        cursor += strlen(name) + 1;
        t->data = st->map + hdr_end + st->begin[st->n];
        t->file = st->path;
        /* The JSON parser rejects duplicate keys; names can still collide here when one holds \u0000 (C strings end). */
        if (nidx_put(&st->idx, st->n) >= 0)
            return k3c_errf(err, K3C_EFORMAT, "%s: tensor '%s': duplicate name (after an embedded NUL)", st->path,
                            name);
        st->n++;
    }
    return check_tiling(st, data_size, err);
}

static int map_file(k3c_safetensors *st, k3c_err *err) {
    int fd = open(st->path, O_RDONLY);
    if (fd < 0)
        return k3c_errf(err, errno == ENOENT ? K3C_ENOTFOUND : K3C_EIO, "%s: cannot open: %s", st->path,
                        strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return k3c_errf(err, K3C_EIO, "%s: not a regular file", st->path);
    }
    st->size = (size_t)sb.st_size;
    if (st->size < 8) {
        close(fd);
        return k3c_errf(err, K3C_EFORMAT, "%s: file is %zu bytes, shorter than the 8-byte header length", st->path,
                        st->size);
    }
    void *m = mmap(NULL, st->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) return k3c_errf(err, K3C_EIO, "%s: mmap failed: %s", st->path, strerror(e));
    st->map = m;
    return K3C_OK;
}

int k3c_st_open(const char *path, k3c_safetensors **out, k3c_err *err) {
    *out = NULL;
    k3c_safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->path = strdup(path))) {
        free(st);
        return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", path);
    }
    int rc = map_file(st, err);
    if (rc == K3C_OK) {
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = hl << 8 | st->map[i]; /* little-endian u64 */
        if (hl > ST_MAX_HEADER)
            rc = k3c_errf(err, K3C_EFORMAT, "%s: header length %llu exceeds the 100 MB limit", path,
                          (unsigned long long)hl);
        else if (hl > st->size - 8)
            rc = k3c_errf(err, K3C_EFORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)", path,
                          (unsigned long long)hl, st->size);
        else {
            char name[4200];
            snprintf(name, sizeof name, "%s (header)", path);
            k3c_json *h = NULL;
            rc = k3c_json_parse((const char *)st->map + 8, (size_t)hl, name, &h, err);
            if (rc == K3C_OK) rc = parse_header(st, h, 8 + (size_t)hl, err);
            k3c_json_free(h);
        }
    }
    if (rc != K3C_OK) {
        k3c_st_close(st);
        return rc;
    }
    *out = st;
    return K3C_OK;
}

void k3c_st_close(k3c_safetensors *st) {
    if (!st) return;
    if (st->map) munmap(st->map, st->size);
    nidx_free(&st->idx);
    free(st->t);
    free(st->begin);
    free(st->meta);
    free(st->strings);
    free(st->path);
    free(st);
}

int k3c_st_count(const k3c_safetensors *st) { return st ? st->n : 0; }

const k3c_st_tensor *k3c_st_at(const k3c_safetensors *st, int i) {
    return st && i >= 0 && i < st->n ? &st->t[i] : NULL;
}

const k3c_st_tensor *k3c_st_find(const k3c_safetensors *st, const char *name) {
    if (!st || !name) return NULL;
    int i = nidx_get(&st->idx, name);
    return i >= 0 ? &st->t[i] : NULL;
}

const char *k3c_st_metadata(const k3c_safetensors *st, const char *key) {
    if (!st || !key) return NULL;
    for (int i = 0; i < st->nmeta; i++)
        if (strcmp(st->meta[2 * i], key) == 0) return st->meta[2 * i + 1];
    return NULL;
}

/* ------------------------------------------------------------------ reading as float / double */

static int check_read(const k3c_st_tensor *t, size_t n, k3c_err *err) {
    if (!t) return k3c_errf(err, K3C_EINVAL, "k3c_st_read: NULL tensor");
    if (t->dtype != K3C_F64 && t->dtype != K3C_F32 && t->dtype != K3C_BF16 && t->dtype != K3C_F16)
        return k3c_errf(err, K3C_EINVAL, "%s: tensor '%s': dtype %s is not a floating type", t->file ? t->file : "?",
                        t->name, k3c_dtype_name(t->dtype));
    int64_t numel = shape_numel(t->ndim, t->shape);
    if ((uint64_t)numel != n)
        return k3c_errf(err, K3C_EINVAL, "%s: tensor '%s': destination holds %zu elements, tensor has %lld",
                        t->file ? t->file : "?", t->name, n, (long long)numel);
    return K3C_OK;
}

/* The header length need not be a multiple of 8, so data may be misaligned: convert through an aligned bounce buffer. */
#define READ_BODY(OUT_T, CONVERT)                                                                                      \
    int rc = check_read(t, n, err);                                                                                    \
    if (rc) return rc;                                                                                                 \
    size_t es = k3c_dtype_size(t->dtype);                                                                              \
    const unsigned char *src = t->data;                                                                                \
    if (((uintptr_t)src % es) == 0) return CONVERT(t->dtype, src, dst, n);                                             \
    double bounce[512];                                                                                                \
    size_t chunk = sizeof bounce / es;                                                                                 \
    for (size_t i = 0; i < n; i += chunk) {                                                                            \
        size_t m = n - i < chunk ? n - i : chunk;                                                                      \
        memcpy(bounce, src + i * es, m * es);                                                                          \
        CONVERT(t->dtype, bounce, dst + i, m);                                                                         \
    }                                                                                                                  \
    return K3C_OK;

int k3c_st_read_f32(const k3c_st_tensor *t, float *dst, size_t n, k3c_err *err) { READ_BODY(float, k3c_convert_to_f32) }
int k3c_st_read_f64(const k3c_st_tensor *t, double *dst, size_t n, k3c_err *err) {
    READ_BODY(double, k3c_convert_to_f64)
}

int k3c_st_read_ids(const char *path, const char *name, int32_t **ids, int64_t *B, int64_t *T, k3c_err *err) {
    *ids = NULL;
    k3c_safetensors *st;
    int rc = k3c_st_open(path, &st, err);
    if (rc) return rc;
    const k3c_st_tensor *t = k3c_st_find(st, name);
    if (!t || t->dtype != K3C_I32 || t->ndim < 1 || t->ndim > 2) {
        k3c_st_close(st);
        return k3c_errf(err, K3C_EFORMAT, "%s: needs an I32 tensor '%s' of shape [B, T] or [T]", path, name);
    }
    *B = t->ndim == 2 ? t->shape[0] : 1;
    *T = t->shape[t->ndim - 1];
    *ids = malloc(t->nbytes ? t->nbytes : 4);
    if (*ids) memcpy(*ids, t->data, t->nbytes);
    k3c_st_close(st);
    return *ids ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "out of memory");
}

/* ------------------------------------------------------------------ checkpoint directories */

struct k3c_checkpoint {
    int nshards, n;
    k3c_safetensors **shards;
    const k3c_st_tensor **t; /* all tensors, shard by shard */
    name_index idx;
};

static const char *ck_name_at(const void *ctx, int i) { return ((const k3c_checkpoint *)ctx)->t[i]->name; }

/* Gathers every shard's tensors into one table; a name in two shards is an error. */
static int ckpt_index(k3c_checkpoint *c, const char *what, k3c_err *err) {
    size_t total = 0;
    for (int s = 0; s < c->nshards; s++) total += (size_t)k3c_st_count(c->shards[s]);
    if (total > (size_t)INT32_MAX / 2) return k3c_errf(err, K3C_EFORMAT, "%s: too many tensors (%zu)", what, total);
    c->t = malloc((total + 1) * sizeof *c->t);
    if (!c->t || nidx_init(&c->idx, (int)total, ck_name_at, c))
        return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", what);
    for (int s = 0; s < c->nshards; s++)
        for (int i = 0; i < k3c_st_count(c->shards[s]); i++) {
            c->t[c->n] = k3c_st_at(c->shards[s], i);
            int j = nidx_put(&c->idx, c->n);
            if (j >= 0)
                return k3c_errf(err, K3C_EFORMAT, "%s: tensor '%s' appears in both %s and %s", what, c->t[j]->name,
                                c->t[j]->file, c->t[c->n]->file);
            c->n++;
        }
    return K3C_OK;
}

static const char *wm_shard_at(const void *ctx, int i) { return ((const k3c_json *)ctx)->items[i].string; }

/* Shard file names come from the index: keep them inside the checkpoint directory. */
static int shard_name_ok(const char *s) {
    if (!*s || *s == '/') return 0;
    for (const char *p = s; *p;) {
        size_t k = strcspn(p, "/");
        if (k == 2 && p[0] == '.' && p[1] == '.') return 0;
        p += k + (p[k] == '/');
    }
    return 1;
}

/* Opens each distinct shard of weight_map once (first-appearance order); shard_of[i] = shard of map entry i. */
static int open_shards(k3c_checkpoint *c, const char *dir, const char *ipath, const k3c_json *wm, int *shard_of,
                       k3c_err *err) {
    name_index by_file;
    c->shards = calloc(wm->n + 1, sizeof *c->shards);
    if (!c->shards || nidx_init(&by_file, (int)wm->n, wm_shard_at, wm)) {
        return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", ipath);
    }
    int rc = K3C_OK;
    for (size_t i = 0; i < wm->n && rc == K3C_OK; i++) {
        const k3c_json *v = &wm->items[i];
        if (v->type != K3C_JSON_STRING || !shard_name_ok(v->string)) {
            rc = k3c_errf(err, K3C_EFORMAT, "%s: weight_map['%s'] must name a shard file inside the directory", ipath,
                          wm->keys[i]);
            break;
        }
        int j = nidx_put(&by_file, (int)i);
        if (j >= 0) {
            shard_of[i] = shard_of[j];
            continue;
        }
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", dir, v->string) >= (int)sizeof path) {
            rc = k3c_errf(err, K3C_EINVAL, "%s: shard path too long", ipath);
            break;
        }
        shard_of[i] = c->nshards;
        rc = k3c_st_open(path, &c->shards[c->nshards], err);
        if (rc != K3C_OK)
            k3c_err_wrap(err, "%s: shard '%s' (first listed for '%s')", ipath, v->string, wm->keys[i]);
        else
            c->nshards++;
    }
    nidx_free(&by_file);
    return rc;
}

/* Every mapped tensor must be in its shard, and every shard tensor must be mapped (to that shard). */
static int check_weight_map(k3c_checkpoint *c, const char *ipath, const k3c_json *wm, const int *shard_of,
                            k3c_err *err) {
    unsigned char **seen = calloc((size_t)c->nshards + 1, sizeof *seen);
    int rc = seen ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "%s: out of memory", ipath);
    for (int s = 0; s < c->nshards && rc == K3C_OK; s++)
        if (!(seen[s] = calloc((size_t)k3c_st_count(c->shards[s]) + 1, 1)))
            rc = k3c_errf(err, K3C_ENOMEM, "%s: out of memory", ipath);
    for (size_t i = 0; i < wm->n && rc == K3C_OK; i++) {
        const k3c_safetensors *sh = c->shards[shard_of[i]];
        const k3c_st_tensor *t = k3c_st_find(sh, wm->keys[i]);
        if (!t)
            rc = k3c_errf(err, K3C_EFORMAT, "%s: weight_map maps tensor '%s' to %s, which has no such tensor", ipath,
                          wm->keys[i], sh->path);
        else
            seen[shard_of[i]][t - sh->t] = 1;
    }
    for (int s = 0; s < c->nshards && rc == K3C_OK; s++)
        for (int i = 0; i < c->shards[s]->n && rc == K3C_OK; i++)
            if (!seen[s][i])
                rc = k3c_errf(err, K3C_EFORMAT, "%s: tensor '%s' of %s is not listed in weight_map for that shard",
                              ipath, c->shards[s]->t[i].name, c->shards[s]->path);
    for (int s = 0; seen && s < c->nshards; s++) free(seen[s]);
    free(seen);
    return rc;
}

static int open_index(k3c_checkpoint *c, const char *dir, const char *ipath, k3c_err *err) {
    k3c_json *root = NULL;
    int rc = k3c_json_parse_file(ipath, &root, err);
    if (rc != K3C_OK) return rc;
    const k3c_json *wm = k3c_json_get(root, "weight_map");
    int *shard_of = NULL;
    if (root->type != K3C_JSON_OBJECT)
        rc = k3c_errf(err, K3C_EFORMAT, "%s: not a JSON object", ipath);
    else if (!wm || wm->type != K3C_JSON_OBJECT)
        rc = k3c_errf(err, K3C_EFORMAT, "%s: missing weight_map object", ipath);
    else if (wm->n > (size_t)INT32_MAX / 2)
        rc = k3c_errf(err, K3C_EFORMAT, "%s: weight_map too large", ipath);
    else if (!(shard_of = calloc(wm->n + 1, sizeof *shard_of)))
        rc = k3c_errf(err, K3C_ENOMEM, "%s: out of memory", ipath);
    if (rc == K3C_OK) rc = open_shards(c, dir, ipath, wm, shard_of, err);
    if (rc == K3C_OK) rc = check_weight_map(c, ipath, wm, shard_of, err);
    free(shard_of);
    k3c_json_free(root);
    return rc;
}

static int open_single(k3c_checkpoint *c, const char *path, k3c_err *err) {
    c->shards = calloc(1, sizeof *c->shards);
    if (!c->shards) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", path);
    int rc = k3c_st_open(path, &c->shards[0], err);
    if (rc == K3C_OK) c->nshards = 1;
    return rc;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* `dir` is a checkpoint directory; a path to a .safetensors file or to an index .json is accepted as well. */
static int ckpt_open_any(k3c_checkpoint *c, const char *dir, k3c_err *err) {
    struct stat sb;
    if (stat(dir, &sb) != 0) return k3c_errf(err, K3C_ENOTFOUND, "%s: %s", dir, strerror(errno));
    char path[4096];
    if (S_ISREG(sb.st_mode)) {
        if (!ends_with(dir, ".json")) return open_single(c, dir, err);
        char base[4096];
        snprintf(base, sizeof base, "%s", dir);
        return open_index(c, dirname(base), dir, err);
    }
    if (snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir) >= (int)sizeof path)
        return k3c_errf(err, K3C_EINVAL, "%s: path too long", dir);
    if (access(path, F_OK) == 0) return open_index(c, dir, path, err);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (access(path, F_OK) == 0) return open_single(c, path, err);
    return k3c_errf(err, K3C_ENOTFOUND, "%s: neither model.safetensors.index.json nor model.safetensors found", dir);
}

int k3c_ckpt_open(const char *dir, k3c_checkpoint **out, k3c_err *err) {
    *out = NULL;
    k3c_checkpoint *c = calloc(1, sizeof *c);
    if (!c) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", dir);
    struct stat sb; /* a directory a k3c trainer wrote carries checksums.json: verified before anything is read */
    int rc = stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode) ? k3c_checksums_verify(dir, NULL, err) : K3C_OK;
    if (rc == K3C_OK) rc = ckpt_open_any(c, dir, err);
    if (rc == K3C_OK) rc = ckpt_index(c, dir, err);
    if (rc != K3C_OK) {
        k3c_ckpt_close(c);
        return rc;
    }
    *out = c;
    return K3C_OK;
}

void k3c_ckpt_close(k3c_checkpoint *c) {
    if (!c) return;
    for (int s = 0; s < c->nshards; s++) k3c_st_close(c->shards[s]);
    free(c->shards);
    free(c->t);
    nidx_free(&c->idx);
    free(c);
}

int k3c_ckpt_count(const k3c_checkpoint *c) { return c ? c->n : 0; }

const k3c_st_tensor *k3c_ckpt_at(const k3c_checkpoint *c, int i) { return c && i >= 0 && i < c->n ? c->t[i] : NULL; }

const k3c_st_tensor *k3c_ckpt_find(const k3c_checkpoint *c, const char *name) {
    if (!c || !name) return NULL;
    int i = nidx_get(&c->idx, name);
    return i >= 0 ? c->t[i] : NULL;
}

/* ------------------------------------------------------------------ writer */

static const char *entry_name_at(const void *ctx, int i) { return ((const k3c_st_entry *)ctx)[i].name; }

static int check_entries(const char *path, const k3c_st_entry *e, int n, uint64_t *nbytes, k3c_err *err) {
    name_index ix;
    if (nidx_init(&ix, n, entry_name_at, e)) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", path);
    int rc = K3C_OK;
    for (int i = 0; i < n && rc == K3C_OK; i++) {
        const char *nm = e[i].name;
        uint64_t numel = 1;
        if (!nm || !k3c_utf8_valid(nm, strlen(nm)) || strcmp(nm, "__metadata__") == 0) {
            rc = k3c_errf(err, K3C_EINVAL, "%s: entry %d: tensor name missing, not UTF-8 or reserved", path, i);
            break;
        }
        if (nidx_put(&ix, i) >= 0) {
            rc = k3c_errf(err, K3C_EINVAL, "%s: tensor '%s': duplicate name", path, nm);
            break;
        }
        if ((unsigned)e[i].dtype >= K3C_DTYPE_COUNT || e[i].ndim < 0 || e[i].ndim > K3C_MAX_DIMS) {
            rc = k3c_errf(err, K3C_EINVAL, "%s: tensor '%s': bad dtype or ndim", path, nm);
            break;
        }
        for (int d = 0; d < e[i].ndim && rc == K3C_OK; d++)
            if (e[i].shape[d] < 0 || __builtin_mul_overflow(numel, (uint64_t)e[i].shape[d], &numel))
                rc = k3c_errf(err, K3C_EINVAL, "%s: tensor '%s': negative or overflowing shape", path, nm);
        if (rc == K3C_OK && __builtin_mul_overflow(numel, (uint64_t)k3c_dtype_size(e[i].dtype), &nbytes[i]))
            rc = k3c_errf(err, K3C_EINVAL, "%s: tensor '%s': size overflows", path, nm);
        if (rc == K3C_OK && nbytes[i] > 0 && !e[i].data)
            rc = k3c_errf(err, K3C_EINVAL, "%s: tensor '%s': NULL data", path, nm);
    }
    nidx_free(&ix);
    return rc;
}

static void header_metadata(k3c_sbuf *s, const char *const *meta) {
    k3c_sbuf_append(s, "\"__metadata__\":{", 16);
    for (int i = 0; meta[i]; i += 2) {
        if (i) k3c_sbuf_append(s, ",", 1);
        k3c_sbuf_json_string(s, meta[i], strlen(meta[i]));
        k3c_sbuf_append(s, ":", 1);
        k3c_sbuf_json_string(s, meta[i + 1], strlen(meta[i + 1]));
    }
    k3c_sbuf_append(s, "}", 1);
}

static int check_meta(const char *path, const char *const *meta, k3c_err *err) {
    for (int i = 0; meta && meta[i]; i += 2) {
        if (!meta[i + 1]) return k3c_errf(err, K3C_EINVAL, "%s: metadata key '%s' has no value", path, meta[i]);
        if (!k3c_utf8_valid(meta[i], strlen(meta[i])) || !k3c_utf8_valid(meta[i + 1], strlen(meta[i + 1])))
            return k3c_errf(err, K3C_EINVAL, "%s: metadata '%s' is not valid UTF-8", path, meta[i]);
        for (int j = 0; j < i; j += 2)
            if (strcmp(meta[i], meta[j]) == 0)
                return k3c_errf(err, K3C_EINVAL, "%s: duplicate metadata key '%s'", path, meta[i]);
    }
    return K3C_OK;
}

/* The header JSON, padded with spaces so the data region starts 8-byte aligned (as the official writer does). */
static int build_header(k3c_sbuf *s, const char *path, const k3c_st_entry *e, int n, const uint64_t *nbytes,
                        const char *const *meta, k3c_err *err) {
    k3c_sbuf_append(s, "{", 1);
    if (meta && meta[0]) header_metadata(s, meta);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        if (i || (meta && meta[0])) k3c_sbuf_append(s, ",", 1);
        k3c_sbuf_json_string(s, e[i].name, strlen(e[i].name));
        k3c_sbuf_printf(s, ":{\"dtype\":\"%s\",\"shape\":[", k3c_dtype_name(e[i].dtype));
        for (int d = 0; d < e[i].ndim; d++) k3c_sbuf_printf(s, "%s%lld", d ? "," : "", (long long)e[i].shape[d]);
        k3c_sbuf_printf(s, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                        (unsigned long long)(off + nbytes[i]));
        off += nbytes[i];
    }
    k3c_sbuf_append(s, "}", 1);
    while (s->ok && s->len % 8) k3c_sbuf_append(s, " ", 1);
    if (!s->ok) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory building the header", path);
    if (s->len > ST_MAX_HEADER)
        return k3c_errf(err, K3C_EINVAL, "%s: header of %zu bytes exceeds the 100 MB limit", path, s->len);
    return K3C_OK;
}

static int write_all(int fd, const void *data, uint64_t n) {
    const unsigned char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : (size_t)n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (uint64_t)w;
    }
    return 0;
}

/* Streams header and tensor data to "<path>.tmp.<pid>", fsyncs, renames over path and fsyncs the directory. */
static int write_stream(const char *path, const k3c_sbuf *hdr, const k3c_st_entry *e, int n, const uint64_t *nbytes,
                        k3c_err *err) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return k3c_errf(err, K3C_EINVAL, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return k3c_errf(err, K3C_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hdr->len >> (8 * i));
    int bad = write_all(fd, len8, 8) || write_all(fd, hdr->buf, hdr->len);
    for (int i = 0; i < n && !bad; i++) bad = write_all(fd, e[i].data, nbytes[i]);
    if (!bad) bad = fsync(fd) != 0;
    int e1 = errno;
    if (close(fd) != 0 && !bad) {
        bad = 1;
        e1 = errno;
    }
    if (bad) {
        unlink(tmp);
        return k3c_errf(err, K3C_EIO, "%s: write failed: %s", tmp, strerror(e1));
    }
    if (rename(tmp, path) != 0) {
        e1 = errno;
        unlink(tmp);
        return k3c_errf(err, K3C_EIO, "%s: rename failed: %s", path, strerror(e1));
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

int k3c_st_write(const char *path, const k3c_st_entry *entries, int n, const char *const *meta, k3c_err *err) {
    if (!path || n < 0 || (n > 0 && !entries)) return k3c_errf(err, K3C_EINVAL, "k3c_st_write: bad arguments");
    uint64_t *nbytes = calloc((size_t)n + 1, sizeof *nbytes);
    if (!nbytes) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", path);
    k3c_sbuf hdr;
    k3c_sbuf_init(&hdr);
    int rc = check_entries(path, entries, n, nbytes, err);
    if (rc == K3C_OK) rc = check_meta(path, meta, err);
    if (rc == K3C_OK) rc = build_header(&hdr, path, entries, n, nbytes, meta, err);
    if (rc == K3C_OK) rc = write_stream(path, &hdr, entries, n, nbytes, err);
    k3c_sbuf_free(&hdr);
    free(nbytes);
    return rc;
}
