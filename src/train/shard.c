/* shard.c — the K3CSHARD token shard (writer, mmapped validating reader) and shard sets (a prepared directory's
 * manifest.json and the shards of one split). Spec: docs/TRAINING.md §2 (packing input), §7.1 (offline corpora). */
#include "base/json.h"
#include "train/data.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "shards are little-endian and read in place: a big-endian host needs byte swapping here"
#endif

static uint32_t width_for(int64_t vocab) { return vocab <= 65536 ? 2u : 4u; }

/* ---------------------------------------------------------------- writer */

typedef struct {
    int fd;
    uint64_t h;
    unsigned char buf[1 << 16];
    size_t n;
    int failed;
} wstream;

static void ws_flush(wstream *w) {
    size_t off = 0;
    while (!w->failed && off < w->n) {
        ssize_t k = write(w->fd, w->buf + off, w->n - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            w->failed = errno ? errno : EIO;
        else
            off += (size_t)k;
    }
    w->n = 0;
}

static void ws_put(wstream *w, const void *p, size_t n, int hash) {
    if (hash) w->h = k3c_fnv1a64(p, n, w->h);
    const unsigned char *b = p;
    while (n > 0) {
        size_t k = sizeof w->buf - w->n < n ? sizeof w->buf - w->n : n;
        memcpy(w->buf + w->n, b, k);
        w->n += k, b += k, n -= k;
        if (w->n == sizeof w->buf) ws_flush(w);
    }
}

static int check_contents(const char *path, const int32_t *tokens, int64_t n_tokens, const uint64_t *off,
                          int64_t n_docs, int64_t vocab, k3c_err *err) {
    if (vocab < 1 || vocab > INT32_MAX)
        return k3c_errf(err, K3C_EINVAL, "%s: vocab size %lld out of range", path, (long long)vocab);
    if (n_docs < 0 || n_tokens < 0) return k3c_errf(err, K3C_EINVAL, "%s: negative document or token count", path);
    if (off[0] != 0)
        return k3c_errf(err, K3C_EINVAL, "%s: bad offsets: offsets[0] = %llu, must be 0", path,
                        (unsigned long long)off[0]);
    for (int64_t d = 0; d < n_docs; d++)
        if (off[d + 1] < off[d])
            return k3c_errf(err, K3C_EINVAL, "%s: bad offsets: doc %lld ends before it starts (%llu < %llu)", path,
                            (long long)d, (unsigned long long)off[d + 1], (unsigned long long)off[d]);
    if (off[n_docs] != (uint64_t)n_tokens)
        return k3c_errf(err, K3C_EINVAL, "%s: bad offsets: last offset %llu != n_tokens %lld", path,
                        (unsigned long long)off[n_docs], (long long)n_tokens);
    for (int64_t i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return k3c_errf(err, K3C_EINVAL, "%s: token %d at position %lld outside [0, vocab size %lld)", path,
                            tokens[i], (long long)i, (long long)vocab);
    return K3C_OK;
}

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }

static void write_body(wstream *w, const int32_t *tokens, int64_t n_tokens, const uint64_t *off, int64_t n_docs,
                       int64_t vocab) {
    unsigned char hdr[K3C_SHARD_HEADER_BYTES] = {0};
    const uint32_t width = width_for(vocab);
    memcpy(hdr, K3C_SHARD_MAGIC, 8);
    put_u32(hdr + 8, K3C_SHARD_VERSION);
    put_u32(hdr + 12, width);
    put_u64(hdr + 16, (uint64_t)vocab);
    put_u64(hdr + 24, (uint64_t)n_docs);
    put_u64(hdr + 32, (uint64_t)n_tokens);
    ws_put(w, hdr, sizeof hdr, 1);
    ws_put(w, off, sizeof *off * (size_t)(n_docs + 1), 1);
    enum { CHUNK = 4096 };
    uint32_t t32[CHUNK];
    uint16_t t16[CHUNK];
    for (int64_t i = 0; i < n_tokens; i += CHUNK) {
        size_t k = (size_t)(n_tokens - i < CHUNK ? n_tokens - i : CHUNK);
        for (size_t j = 0; j < k; j++) {
            t32[j] = (uint32_t)tokens[i + (int64_t)j];
            t16[j] = (uint16_t)tokens[i + (int64_t)j];
        }
        ws_put(w, width == 2 ? (const void *)t16 : (const void *)t32, k * width, 1);
    }
    uint64_t sum = w->h;
    ws_put(w, &sum, 8, 0);
    ws_flush(w);
}

int k3c_shard_write(const char *path, const int32_t *tokens, int64_t n_tokens, const uint64_t *offsets, int64_t n_docs,
                    int64_t vocab_size, k3c_err *err) {
    int rc = check_contents(path, tokens, n_tokens, offsets, n_docs, vocab_size, err);
    if (rc) return rc;
    char tmp[1100];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return k3c_errf(err, K3C_EINVAL, "%s: path too long", path);
    wstream *w = malloc(sizeof *w);
    if (!w) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", path);
    w->fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (w->fd < 0) {
        rc = k3c_errf(err, K3C_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        free(w);
        return rc;
    }
    w->h = K3C_FNV1A64_INIT, w->n = 0, w->failed = 0;
    write_body(w, tokens, n_tokens, offsets, n_docs, vocab_size);
    if (w->failed)
        rc = k3c_errf(err, K3C_EIO, "%s: write failed: %s", tmp, strerror(w->failed));
    else if (fsync(w->fd) != 0)
        rc = k3c_errf(err, K3C_EIO, "%s: fsync failed: %s", tmp, strerror(errno));
    if (close(w->fd) != 0 && !rc) rc = k3c_errf(err, K3C_EIO, "%s: close failed: %s", tmp, strerror(errno));
    free(w);
    if (!rc && rename(tmp, path) != 0) rc = k3c_errf(err, K3C_EIO, "%s: rename failed: %s", path, strerror(errno));
    if (rc) {
        unlink(tmp);
        return rc;
    }
    char dir[1100];
    snprintf(dir, sizeof dir, "%s", path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return K3C_OK;
}

/* ---------------------------------------------------------------- reader */

static uint32_t get_u32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t token_at(const k3c_shard *s, int64_t i) {
    if (s->token_bytes == 2) {
        uint16_t v;
        memcpy(&v, s->tokens + 2 * i, 2);
        return v;
    }
    uint32_t v;
    memcpy(&v, s->tokens + 4 * i, 4);
    return v;
}

/* Header fields and the file size agree; fills the counts and the layout pointers. */
static int check_header(k3c_shard *s, const unsigned char *m, size_t size, k3c_err *err) {
    const char *p = s->path;
    const size_t min = K3C_SHARD_HEADER_BYTES + 16;
    if (memcmp(m, K3C_SHARD_MAGIC, size < 8 ? size : 8) != 0)
        return k3c_errf(err, K3C_EFORMAT, "%s: not a k3c shard (wrong magic, expected \"%s\")", p, K3C_SHARD_MAGIC);
    if (size < min)
        return k3c_errf(err, K3C_EFORMAT, "%s: truncated shard: %zu bytes, even an empty shard has %zu", p, size, min);
    s->version = get_u32(m + 8);
    s->token_bytes = get_u32(m + 12);
    if (s->version != K3C_SHARD_VERSION)
        return k3c_errf(err, K3C_EFORMAT, "%s: unsupported shard version %u (this build reads %u)", p, s->version,
                        K3C_SHARD_VERSION);
    if (s->token_bytes != 2 && s->token_bytes != 4)
        return k3c_errf(err, K3C_EFORMAT, "%s: corrupt shard header: token width %u (must be 2 or 4)", p,
                        s->token_bytes);
    uint64_t vocab = get_u64(m + 16), nd = get_u64(m + 24), nt = get_u64(m + 32);
    if (vocab < 1 || vocab > INT32_MAX || (s->token_bytes == 2 && vocab > 65536))
        return k3c_errf(err, K3C_EFORMAT, "%s: corrupt shard header: vocab size %llu with %u-byte tokens", p,
                        (unsigned long long)vocab, s->token_bytes);
    if (nd > size / 8 || nt > size / s->token_bytes)
        return k3c_errf(err, K3C_EFORMAT,
                        "%s: truncated or corrupt shard: header claims %llu docs and %llu tokens, file has %zu bytes",
                        p, (unsigned long long)nd, (unsigned long long)nt, size);
    const uint64_t want = K3C_SHARD_HEADER_BYTES + 8 * (nd + 1) + s->token_bytes * nt + 8;
    if (want > size)
        return k3c_errf(
            err, K3C_EFORMAT,
            "%s: truncated shard (or corrupt header): header (%llu docs, %llu tokens) implies %llu bytes, file has %zu",
            p, (unsigned long long)nd, (unsigned long long)nt, (unsigned long long)want, size);
    if (want < size)
        return k3c_errf(err, K3C_EFORMAT,
                        "%s: corrupt shard: %llu bytes after the checksum (header implies %llu bytes)", p,
                        (unsigned long long)(size - want), (unsigned long long)want);
    s->vocab_size = (int64_t)vocab, s->n_docs = (int64_t)nd, s->n_tokens = (int64_t)nt;
    s->offsets = (const uint64_t *)(m + K3C_SHARD_HEADER_BYTES);
    s->tokens = m + K3C_SHARD_HEADER_BYTES + 8 * (nd + 1);
    return K3C_OK;
}

static int check_body(const k3c_shard *s, const unsigned char *m, size_t size, k3c_err *err) {
    const char *p = s->path;
    uint64_t stored = get_u64(m + size - 8), got = k3c_fnv1a64(m, size - 8, K3C_FNV1A64_INIT);
    if (stored != got)
        return k3c_errf(err, K3C_EFORMAT, "%s: corrupt shard: checksum mismatch (stored %016llx, computed %016llx)", p,
                        (unsigned long long)stored, (unsigned long long)got);
    for (int i = 40; i < K3C_SHARD_HEADER_BYTES; i++)
        if (m[i]) return k3c_errf(err, K3C_EFORMAT, "%s: corrupt shard header: reserved byte %d is not zero", p, i);
    const uint64_t *off = s->offsets;
    if (off[0] != 0)
        return k3c_errf(err, K3C_EFORMAT, "%s: bad offsets: offsets[0] = %llu, must be 0", p,
                        (unsigned long long)off[0]);
    for (int64_t d = 0; d < s->n_docs; d++)
        if (off[d + 1] < off[d])
            return k3c_errf(err, K3C_EFORMAT, "%s: bad offsets: doc %lld ends before it starts (%llu < %llu)", p,
                            (long long)d, (unsigned long long)off[d + 1], (unsigned long long)off[d]);
    if (off[s->n_docs] != (uint64_t)s->n_tokens)
        return k3c_errf(err, K3C_EFORMAT, "%s: bad offsets: the last offset is %llu but the shard has %lld tokens", p,
                        (unsigned long long)off[s->n_docs], (long long)s->n_tokens);
    for (int64_t i = 0, d = 0; i < s->n_tokens; i++) {
        uint32_t t = token_at(s, i);
        if ((int64_t)t < s->vocab_size) continue;
        while (off[d + 1] <= (uint64_t)i) d++;
        return k3c_errf(err, K3C_EFORMAT, "%s: token %u at position %lld (doc %lld) >= vocab size %lld", p, t,
                        (long long)i, (long long)d, (long long)s->vocab_size);
    }
    return K3C_OK;
}

int k3c_shard_open(const char *path, k3c_shard **out, k3c_err *err) {
    *out = NULL;
    k3c_shard *s = calloc(1, sizeof *s);
    if (!s) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", path);
    snprintf(s->path, sizeof s->path, "%s", path);
    int fd = open(path, O_RDONLY), rc = K3C_OK;
    struct stat st;
    if (fd < 0)
        rc = k3c_errf(err, K3C_EIO, "%s: cannot open shard: %s", path, strerror(errno));
    else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        rc = k3c_errf(err, K3C_EIO, "%s: not a regular file", path);
    else if (st.st_size == 0)
        rc = k3c_errf(err, K3C_EFORMAT, "%s: truncated shard: the file is empty", path);
    if (!rc) {
        s->map_len = (size_t)st.st_size;
        s->map = mmap(NULL, s->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (s->map == MAP_FAILED) {
            s->map = NULL;
            rc = k3c_errf(err, K3C_EIO, "%s: mmap failed: %s", path, strerror(errno));
        }
    }
    if (fd >= 0) close(fd);
    if (!rc) rc = check_header(s, s->map, s->map_len, err);
    if (!rc) rc = check_body(s, s->map, s->map_len, err);
    if (rc) {
        k3c_shard_close(s);
        return rc;
    }
    *out = s;
    return K3C_OK;
}

void k3c_shard_close(k3c_shard *s) {
    if (!s) return;
    if (s->map) munmap(s->map, s->map_len);
    free(s);
}

void k3c_shard_copy(const k3c_shard *s, int64_t d, int64_t from, int64_t n, int32_t *dst) {
    int64_t base = (int64_t)s->offsets[d] + from;
    if (s->token_bytes == 2) {
        const uint16_t *t = (const uint16_t *)s->tokens + base;
        for (int64_t i = 0; i < n; i++) dst[i] = t[i];
    } else {
        const uint32_t *t = (const uint32_t *)s->tokens + base;
        for (int64_t i = 0; i < n; i++) dst[i] = (int32_t)t[i];
    }
}

/* ---------------------------------------------------------------- shard sets (manifest.json) */

static int json_int(const k3c_json *o, const char *key, int64_t *v) {
    const k3c_json *x = k3c_json_get(o, key);
    if (!x || x->type != K3C_JSON_NUMBER || !x->is_integer) return 0;
    *v = x->integer;
    return 1;
}

static int json_str(const k3c_json *o, const char *key, char *buf, size_t n) {
    const k3c_json *x = k3c_json_get(o, key);
    if (!x || x->type != K3C_JSON_STRING) return 0;
    snprintf(buf, n, "%s", x->string);
    return 1;
}

/* Opens shard i of a split and checks it against its manifest entry (a stale or swapped file fails here). */
static int open_entry(k3c_shard_set *s, const k3c_json *e, const char *mpath, int i, k3c_err *err) {
    char file[512], path[2048];
    int64_t docs, toks;
    if (!json_str(e, "file", file, sizeof file) || !json_int(e, "docs", &docs) || !json_int(e, "tokens", &toks) ||
        strchr(file, '/'))
        return k3c_errf(err, K3C_EFORMAT,
                        "%s: shard entry %d needs \"file\" (a name in the directory), \"docs\", \"tokens\"", mpath, i);
    snprintf(path, sizeof path, "%s/%s", s->dir, file);
    int rc = k3c_shard_open(path, &s->shards[i], err);
    if (rc) return rc;
    const k3c_shard *sh = s->shards[i];
    if (sh->n_docs != docs || sh->n_tokens != toks)
        return k3c_errf(err, K3C_EFORMAT, "%s: has %lld docs / %lld tokens but %s lists %lld / %lld (stale shard?)",
                        path, (long long)sh->n_docs, (long long)sh->n_tokens, mpath, (long long)docs, (long long)toks);
    if (sh->vocab_size != s->vocab_size)
        return k3c_errf(err, K3C_EFORMAT, "%s: vocab size %lld but %s says %lld", path, (long long)sh->vocab_size,
                        mpath, (long long)s->vocab_size);
    s->doc_base[i + 1] = s->doc_base[i] + docs;
    s->n_docs += docs;
    s->n_tokens += toks;
    return K3C_OK;
}

static int parse_manifest(k3c_shard_set *s, const k3c_json *m, const char *mpath, const char *split, k3c_err *err) {
    char fmt[32] = "";
    int64_t ver = 0;
    if (m->type != K3C_JSON_OBJECT || !json_str(m, "format", fmt, sizeof fmt) || strcmp(fmt, "k3c-shards") != 0)
        return k3c_errf(err, K3C_EFORMAT, "%s: not a k3c shard manifest (\"format\": \"k3c-shards\" missing)", mpath);
    if (!json_int(m, "version", &ver) || ver != 1)
        return k3c_errf(err, K3C_EFORMAT, "%s: unsupported manifest version (this build reads 1)", mpath);
    if (!json_int(m, "vocab_size", &s->vocab_size) || s->vocab_size < 1)
        return k3c_errf(err, K3C_EFORMAT, "%s: \"vocab_size\" missing or not a positive integer", mpath);
    if (!json_int(m, "eod_id", &s->eod_id)) s->eod_id = -1;
    json_str(m, "source", s->source, sizeof s->source);
    json_str(m, "vocab", s->vocab, sizeof s->vocab);
    const k3c_json *sp = k3c_json_get(k3c_json_get(m, "splits"), split);
    const k3c_json *list = sp ? k3c_json_get(sp, "shards") : NULL;
    if (sp && (!list || list->type != K3C_JSON_ARRAY))
        return k3c_errf(err, K3C_EFORMAT, "%s: splits.%s.shards: expected an array", mpath, split);
    s->n_shards = list ? (int)list->n : 0;
    s->shards = calloc((size_t)s->n_shards + 1, sizeof *s->shards);
    s->doc_base = calloc((size_t)s->n_shards + 1, sizeof *s->doc_base);
    if (!s->shards || !s->doc_base) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", mpath);
    for (int i = 0; i < s->n_shards; i++) {
        int rc = open_entry(s, &list->items[i], mpath, i, err);
        if (rc) return rc;
    }
    return K3C_OK;
}

int k3c_shard_set_open(const char *dir, const char *split, k3c_shard_set **out, k3c_err *err) {
    *out = NULL;
    k3c_shard_set *s = calloc(1, sizeof *s);
    if (!s) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", dir);
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    char mpath[1100];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
    k3c_json *m = NULL;
    int rc = k3c_json_parse_file(mpath, &m, err);
    if (!rc) rc = parse_manifest(s, m, mpath, split, err);
    k3c_json_free(m);
    if (rc) {
        k3c_shard_set_close(s);
        return rc;
    }
    *out = s;
    return K3C_OK;
}

void k3c_shard_set_close(k3c_shard_set *s) {
    if (!s) return;
    for (int i = 0; s->shards && i < s->n_shards; i++) k3c_shard_close(s->shards[i]);
    free(s->shards);
    free(s->doc_base);
    free(s);
}

void k3c_shard_set_locate(const k3c_shard_set *s, int64_t d, const k3c_shard **sh, int64_t *local) {
    int lo = 0, hi = s->n_shards - 1;
    while (lo < hi) { /* the last shard whose first document is <= d */
        int mid = (lo + hi + 1) / 2;
        if (s->doc_base[mid] <= d)
            lo = mid;
        else
            hi = mid - 1;
    }
    *sh = s->shards[lo];
    *local = d - s->doc_base[lo];
}

int64_t k3c_shard_set_doc_len(const k3c_shard_set *s, int64_t d) {
    const k3c_shard *sh;
    int64_t local;
    k3c_shard_set_locate(s, d, &sh, &local);
    return k3c_shard_doc_len(sh, local);
}
