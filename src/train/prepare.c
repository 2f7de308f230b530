/* prepare.c — `k3c data prepare`: text / JSONL corpora (optionally gzip'd) → documents → token ids (+ end-of-document
 * token) → train / val K3CSHARD files and manifest.json. Spec: docs/TRAINING.md §7.1 (offline corpora), §2 (documents). */
#include "base/json.h"
#include "train/data.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define DEFAULT_SHARD_TOKENS (16ll << 20)
#define BATCH_BYTES (32u << 20) /* text encoded per parallel batch: bounds the ids held at once */
#define BATCH_DOCS 65536

int k3c_data_format_parse(const char *name, int *out, k3c_err *err) {
    static const char *const names[] = {"auto", "text", "jsonl"};
    for (int i = 0; i < 3; i++)
        if (name && strcmp(name, names[i]) == 0) {
            *out = i;
            return K3C_OK;
        }
    return k3c_errf(err, K3C_EINVAL, "format: '%s' is not one of auto, text, jsonl", name ? name : "(null)");
}

int k3c_doc_split_parse(const char *name, int *out, k3c_err *err) {
    static const char *const names[] = {"blank", "file", "line"};
    for (int i = 0; i < 3; i++)
        if (name && strcmp(name, names[i]) == 0) {
            *out = i;
            return K3C_OK;
        }
    return k3c_errf(err, K3C_EINVAL, "doc-split: '%s' is not one of blank, file, line", name ? name : "(null)");
}

static const char *split_name(int s) {
    return s == K3C_DOC_SPLIT_FILE ? "file" : s == K3C_DOC_SPLIT_LINE ? "line" : "blank";
}


/* ---------------------------------------------------------------- input files */

typedef struct {
    char **p;
    int n, cap;
} pathlist;

static int pl_add(pathlist *pl, const char *path) {
    if (pl->n == pl->cap) {
        int cap = pl->cap ? 2 * pl->cap : 16;
        char **np = realloc(pl->p, (size_t)cap * sizeof *np);
        if (!np) return K3C_ENOMEM;
        pl->p = np, pl->cap = cap;
    }
    return (pl->p[pl->n] = strdup(path)) ? (pl->n++, K3C_OK) : K3C_ENOMEM;
}

static void pl_free(pathlist *pl) {
    for (int i = 0; i < pl->n; i++) free(pl->p[i]);
    free(pl->p);
}

static int not_hidden(const struct dirent *e) { return e->d_name[0] != '.'; }
/* byte order, not the locale's collation: the document order (and so the shards) must not depend on LC_COLLATE */
static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

static int expand(const char *path, pathlist *pl, int depth, k3c_err *err) {
    struct stat st;
    if (stat(path, &st) != 0) return k3c_errf(err, K3C_EIO, "%s: %s", path, strerror(errno));
    if (S_ISREG(st.st_mode)) return pl_add(pl, path) ? k3c_errf(err, K3C_ENOMEM, "out of memory") : K3C_OK;
    if (!S_ISDIR(st.st_mode)) return k3c_errf(err, K3C_EINVAL, "%s: not a file or directory", path);
    if (depth > 32) return k3c_errf(err, K3C_EINVAL, "%s: directories nested too deep", path);
    struct dirent **list;
    int n = scandir(path, &list, not_hidden, by_name), rc = K3C_OK;
    if (n < 0) return k3c_errf(err, K3C_EIO, "%s: cannot list: %s", path, strerror(errno));
    for (int i = 0; i < n; i++) {
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", path, list[i]->d_name);
        if (!rc) rc = expand(sub, pl, depth + 1, err);
        free(list[i]);
    }
    free(list);
    return rc;
}

static int is_gzip(const char *path) {
    unsigned char m[2] = {0};
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    ssize_t k = read(fd, m, 2);
    close(fd);
    return k == 2 && m[0] == 0x1f && m[1] == 0x8b;
}

