/* checksum.c — FNV-1a 64 (token shards, checkpoint files) and a checkpoint directory's checksums.json: one checksum per
 * file, written by the trainer with the checkpoint and verified by every reader of the directory (docs/TRAINING.md §8, docs/FORMATS.md §11). */
#include "base/base.h"
#include "base/json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t k3c_fnv1a64(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

int k3c_file_fnv1a64(const char *path, uint64_t *h, k3c_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return k3c_errf(err, errno == ENOENT ? K3C_ENOTFOUND : K3C_EIO, "%s: %s", path, strerror(errno));
    static const size_t chunk = 1 << 20;
    unsigned char *buf = malloc(chunk);
    *h = K3C_FNV1A64_INIT;
    size_t got;
    while (buf && (got = fread(buf, 1, chunk, f)) > 0) *h = k3c_fnv1a64(buf, got, *h);
    int bad = !buf || ferror(f);
    free(buf);
    fclose(f);
    return bad ? k3c_errf(err, buf ? K3C_EIO : K3C_ENOMEM, "%s: cannot read", path) : K3C_OK;
}

int k3c_checksums_write(const char *dir, const char *const *files, int n, k3c_err *err) {
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    k3c_sbuf_printf(&s, "{\"algorithm\": \"fnv1a64\", \"files\": {");
    int rc = K3C_OK;
    for (int i = 0; i < n && !rc; i++) {
        char p[4200];
        uint64_t h;
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        if ((rc = k3c_file_fnv1a64(p, &h, err))) break;
        k3c_sbuf_printf(&s, "%s\n  ", i ? "," : "");
        k3c_sbuf_json_string(&s, files[i], strlen(files[i]));
        k3c_sbuf_printf(&s, ": \"%016llx\"", (unsigned long long)h);
    }
    k3c_sbuf_printf(&s, "}}\n");
    if (!rc && !s.ok) rc = k3c_errf(err, K3C_ENOMEM, "%s: out of memory", dir);
    if (!rc) {
        char p[4200];
        snprintf(p, sizeof p, "%s/" K3C_CHECKSUMS_FILE, dir);
        rc = k3c_write_file_atomic(p, s.buf, s.len, err);
    }
    k3c_sbuf_free(&s);
    return rc;
}

int k3c_checksums_verify(const char *dir, int *n_files, k3c_err *err) {
    char p[4200], *text;
    size_t len;
    if (n_files) *n_files = -1;
    snprintf(p, sizeof p, "%s/" K3C_CHECKSUMS_FILE, dir);
    FILE *probe = fopen(p, "rb");
    if (!probe) return K3C_OK; /* not written by k3c's trainer: nothing to verify */
    fclose(probe);
    int rc = k3c_read_file(p, &text, &len, err);
    if (rc) return rc;
    k3c_json *j = NULL;
    rc = k3c_json_parse(text, len, p, &j, err);
    free(text);
    if (rc) return rc;
    const k3c_json *alg = k3c_json_get(j, "algorithm"), *files = k3c_json_get(j, "files");
    if (!alg || alg->type != K3C_JSON_STRING || strcmp(alg->string, "fnv1a64") || !files ||
        files->type != K3C_JSON_OBJECT)
        rc = k3c_errf(err, K3C_EFORMAT, "%s: needs \"algorithm\": \"fnv1a64\" and a \"files\" object", p);
    for (size_t i = 0; !rc && i < files->n; i++) {
        const char *name = files->keys[i];
        const k3c_json *v = &files->items[i];
        unsigned long long want;
        char tail;
        if (v->type != K3C_JSON_STRING || sscanf(v->string, "%16llx%c", &want, &tail) != 1 || strchr(name, '/')) {
            rc = k3c_errf(err, K3C_EFORMAT, "%s: files.%s: expected a 16-digit hex checksum of a file beside it", p,
                          name);
            break;
        }
        char f[4400];
        uint64_t got;
        snprintf(f, sizeof f, "%s/%s", dir, name);
        if ((rc = k3c_file_fnv1a64(f, &got, err))) break;
        if (got != want)
            rc = k3c_errf(err, K3C_EFORMAT,
                          "%s: checksum mismatch (stored %016llx in " K3C_CHECKSUMS_FILE ", computed %016llx): the "
                          "file is corrupt",
                          f, want, (unsigned long long)got);
    }
    if (!rc && n_files) *n_files = (int)files->n;
    k3c_json_free(j);
    return rc;
}
