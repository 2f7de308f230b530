/* checkpoint.c — training checkpoints written atomically (temporary directory + rename + `latest` pointer) so that a
 * crash at any point leaves the previous checkpoint loadable; the model part is a plain Hugging Face directory. */
#include "tok/tok.h"
#include "train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int copy_file(const char *src, const char *dst, k3c_err *err) {
    char *data;
    size_t n;
    int rc = k3c_read_file(src, &data, &n, err);
    if (rc) return rc;
    rc = k3c_write_file_atomic(dst, data, n, err);
    free(data);
    return rc;
}

static int remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    return rmdir(dir);
}

/* Deletes step_* directories older than the newest `keep` up to step `upto` (the one just saved); later steps left by
 * another run are not counted and not touched. */
static void prune(const char *out_dir, int keep, long long upto) {
    DIR *d = opendir(out_dir);
    if (!d) return;
    long long steps[1024];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 1024) {
        long long s;
        char tail;
        if (sscanf(e->d_name, "step_%lld%c", &s, &tail) == 1 && s <= upto) steps[n++] = s;
    }
    closedir(d);
    for (int i = 0; i < n; i++) {
        int newer = 0;
        for (int j = 0; j < n; j++) newer += steps[j] > steps[i];
        if (newer >= keep) {
            char p[4096];
            snprintf(p, sizeof p, "%s/step_%08lld", out_dir, steps[i]);
            remove_tree(p);
        }
    }
}

int k3c_train_ckpt_save(const char *out_dir, int64_t step, const k3c_train_ckpt *ck, int keep, k3c_err *err) {
    char tmp[4096], fin[4096], p[4200];
    snprintf(tmp, sizeof tmp, "%s/.tmp_step_%08lld", out_dir, (long long)step);
    snprintf(fin, sizeof fin, "%s/step_%08lld", out_dir, (long long)step);
    remove_tree(tmp);
    if (mkdir(tmp, 0755) != 0) return k3c_errf(err, K3C_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    snprintf(p, sizeof p, "%s/config.json", tmp);
    int rc = k3c_config_save(&ck->model->cfg, p, err);
    if (!rc) {
        snprintf(p, sizeof p, "%s/model.safetensors", tmp);
        rc = k3c_model_save_f32(ck->model, p, err);
    }
    if (!rc) {
        snprintf(p, sizeof p, "%s/optimizer.safetensors", tmp);
        k3c_st_entry e = {"state", K3C_F32, 1, {(int64_t)ck->optim_numel}, ck->optim_state};
        rc = k3c_st_write(p, &e, 1, NULL, err);
    }
    if (!rc) {
        snprintf(p, sizeof p, "%s/trainer_state.json", tmp);
        rc = k3c_write_file_atomic(p, ck->trainer_state, strlen(ck->trainer_state), err);
    }
    if (!rc && ck->vocab && ck->vocab[0]) {
        snprintf(p, sizeof p, "%s/" K3C_TOK_DIR_VOCAB, tmp);
        rc = copy_file(ck->vocab, p, err);
        char src[4200];
        snprintf(src, sizeof src, "%s.specials.json", ck->vocab);
        if (!rc && access(src, R_OK) == 0) {
            snprintf(p, sizeof p, "%s/" K3C_TOK_DIR_VOCAB ".specials.json", tmp);
            rc = copy_file(src, p, err);
        }
    }
    const char *files[8] = {"config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"};
    int n_files = 4;
    if (!rc && ck->vocab && ck->vocab[0]) {
        files[n_files++] = K3C_TOK_DIR_VOCAB;
        snprintf(p, sizeof p, "%s/" K3C_TOK_DIR_VOCAB ".specials.json", tmp);
        if (access(p, F_OK) == 0) files[n_files++] = K3C_TOK_DIR_VOCAB ".specials.json";
        files[n_files++] = K3C_TOK_DIR_SPEC;
        char body[96];
        int len = snprintf(body, sizeof body, "{\"vocab\": \"" K3C_TOK_DIR_VOCAB "\", \"pattern\": \"%s\"}\n",
                           ck->pattern ? ck->pattern : "cl100k");
        snprintf(p, sizeof p, "%s/" K3C_TOK_DIR_SPEC, tmp);
        rc = k3c_write_file_atomic(p, body, (size_t)len, err);
    }
    if (!rc) rc = k3c_checksums_write(tmp, files, n_files, err); /* last: it covers every file above */
    if (rc) {
        remove_tree(tmp);
        return k3c_err_wrap(err, "checkpoint %s", fin);
    }
    remove_tree(fin); /* a re-run of the same step replaces it */
    if (rename(tmp, fin) != 0) return k3c_errf(err, K3C_EIO, "%s: rename failed: %s", fin, strerror(errno));
    char name[64];
    int n = snprintf(name, sizeof name, "step_%08lld\n", (long long)step);
    snprintf(p, sizeof p, "%s/latest", out_dir);
    rc = k3c_write_file_atomic(p, name, (size_t)n, err);
    if (!rc) prune(out_dir, keep, (long long)step);
    return rc;
}

void k3c_train_ckpt_clean(const char *out_dir) {
    DIR *d = opendir(out_dir);
    if (!d) return;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d)))
        if (strncmp(e->d_name, ".tmp_step_", 10) == 0) {
            snprintf(p, sizeof p, "%s/%s", out_dir, e->d_name);
            remove_tree(p);
        }
    closedir(d);
}