/* gzip -dc as a child process: no zlib link dependency, and gzip's own messages go to /dev/null (the library never
 * prints); its exit status decides success. */
static int read_gzip(const char *path, char **data, size_t *n, k3c_err *err) {
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) return k3c_errf(err, K3C_EIO, "%s: pipe: %s", path, strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    char *argv[] = {"gzip", "-dc", "--", (char *)path, NULL};
    pid_t pid;
    int e = posix_spawnp(&pid, "gzip", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(pfd[1]);
    if (e != 0) {
        close(pfd[0]);
        return k3c_errf(err, K3C_EIO, "%s: cannot run gzip -dc: %s", path, strerror(e));
    }
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap + 1);
    int rc = buf ? K3C_OK : K3C_ENOMEM;
    while (!rc) {
        if (len == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) {
                rc = K3C_ENOMEM;
                break;
            }
            buf = nb, cap *= 2;
        }
        ssize_t k = read(pfd[0], buf + len, cap - len);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        len += (size_t)k;
    }
    close(pfd[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (!rc && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        rc = k3c_errf(err, K3C_EFORMAT, "%s: gzip -dc failed (corrupt or truncated .gz file)", path);
    else if (rc)
        k3c_errf(err, rc, "%s: out of memory decompressing", path);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[len] = 0;
    *data = buf, *n = len;
    return K3C_OK;
}

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int format_of(const char *path, int format) {
    if (format != K3C_DATA_FORMAT_AUTO) return format;
    char p[4096];
    snprintf(p, sizeof p, "%s", path);
    if (has_suffix(p, ".gz")) p[strlen(p) - 3] = 0;
    return has_suffix(p, ".jsonl") || has_suffix(p, ".ndjson") ? K3C_DATA_FORMAT_JSONL : K3C_DATA_FORMAT_TEXT;
}

/* ---------------------------------------------------------------- documents of one file */

typedef struct {
    const char *p;
    size_t n;
    char *owned; /* JSONL strings are decoded copies */
    long line;   /* JSONL: the line it came from */
} doc;

typedef struct {
    const char *path, *field;
    const char *buf;
    size_t n, pos;
    int format, split;
    long line; /* 1-based number of the next line (JSONL errors) */
} doc_iter;

static int blank_line(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r\f\v", p[i]) || p[i] == 0) return 0;
    return 1;
}

/* The next line [*a, *b) without its '\n'; 0 at the end. */
static int next_line(doc_iter *it, size_t *a, size_t *b) {
    if (it->pos >= it->n) return 0;
    const char *nl = memchr(it->buf + it->pos, '\n', it->n - it->pos);
    *a = it->pos;
    *b = nl ? (size_t)(nl - it->buf) : it->n;
    it->pos = nl ? *b + 1 : it->n;
    it->line++;
    return 1;
}

static int next_text(doc_iter *it, doc *d) {
    size_t a, b;
    if (it->split == K3C_DOC_SPLIT_FILE) {
        int ok = it->pos == 0 && !blank_line(it->buf, it->n);
        it->pos = it->n;
        *d = (doc){it->buf, it->n, NULL, 0};
        return ok;
    }
    while (next_line(it, &a, &b)) {
        if (blank_line(it->buf + a, b - a)) continue;
        if (it->split == K3C_DOC_SPLIT_LINE) {
            if (b > a && it->buf[b - 1] == '\r') b--;
            *d = (doc){it->buf + a, b - a, NULL, 0};
            return 1;
        }
        size_t start = a, end = b, save;
        for (save = it->pos; next_line(it, &a, &b) && !blank_line(it->buf + a, b - a); save = it->pos) end = b;
        it->pos = save; /* the blank line (or EOF) that ended the paragraph is skipped by the next call */
        if (end > start && it->buf[end - 1] == '\r') end--;
        *d = (doc){it->buf + start, end - start, NULL, 0};
        return 1;
    }
    return 0;
}

static int next_jsonl(doc_iter *it, doc *d, k3c_err *err) {
    size_t a, b;
    while (next_line(it, &a, &b)) {
        if (blank_line(it->buf + a, b - a)) continue;
        char where[4200];
        snprintf(where, sizeof where, "%s:%ld", it->path, it->line);
        k3c_json *v = NULL;
        int rc = k3c_json_parse(it->buf + a, b - a, where, &v, err);
        if (rc) return rc;
        const k3c_json *f = k3c_json_get(v, it->field);
        if (!f || f->type != K3C_JSON_STRING) {
            k3c_json_free(v);
            return k3c_errf(err, K3C_EFORMAT, "%s: field \"%s\" %s", where, it->field,
                            f ? "is not a string" : "missing (choose another with --jsonl-field)");
        }
        if (f->len == 0) {
            k3c_json_free(v);
            continue;
        }
        d->owned = malloc(f->len + 1);
        if (!d->owned) {
            k3c_json_free(v);
            return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", where);
        }
        memcpy(d->owned, f->string, f->len + 1);
        d->p = d->owned, d->n = f->len, d->line = it->line;
        k3c_json_free(v);
        return 1;
    }
    return 0;
}

/* 1 = a document, 0 = end of file, < 0 = error */
static int next_doc(doc_iter *it, doc *d, k3c_err *err) {
    *d = (doc){0};
    return it->format == K3C_DATA_FORMAT_JSONL ? next_jsonl(it, d, err) : next_text(it, d);
}

/* ---------------------------------------------------------------- shard builders (one per split) */

typedef struct {
    const char *dir, *split;
    int64_t vocab, limit;
    int32_t *tok;
    uint64_t *off; /* nd + 1 entries */
    int64_t n, cap, nd, cap_d;
    int n_shards;
    int64_t (*rec)[2]; /* docs, tokens of each written shard */
    int64_t docs, tokens;
} builder;

static int grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return K3C_OK;
    int64_t c = *cap ? *cap : 1024;
    while (c < need) c *= 2;
    void *np = realloc(*p, (size_t)c * elem);
    if (!np) return K3C_ENOMEM;
    *p = np, *cap = c;
    return K3C_OK;
}

static int builder_flush(builder *b, k3c_err *err) {
    if (b->nd == 0) return K3C_OK;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s-%05d%s", b->dir, b->split, b->n_shards, K3C_SHARD_EXT);
    int rc = k3c_shard_write(path, b->tok, b->n, b->off, b->nd, b->vocab, err);
    if (rc) return rc;
    void *nr = realloc(b->rec, (size_t)(b->n_shards + 1) * sizeof *b->rec);
    if (!nr) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    b->rec = nr;
    b->rec[b->n_shards][0] = b->nd, b->rec[b->n_shards][1] = b->n;
    b->n_shards++;
    b->n = b->nd = 0;
    return K3C_OK;
}

/* Documents never straddle shards: the shard is closed before a document that would take it past the limit. */
static int builder_add(builder *b, const int32_t *ids, int64_t n, k3c_err *err) {
    int rc = b->nd > 0 && b->n + n > b->limit ? builder_flush(b, err) : K3C_OK;
    if (rc) return rc;
    if (grow((void **)&b->tok, &b->cap, b->n + n, sizeof *b->tok) ||
        grow((void **)&b->off, &b->cap_d, b->nd + 2, sizeof *b->off))
        return k3c_errf(err, K3C_ENOMEM, "out of memory (%lld tokens pending)", (long long)b->n);
    memcpy(b->tok + b->n, ids, (size_t)n * sizeof *ids);
    b->off[b->nd] = (uint64_t)b->n;
    b->n += n;
    b->off[++b->nd] = (uint64_t)b->n;
    b->docs++, b->tokens += n;
    return K3C_OK;
}

/* Moves the most recent document (always still pending: flushing happens before an add) to another split. */
static int builder_move_last(builder *from, builder *to, k3c_err *err) {
    if (from->nd == 0) return K3C_OK;
    int64_t a = (int64_t)from->off[from->nd - 1], n = from->n - a;
    int rc = builder_add(to, from->tok + a, n, err);
    if (rc) return rc;
    from->nd--, from->n = a, from->docs--, from->tokens -= n;
    return K3C_OK;
}

static void builder_free(builder *b) {
    free(b->tok);
    free(b->off);
    free(b->rec);
}

/* Removes "<split>-NNNNN.k3cshard" files from an earlier, larger run so the directory holds only the manifest's shards. */
static void remove_stale(const builder *b) {
    for (int i = b->n_shards;; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s-%05d%s", b->dir, b->split, i, K3C_SHARD_EXT);
        if (unlink(path) != 0) break;
    }
}

/* ---------------------------------------------------------------- the run */

typedef struct {
    const k3c_prepare_opts *o;
    k3c_tok *tok;
    int32_t eod_id;
    uint64_t split_seed;
    int64_t next_doc; /* global document index: decides the split */
    builder b[2];
    pathlist files;
    int64_t *file_bytes, *file_docs; /* per input file: decompressed bytes, documents */
    int64_t disk_total, disk_done;
    k3c_prepare_result *res;
} run;

/* Encodes a batch of documents in parallel (the tokenizer is read-only, so threads share it), then assigns them to
 * splits in document order, so the shards do not depend on the thread count. */
static int encode_batch(run *r, const doc_iter *it, doc *docs, int nd, k3c_err *err) {
    k3c_tok_ids *ids = calloc((size_t)nd, sizeof *ids);
    int *rcs = calloc((size_t)nd, sizeof *rcs), rc = K3C_OK;
    if (!ids || !rcs) {
        free(ids);
        free(rcs);
        return k3c_errf(err, K3C_ENOMEM, "out of memory");
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < nd; i++) {
        rcs[i] = k3c_tok_encode(r->tok, docs[i].p, docs[i].n, 0, &ids[i], NULL);
        if (!rcs[i] && r->eod_id >= 0) rcs[i] = k3c_tok_ids_push(&ids[i], r->eod_id);
    }
    for (int i = 0; i < nd && !rc; i++) {
        if (rcs[i]) {
            rc = k3c_errf(err, rcs[i], "encoding a document of %zu bytes: out of memory", docs[i].n);
            break;
        }
        size_t bad = k3c_utf8_check(docs[i].p, docs[i].n);
        if (bad < docs[i].n) { /* reported, not printed: strict = an error, else counted with the first place */
            char where[sizeof r->res->invalid_utf8_first];
            if (docs[i].owned)
                snprintf(where, sizeof where, "%s:%ld: byte %zu of the text", it->path, docs[i].line, bad);
            else
                snprintf(where, sizeof where, "%s: byte %zu", it->path, (size_t)(docs[i].p - it->buf) + bad);
            if (r->o->strict_utf8) {
                rc = k3c_errf(err, K3C_EFORMAT, "%s: invalid UTF-8", where);
                break;
            }
            if (r->res->invalid_utf8_docs++ == 0) memcpy(r->res->invalid_utf8_first, where, sizeof where);
        }
        int val = k3c_uniform_at(r->split_seed, (uint64_t)r->next_doc++) < r->o->val_fraction;
        rc = builder_add(&r->b[val], ids[i].ids, (int64_t)ids[i].n, err);
    }
    for (int i = 0; i < nd; i++) k3c_tok_ids_free(&ids[i]);
    free(ids);
    free(rcs);
    return rc;
}

static void report(run *r, int64_t disk_done) {
    if (r->o->progress) r->o->progress(r->o->progress_ctx, disk_done, r->disk_total, r->b[0].tokens + r->b[1].tokens);
}

static int read_input(const char *path, char **data, size_t *n, k3c_err *err) {
    return is_gzip(path) ? read_gzip(path, data, n, err) : k3c_read_file(path, data, n, err);
}

static int process_file(run *r, int fi, int64_t disk_size, k3c_err *err) {
    const char *path = r->files.p[fi];
    char *buf;
    size_t n;
    int rc = read_input(path, &buf, &n, err);
    if (rc) return rc;
    doc_iter it = {
        path, r->o->jsonl_field ? r->o->jsonl_field : "text", buf, n, 0, format_of(path, r->o->format), r->o->doc_split,
        0};
    doc *batch = calloc(BATCH_DOCS, sizeof *batch);
    if (!batch) {
        free(buf);
        return k3c_errf(err, K3C_ENOMEM, "out of memory");
    }
    int nb = 0, more = 1;
    size_t bytes = 0;
    while (!rc && more) {
        int k = next_doc(&it, &batch[nb], err);
        if (k < 0) {
            rc = k;
            break;
        }
        more = k;
        if (k) bytes += batch[nb++].n;
        if (nb == BATCH_DOCS || bytes >= BATCH_BYTES || (!more && nb)) {
            rc = encode_batch(r, &it, batch, nb, err);
            r->file_docs[fi] += nb;
            for (int i = 0; i < nb; i++) free(batch[i].owned);
            nb = 0, bytes = 0;
            if (more) report(r, r->disk_done + (int64_t)((double)disk_size * (double)it.pos / (double)n));
        }
    }
    for (int i = 0; i < nb; i++) free(batch[i].owned);
    free(batch);
    free(buf);
    r->file_bytes[fi] = (int64_t)n;
    r->res->bytes += (int64_t)n;
    return rc;
}

static int mkdir_p(const char *dir, k3c_err *err) {
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != 0) continue;
        char c = *s;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return k3c_errf(err, K3C_EIO, "%s: cannot create: %s", p, strerror(errno));
        if (!(*s = c)) break;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return k3c_errf(err, K3C_EIO, "%s: not a directory", dir);
    return K3C_OK;
}

static void manifest_split(k3c_sbuf *s, const builder *b) {
    k3c_sbuf_printf(s, "    \"%s\": {\"docs\": %lld, \"tokens\": %lld, \"shards\": [", b->split, (long long)b->docs,
                    (long long)b->tokens);
    for (int i = 0; i < b->n_shards; i++)
        k3c_sbuf_printf(s, "%s\n      {\"file\": \"%s-%05d%s\", \"docs\": %lld, \"tokens\": %lld}", i ? "," : "",
                        b->split, i, K3C_SHARD_EXT, (long long)b->rec[i][0], (long long)b->rec[i][1]);
    k3c_sbuf_printf(s, "%s]}", b->n_shards ? "\n    " : "");
}

static int write_manifest(run *r, const char *source, k3c_err *err) {
    const k3c_prepare_opts *o = r->o;
    char vabs[4096];
    if (!realpath(o->vocab_path, vabs)) snprintf(vabs, sizeof vabs, "%s", o->vocab_path);
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    k3c_sbuf_printf(&s, "{\n  \"format\": \"k3c-shards\",\n  \"version\": 1,\n  \"source\": ");
    k3c_sbuf_json_string(&s, source, strlen(source));
    k3c_sbuf_printf(&s, ",\n  \"vocab\": ");
    k3c_sbuf_json_string(&s, vabs, strlen(vabs));
    k3c_sbuf_printf(&s, ",\n  \"vocab_size\": %d,\n  \"pattern\": \"%s\",\n  \"token_bytes\": %d,\n  \"eod\": ",
                    k3c_tok_n_vocab(r->tok), k3c_tok_pattern_name(o->pattern),
                    k3c_tok_n_vocab(r->tok) <= 65536 ? 2 : 4);
    if (r->eod_id >= 0)
        k3c_sbuf_json_string(&s, o->eod ? o->eod : "<|endoftext|>", strlen(o->eod ? o->eod : "<|endoftext|>"));
    else
        k3c_sbuf_printf(&s, "null");
    k3c_sbuf_printf(&s, ",\n  \"eod_id\": %d,\n  \"seed\": %llu,\n  \"val_fraction\": ", r->eod_id,
                    (unsigned long long)o->seed);
    k3c_sbuf_json_number(&s, o->val_fraction);
    k3c_sbuf_printf(&s, ",\n  \"doc_split\": \"%s\",\n  \"jsonl_field\": ", split_name(o->doc_split));
    k3c_sbuf_json_string(&s, o->jsonl_field ? o->jsonl_field : "text",
                         strlen(o->jsonl_field ? o->jsonl_field : "text"));
    k3c_sbuf_printf(&s, ",\n  \"docs\": %lld,\n  \"tokens\": %lld,\n  \"bytes\": %lld,\n  \"files\": [",
                    (long long)(r->b[0].docs + r->b[1].docs), (long long)(r->b[0].tokens + r->b[1].tokens),
                    (long long)r->res->bytes);
    for (int i = 0; i < r->files.n; i++) {
        k3c_sbuf_printf(&s, "%s\n    {\"path\": ", i ? "," : "");
        k3c_sbuf_json_string(&s, r->files.p[i], strlen(r->files.p[i]));
        k3c_sbuf_printf(&s, ", \"format\": \"%s\", \"bytes\": %lld, \"docs\": %lld}",
                        format_of(r->files.p[i], o->format) == K3C_DATA_FORMAT_JSONL ? "jsonl" : "text",
                        (long long)r->file_bytes[i], (long long)r->file_docs[i]);
    }
    k3c_sbuf_printf(&s, "\n  ],\n  \"splits\": {\n");
    manifest_split(&s, &r->b[0]);
    k3c_sbuf_printf(&s, ",\n");
    manifest_split(&s, &r->b[1]);
    k3c_sbuf_printf(&s, "\n  }\n}\n");
    int rc;
    if (!s.ok)
        rc = k3c_errf(err, K3C_ENOMEM, "manifest: out of memory");
    else {
        char path[4200];
        snprintf(path, sizeof path, "%s/manifest.json", o->out_dir);
        rc = k3c_write_file_atomic(path, s.buf, s.len, err);
    }
    k3c_sbuf_free(&s);
    return rc;
}