int k3c_train_ckpt_candidates(const char *out_dir, int64_t *steps, int cap, k3c_err *err) {
    char latest[4096];
    int rc = k3c_train_ckpt_latest(out_dir, latest, sizeof latest, err);
    if (rc == K3C_ENOTFOUND) return 0;
    if (rc) return rc;
    long long newest;
    char tail;
    const char *base = strrchr(latest, '/') + 1;
    if (sscanf(base, "step_%lld%c", &newest, &tail) != 1)
        return k3c_errf(err, K3C_EFORMAT, "%s/latest: names \"%s\", not a step_N directory", out_dir, base);
    DIR *d = opendir(out_dir);
    if (!d) return k3c_errf(err, K3C_EIO, "%s: %s", out_dir, strerror(errno));
    int n = 0;
    struct dirent *e;
    steps[n++] = newest;
    while ((e = readdir(d)) && n < cap) {
        long long s;
        if (sscanf(e->d_name, "step_%lld%c", &s, &tail) == 1 && s < newest) steps[n++] = s;
    }
    closedir(d);
    for (int i = 2; i < n; i++) /* newest first */
        for (int j = i; j > 1 && steps[j - 1] < steps[j]; j--) {
            int64_t t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    return n;
}

int k3c_train_ckpt_latest(const char *out_dir, char *path, size_t n, k3c_err *err) {
    char p[4096], *text;
    size_t len;
    snprintf(p, sizeof p, "%s/latest", out_dir);
    if (access(p, R_OK) != 0) return k3c_errf(err, K3C_ENOTFOUND, "%s: no checkpoint to resume from", p);
    int rc = k3c_read_file(p, &text, &len, err);
    if (rc) return rc;
    while (len && (text[len - 1] == '\n' || text[len - 1] == ' ')) text[--len] = 0;
    if (!len || strchr(text, '/')) {
        free(text);
        return k3c_errf(err, K3C_EFORMAT, "%s: malformed", p);
    }
    snprintf(path, n, "%s/%s", out_dir, text);
    free(text);
    return K3C_OK;
}

int k3c_train_ckpt_load_state(const char *dir, float *optim_state, size_t numel, char **trainer_state, k3c_err *err) {
    char p[4200];
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    k3c_safetensors *st;
    int rc = k3c_st_open(p, &st, err);
    if (rc) return rc;
    const k3c_st_tensor *t = k3c_st_find(st, "state");
    if (!t)
        rc = k3c_errf(err, K3C_EFORMAT, "%s: no tensor 'state'", p);
    else
        rc = k3c_st_read_f32(t, optim_state, numel, err);
    k3c_st_close(st);
    if (rc) return rc;
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    return k3c_read_file(p, trainer_state, NULL, err);
}