static int load_vocab(run *r, k3c_err *err) {
    const k3c_prepare_opts *o = r->o;
    int rc = k3c_tok_load_with_specials(o->vocab_path, o->pattern, 0, &r->tok, err);
    if (rc) return rc;
    const char *eod = o->eod ? o->eod : "<|endoftext|>";
    r->eod_id = -1;
    if (!*eod) return K3C_OK;
    r->eod_id = k3c_tok_special_id(r->tok, eod);
    if (r->eod_id < 0)
        return k3c_errf(
            err, K3C_ENOTFOUND,
            "%s: no special token \"%s\" (specials come from %s.specials.json; choose another with --eod, or "
            "--eod none)",
            o->vocab_path, eod, o->vocab_path);
    return K3C_OK;
}

static int check_opts(const k3c_prepare_opts *o, k3c_err *err) {
    if (!o->vocab_path || !o->out_dir || o->n_inputs <= 0 || !o->inputs)
        return k3c_errf(err, K3C_EINVAL, "prepare: needs a vocabulary, inputs and an output directory");
    if (!(o->val_fraction >= 0 && o->val_fraction <= 1))
        return k3c_errf(err, K3C_EINVAL, "prepare: val fraction %g outside [0, 1]", o->val_fraction);
    if (o->shard_tokens < 0) return k3c_errf(err, K3C_EINVAL, "prepare: shard tokens must be positive");
    if (o->doc_split < 0 || o->doc_split > 2 || o->format < 0 || o->format > 2)
        return k3c_errf(err, K3C_EINVAL, "prepare: unknown format or doc split");
    return K3C_OK;
}

static int run_all(run *r, const char *source, k3c_err *err) {
    const k3c_prepare_opts *o = r->o;
    int rc = load_vocab(r, err);
    for (int i = 0; !rc && i < o->n_inputs; i++) rc = expand(o->inputs[i], &r->files, 0, err);
    if (!rc && r->files.n == 0) rc = k3c_errf(err, K3C_ENOTFOUND, "prepare: the inputs hold no files");
    if (!rc) rc = mkdir_p(o->out_dir, err);
    if (rc) return rc;
    r->file_bytes = calloc((size_t)r->files.n, sizeof *r->file_bytes);
    r->file_docs = calloc((size_t)r->files.n, sizeof *r->file_docs);
    if (!r->file_bytes || !r->file_docs) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    int64_t *disk = r->file_bytes; /* on-disk sizes first (progress), decompressed sizes once read */
    for (int i = 0; i < r->files.n; i++) {
        struct stat st;
        disk[i] = stat(r->files.p[i], &st) == 0 ? (int64_t)st.st_size : 0;
        r->disk_total += disk[i];
    }
    r->split_seed = k3c_mix64(o->seed ^ 0x73706c6974ull /* "split" */);
    for (int i = 0; i < 2; i++) {
        r->b[i] = (builder){.dir = o->out_dir,
                            .split = i ? "val" : "train",
                            .vocab = k3c_tok_n_vocab(r->tok),
                            .limit = o->shard_tokens ? o->shard_tokens : DEFAULT_SHARD_TOKENS};
    }
    for (int i = 0; !rc && i < r->files.n; i++) {
        int64_t sz = disk[i];
        rc = process_file(r, i, sz, err);
        r->disk_done += sz;
        report(r, r->disk_done);
    }
    if (!rc && r->b[0].docs + r->b[1].docs == 0)
        rc = k3c_errf(err, K3C_ENOTFOUND, "prepare: the inputs hold no documents");
    if (!rc && o->val_fraction > 0 && r->b[1].docs == 0 && r->b[0].docs >= 2)
        rc = builder_move_last(&r->b[0], &r->b[1], err);
    for (int i = 0; !rc && i < 2; i++) rc = builder_flush(&r->b[i], err);
    for (int i = 0; !rc && i < 2; i++) remove_stale(&r->b[i]);
    if (!rc) rc = write_manifest(r, source, err);
    return rc;
}

int k3c_data_prepare(const k3c_prepare_opts *o, k3c_prepare_result *res, k3c_err *err) {
    k3c_prepare_result dummy;
    res = res ? res : &dummy;
    memset(res, 0, sizeof *res);
    int rc = check_opts(o, err);
    if (rc) return rc;
    double t0 = k3c_now();
    char source[64], d[4096];
    snprintf(d, sizeof d, "%s", o->source && *o->source ? o->source : o->out_dir);
    for (size_t l = strlen(d); l > 1 && d[l - 1] == '/'; l--) d[l - 1] = 0;
    const char *name = o->source && *o->source ? d : strrchr(d, '/') ? strrchr(d, '/') + 1 : d;
    if (strlen(name) >= sizeof source) /* the loader and the run config keep names in 64 bytes */
        return k3c_errf(err, K3C_EINVAL, "prepare: source name '%s' longer than %zu bytes (use --source)", name,
                        sizeof source - 1);
    memcpy(source, name, strlen(name) + 1);
    run r = {.o = o, .res = res};
    rc = run_all(&r, source, err);
    if (!rc) {
        res->n_files = r.files.n;
        for (int i = 0; i < 2; i++)
            res->docs[i] = r.b[i].docs, res->tokens[i] = r.b[i].tokens, res->shards[i] = r.b[i].n_shards;
        res->vocab_size = k3c_tok_n_vocab(r.tok);
        res->eod_id = r.eod_id;
    }
    res->seconds = k3c_now() - t0;
    for (int i = 0; i < 2; i++) builder_free(&r.b[i]);
    pl_free(&r.files);
    free(r.file_bytes);
    free(r.file_docs);
    k3c_tok_free(r.tok);
    return rc;
}
