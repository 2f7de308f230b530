/* checkpoint.c — training checkpoints written atomically (temporary directory + rename + `latest` pointer) so that a
 * crash at any point leaves the previous checkpoint loadable; the model part is a plain Hugging Face directory. */
#include "base/check.h"
#include "base/json.h"
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

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int has_suffix(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static void free_names(char **names, int n) {
    for (int i = 0; names && i < n; i++) free(names[i]);
    free(names);
}

/* The files of dir whose names start with prefix and end with suffix, sorted; returns how many (or an error). */
static int list_files(const char *dir, const char *prefix, const char *suffix, char ***out, k3c_err *err) {
    DIR *d = opendir(dir);
    if (!d) return k3c_errf(err, K3C_EIO, "%s: %s", dir, strerror(errno));
    int n = 0, cap = 0, rc = K3C_OK;
    char **names = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || strncmp(e->d_name, prefix, strlen(prefix)) || !has_suffix(e->d_name, suffix) ||
            strstr(e->d_name, ".tmp."))
            continue;
        if (n == cap) {
            char **more = realloc(names, sizeof *names * (size_t)(cap = 2 * cap + 16));
            if (!more) break;
            names = more;
        }
        if (!(names[n] = strdup(e->d_name))) break;
        n++;
    }
    if (e) rc = k3c_errf(err, K3C_ENOMEM, "%s: out of memory listing the files", dir);
    closedir(d);
    if (rc) {
        free_names(names, n);
        return rc;
    }
    if (n) qsort(names, (size_t)n, sizeof *names, cmp_name);
    *out = names;
    return n;
}

/* Every rank learns whether any failed: rc when this one did, else an error naming `what` when another did. */
static int agree(k3c_comm *c, int rc, const char *what, k3c_err *err) {
    if (!c) return rc;
    int32_t bad = rc != K3C_OK, any = 1;
    k3c_err mine = {0};
    int e = k3c_comm_allreduce(c, &bad, &any, 1, K3C_I32, K3C_COMM_MAX, NULL, rc ? &mine : err);
    if (rc || e) return rc ? rc : e;
    return any ? k3c_errf(err, K3C_EIO, "%s: another rank failed to write its part (its own message says why)", what)
               : K3C_OK;
}

/* config.json, trainer_state.json and the tokenizer (one process, or rank 0). */
static int write_common(const char *tmp, const k3c_train_ckpt *ck, k3c_err *err) {
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", tmp);
    CHECK_RC(k3c_config_save(&ck->model->cfg, p, err));
    snprintf(p, sizeof p, "%s/trainer_state.json", tmp);
    CHECK_RC(k3c_write_file_atomic(p, ck->trainer_state, strlen(ck->trainer_state), err));
    if (!ck->vocab || !ck->vocab[0]) return K3C_OK;
    snprintf(p, sizeof p, "%s/" K3C_TOK_DIR_VOCAB, tmp);
    CHECK_RC(copy_file(ck->vocab, p, err));
    char src[4200];
    snprintf(src, sizeof src, "%s.specials.json", ck->vocab);
    snprintf(p, sizeof p, "%s/" K3C_TOK_DIR_VOCAB ".specials.json", tmp);
    if (access(src, R_OK) == 0) CHECK_RC(copy_file(src, p, err));
    char body[96];
    int len = snprintf(body, sizeof body, "{\"vocab\": \"" K3C_TOK_DIR_VOCAB "\", \"pattern\": \"%s\"}\n",
                       ck->pattern ? ck->pattern : "cl100k");
    snprintf(p, sizeof p, "%s/" K3C_TOK_DIR_SPEC, tmp);
    return k3c_write_file_atomic(p, body, (size_t)len, err);
}

/* This rank's weights: the whole model (one process), or entries [w0, w1) to its model file. */
static int write_weights(const char *tmp, const k3c_train_ckpt *ck, k3c_err *err) {
    char p[4200];
    if (!ck->comm) {
        snprintf(p, sizeof p, "%s/model.safetensors", tmp);
        return k3c_model_save_f32(ck->model, p, err);
    }
    if (ck->w0 >= ck->w1) return K3C_OK;
    if (ck->w_parts == 1)
        snprintf(p, sizeof p, "%s/model.safetensors", tmp);
    else
        snprintf(p, sizeof p, "%s/model-%05d-of-%05d.safetensors", tmp, ck->w_part + 1, ck->w_parts);
    if (ck->w_host) return k3c_params_write(ck->table, ck->w_host, p, ck->w0, ck->w1, ck->w_experts_only, err);
    return k3c_model_save_entries_f32(ck->model, p, ck->w0, ck->w1, ck->w_experts_only, err);
}

static size_t state_end(const k3c_optim *o, int i) { return i < o->n_entries ? o->state_off[i] : o->state_numel; }

/* Stacked entry p's state (len floats: blocks of numel — Muon's momentum, AdamW's m then v) → per expert, its blocks'
 * slices one after another (dst, len floats): expert e's tensor is dst + e·len/stack. */
static void slices_of(const k3c_param *p, size_t len, const float *src, float *dst) {
    const size_t slice = (size_t)k3c_param_slice_numel(p), blocks = len / (size_t)p->numel;
    for (size_t e = 0; e < (size_t)p->stack; e++)
        for (size_t b = 0; b < blocks; b++)
            memcpy(dst + (e * blocks + b) * slice, src + b * (size_t)p->numel + e * slice, sizeof(float) * slice);
}

/* This rank's optimizer state: the single tensor "state" (one process), or one tensor per entry of `mine` that has
 * state, named by the entry (a stacked entry: one per held expert, under its name), to
 * optimizer-<rank+1>-of-<ranks>.safetensors. */
static int write_optim(const char *tmp, const k3c_train_ckpt *ck, k3c_err *err) {
    char p[4200];
    if (!ck->comm) {
        snprintf(p, sizeof p, "%s/optimizer.safetensors", tmp);
        k3c_st_entry e = {"state", K3C_F32, 1, {(int64_t)ck->optim_numel}, ck->optim_state};
        return k3c_st_write(p, &e, 1, NULL, err);
    }
    const k3c_param_table *t = ck->table ? ck->table : &ck->model->table;
    const k3c_optim *o = ck->opt;
    snprintf(p, sizeof p, "%s/optimizer-%05d-of-%05d.safetensors", tmp, ck->comm->rank + 1, ck->comm->size);
    size_t held = 0;
    int n = 0;
    for (int i = 0; i < t->n; i++)
        if (ck->mine[i]) held += state_end(o, i + 1) - o->state_off[i], n += t->p[i].stack ? (int)t->p[i].stack : 1;
    if (held != ck->optim_numel)
        return k3c_errf(err, K3C_EINVAL, "%s: %zu state floats given for entries that hold %zu", p, ck->optim_numel,
                        held);
    k3c_st_entry *ent = calloc((size_t)n + 1, sizeof *ent);
    char(*names)[K3C_PARAM_NAME + 16] = calloc((size_t)n + 1, sizeof *names);
    float *sliced = malloc(sizeof(float) * (held + 1)); /* the experts' tensors, each contiguous */
    if (!ent || !names || !sliced) {
        free(ent), free(names), free(sliced);
        return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", p);
    }
    n = 0;
    size_t at = 0;
    for (int i = 0; i < t->n; i++) {
        const k3c_param *q = &t->p[i];
        const size_t len = state_end(o, i + 1) - o->state_off[i];
        if (!ck->mine[i] || !len) continue;
        if (!q->stack) {
            ent[n++] = (k3c_st_entry){q->name, K3C_F32, 1, {(int64_t)len}, ck->optim_state + at};
        } else {
            slices_of(q, len, ck->optim_state + at, sliced + at);
            for (int64_t e = 0; e < q->stack; e++, n++) {
                k3c_params_name(q, e, names[n], sizeof names[n]);
                ent[n] = (k3c_st_entry){names[n],
                                        K3C_F32,
                                        1,
                                        {(int64_t)len / q->stack},
                                        sliced + at + (size_t)e * (len / (size_t)q->stack)};
            }
        }
        at += len;
    }
    static const char *const meta[] = {"format", "k3c-optimizer-shard", NULL};
    int rc = k3c_st_write(p, ent, n, meta, err);
    free(ent), free(names), free(sliced);
    return rc;
}

/* dir/<index> (Hugging Face's model.safetensors.index.json form) mapping every tensor of the files
 * dir/<prefix>*.safetensors to its file; nothing when there are none. */
static int write_index(const char *dir, const char *prefix, const char *index, k3c_err *err) {
    char **names = NULL, p[4200];
    int n = list_files(dir, prefix, ".safetensors", &names, err), rc = K3C_OK;
    if (n <= 0) return n;
    k3c_sbuf sb, map;
    k3c_sbuf_init(&sb);
    k3c_sbuf_init(&map);
    uint64_t total = 0;
    for (int f = 0; f < n && !rc; f++) {
        k3c_safetensors *st;
        snprintf(p, sizeof p, "%s/%s", dir, names[f]);
        if ((rc = k3c_st_open(p, &st, err))) break;
        for (int i = 0; i < k3c_st_count(st); i++) {
            const k3c_st_tensor *t = k3c_st_at(st, i);
            k3c_sbuf_printf(&map, "%s\n    ", map.len ? "," : "");
            k3c_sbuf_json_string(&map, t->name, strlen(t->name));
            k3c_sbuf_printf(&map, ": \"%s\"", names[f]);
            total += t->nbytes;
        }
        k3c_st_close(st);
    }
    k3c_sbuf_printf(&sb, "{\n  \"metadata\": {\"total_size\": %llu},\n  \"weight_map\": {%s\n  }\n}\n",
                    (unsigned long long)total, map.buf ? map.buf : "");
    snprintf(p, sizeof p, "%s/%s", dir, index);
    if (!rc)
        rc = sb.ok && map.ok ? k3c_write_file_atomic(p, sb.buf, sb.len, err)
                             : k3c_errf(err, K3C_ENOMEM, "%s: out of memory", p);
    k3c_sbuf_free(&sb);
    k3c_sbuf_free(&map);
    free_names(names, n);
    return rc;
}

/* checksums.json over every file of the directory (last: it covers every file the ranks wrote). */
static int write_checksums(const char *dir, k3c_err *err) {
    char **names = NULL;
    int n = list_files(dir, "", "", &names, err);
    if (n < 0) return n;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], K3C_CHECKSUMS_FILE))
            names[k++] = names[i];
        else
            free(names[i]);
    int rc = k3c_checksums_write(dir, (const char *const *)names, k, err);
    free_names(names, k);
    return rc;
}

/* The complete directory tmp becomes fin and out_dir/latest names it; older checkpoints beyond `keep` go. */
static int commit(const char *out_dir, const char *tmp, const char *fin, int64_t step, int keep, k3c_err *err) {
    remove_tree(fin); /* a re-run of the same step replaces it */
    if (rename(tmp, fin) != 0) return k3c_errf(err, K3C_EIO, "%s: rename failed: %s", fin, strerror(errno));
    char name[64], p[4200];
    int n = snprintf(name, sizeof name, "step_%08lld\n", (long long)step);
    snprintf(p, sizeof p, "%s/latest", out_dir);
    CHECK_RC(k3c_write_file_atomic(p, name, (size_t)n, err));
    prune(out_dir, keep, (long long)step);
    return K3C_OK;
}

/* Rank 0's part after every rank wrote its own: the indices, the checksums, the rename. */
static int finish(const char *out_dir, const char *tmp, const char *fin, int64_t step, int keep, k3c_err *err) {
    CHECK_RC(write_index(tmp, "model-", "model.safetensors.index.json", err));
    CHECK_RC(write_index(tmp, "optimizer-", "optimizer.safetensors.index.json", err));
    CHECK_RC(write_checksums(tmp, err));
    return commit(out_dir, tmp, fin, step, keep, err);
}

int k3c_train_ckpt_save(const char *out_dir, int64_t step, const k3c_train_ckpt *ck, int keep, k3c_err *err) {
    char tmp[4096], fin[4096];
    snprintf(tmp, sizeof tmp, "%s/.tmp_step_%08lld", out_dir, (long long)step);
    snprintf(fin, sizeof fin, "%s/step_%08lld", out_dir, (long long)step);
    const int root = !ck->comm || ck->comm->rank == 0;
    int rc = ck->failed;
    if (root && !rc) {
        remove_tree(tmp);
        if (mkdir(tmp, 0755) != 0) rc = k3c_errf(err, K3C_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    rc = agree(ck->comm, rc, tmp, err); /* the directory exists before any rank writes into it */
    if (!rc && root) rc = write_common(tmp, ck, err);
    if (!rc) rc = write_weights(tmp, ck, err);
    if (!rc) rc = write_optim(tmp, ck, err);
    rc = agree(ck->comm, rc, tmp, err); /* every part written (a barrier), or the save fails on every rank */
    if (!rc && root) rc = finish(out_dir, tmp, fin, step, keep, err);
    if (rc && root) remove_tree(tmp);
    rc = agree(ck->comm, rc, fin, err);
    return rc ? k3c_err_wrap(err, "checkpoint %s", fin) : K3C_OK;
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

/* Stacked entry p's state for the experts it holds (dst, len floats as o lays it out) from the whole model's entry
 * (src: its blocks of all `experts` slices). */
static void held_from_whole(const k3c_param *p, size_t len, int64_t experts, const float *src, float *dst) {
    const size_t slice = (size_t)k3c_param_slice_numel(p), blocks = len / (size_t)p->numel;
    for (size_t b = 0; b < blocks; b++)
        memcpy(dst + b * (size_t)p->numel, src + b * slice * (size_t)experts + (size_t)p->stack0 * slice,
               sizeof(float) * (size_t)p->numel);
}

/* Floats of entry i's state in the whole model's layout (a stacked entry of all the model's experts, a
 * tensor-parallel share's whole tensor). */
static size_t whole_len(const k3c_param_table *t, const k3c_optim *o, int i) {
    const k3c_param *p = &t->p[i];
    const size_t len = state_end(o, i + 1) - o->state_off[i];
    if (p->tp_share) return len / (size_t)p->numel * (size_t)p->whole_numel;
    return p->stack ? len / (size_t)p->stack * (size_t)t->experts : len;
}

/* A tensor-parallel share's state (dst, len floats: its blocks) from the whole entry's (src: the same blocks whole). */
static void share_from_whole(const k3c_param_table *t, const k3c_param *p, size_t len, const float *src, float *dst) {
    for (size_t b = 0; b < len / (size_t)p->numel; b++)
        k3c_param_share_copy(p, t->res.tp_rank, sizeof(float), (void *)(src + b * (size_t)p->whole_numel),
                             dst + b * (size_t)p->numel, 0);
}

/* The single-process file: the entries of `mine` from the one tensor "state" (float32, the whole model's layout). */
static int load_single(const char *p, const k3c_param_table *tab, const k3c_optim *o, const uint8_t *mine, float *state,
                       k3c_err *err) {
    k3c_safetensors *st;
    CHECK_RC(k3c_st_open(p, &st, err));
    const k3c_st_tensor *t = k3c_st_find(st, "state");
    size_t whole = 0;
    for (int i = 0; i < tab->n; i++) whole += whole_len(tab, o, i);
    int rc = K3C_OK;
    if (!t)
        rc = k3c_errf(err, K3C_EFORMAT, "%s: no tensor 'state'", p);
    else if (t->dtype != K3C_F32 || t->nbytes != sizeof(float) * whole)
        rc = k3c_errf(err, K3C_EFORMAT, "%s: tensor 'state' holds %zu bytes, the run's optimizer needs %zu float32", p,
                      t->nbytes, whole);
    size_t at = 0, from = 0;
    for (int i = 0; !rc && i < tab->n; i++) {
        const size_t len = state_end(o, i + 1) - o->state_off[i];
        if (!mine || mine[i]) {
            if (tab->p[i].stack)
                held_from_whole(&tab->p[i], len, tab->experts, (const float *)t->data + from, state + at);
            else if (tab->p[i].tp_share)
                share_from_whole(tab, &tab->p[i], len, (const float *)t->data + from, state + at);
            else
                memcpy(state + at, (const float *)t->data + from, sizeof(float) * len);
            at += len;
        }
        from += whole_len(tab, o, i);
    }
    k3c_st_close(st);
    return rc;
}

typedef struct {
    const char *dir, *index; /* the checkpoint, the index's path */
    const k3c_json *map;     /* its weight_map */
    k3c_safetensors **open;  /* [map->n]: the files opened so far, by the index of their first entry */
} shard_reader;

/* The open shard file holding entry `name` (opened once, on first use). */
static int shard_of(shard_reader *r, const char *name, k3c_safetensors **out, k3c_err *err) {
    const k3c_json *f = k3c_json_get(r->map, name);
    if (!f && !err) return K3C_ENOTFOUND; /* a probe */
    if (!f) return k3c_errf(err, K3C_EFORMAT, "%s: weight_map has no entry '%s' (its optimizer state)", r->index, name);
    if (f->type != K3C_JSON_STRING || strchr(f->string, '/') || !f->string[0])
        return k3c_errf(err, K3C_EFORMAT, "%s: weight_map.%s: expected a file name beside the index", r->index, name);
    size_t k = 0; /* the first entry naming the same file: its slot holds the open file */
    while (r->map->items[k].type != K3C_JSON_STRING || strcmp(r->map->items[k].string, f->string)) k++;
    if (!r->open[k]) {
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", r->dir, f->string);
        CHECK_RC(k3c_st_open(p, &r->open[k], err));
    }
    *out = r->open[k];
    return K3C_OK;
}

/* One entry's state from its shard: a float32 tensor of exactly `len` floats. */
static int load_entry(shard_reader *r, const char *name, size_t len, float *dst, k3c_err *err) {
    k3c_safetensors *st = NULL;
    CHECK_RC(shard_of(r, name, &st, err));
    const k3c_st_tensor *t = k3c_st_find(st, name);
    if (!t)
        return k3c_errf(err, K3C_EFORMAT, "%s/%s: no tensor '%s' (%s maps it there)", r->dir,
                        k3c_json_get(r->map, name)->string, name, r->index);
    if (t->dtype != K3C_F32 || t->nbytes != sizeof(float) * len)
        return k3c_errf(err, K3C_EFORMAT, "%s: tensor '%s' holds %zu bytes, the run's optimizer needs %zu float32",
                        t->file, name, t->nbytes, len);
    memcpy(dst, t->data, sizeof(float) * len);
    return K3C_OK;
}

/* A stacked entry's held experts: one tensor per expert (this writer), else the whole entry under its pattern name
 * (one written before expert residency). */
static int load_stacked(shard_reader *r, const k3c_param_table *t, int i, size_t len, float *dst, k3c_err *err) {
    const k3c_param *p = &t->p[i];
    const size_t per = len / (size_t)p->stack, slice = (size_t)k3c_param_slice_numel(p), blocks = per / slice;
    char name[K3C_PARAM_NAME + 16];
    k3c_safetensors *st = NULL;
    k3c_params_name(p, 0, name, sizeof name);
    if (shard_of(r, name, &st, NULL) == K3C_ENOTFOUND && shard_of(r, p->name, &st, NULL) != K3C_ENOTFOUND) {
        float *whole = malloc(sizeof(float) * (per * (size_t)t->experts + 1));
        if (!whole) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", r->index);
        int rc = load_entry(r, p->name, per * (size_t)t->experts, whole, err);
        if (!rc) held_from_whole(p, len, t->experts, whole, dst);
        free(whole);
        return rc;
    }
    float *tmp = malloc(sizeof(float) * (per + 1));
    if (!tmp) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", r->index);
    int rc = K3C_OK;
    for (int64_t e = 0; !rc && e < p->stack; e++) {
        k3c_params_name(p, e, name, sizeof name);
        rc = load_entry(r, name, per, tmp, err);
        for (size_t b = 0; !rc && b < blocks; b++)
            memcpy(dst + b * (size_t)p->numel + (size_t)e * slice, tmp + b * slice, sizeof(float) * slice);
    }
    free(tmp);
    return rc;
}

/* A tensor-parallel share's state from its whole entry's tensor. */
static int load_share(shard_reader *r, const k3c_param_table *t, int i, size_t len, float *dst, k3c_err *err) {
    const k3c_param *p = &t->p[i];
    const size_t whole = len / (size_t)p->numel * (size_t)p->whole_numel;
    float *tmp = malloc(sizeof(float) * (whole + 1));
    if (!tmp) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", r->index);
    int rc = load_entry(r, p->name, whole, tmp, err);
    if (!rc) share_from_whole(t, p, len, tmp, dst);
    free(tmp);
    return rc;
}

/* The sharded layout: each entry of `mine` that has state, from the file the index names. */
static int load_sharded(const char *dir, const char *index, const k3c_param_table *t, const k3c_optim *o,
                        const uint8_t *mine, float *state, k3c_err *err) {
    k3c_json *root = NULL;
    CHECK_RC(k3c_json_parse_file(index, &root, err));
    shard_reader r = {dir, index, k3c_json_get(root, "weight_map"), NULL};
    int rc = r.map && r.map->type == K3C_JSON_OBJECT
                 ? K3C_OK
                 : k3c_errf(err, K3C_EFORMAT, "%s: missing weight_map object", index);
    if (!rc && !(r.open = calloc(r.map->n + 1, sizeof *r.open)))
        rc = k3c_errf(err, K3C_ENOMEM, "%s: out of memory", index);
    size_t at = 0;
    for (int i = 0; i < t->n && !rc; i++) {
        const size_t len = state_end(o, i + 1) - o->state_off[i];
        if ((mine && !mine[i]) || !len) continue;
        rc = t->p[i].stack      ? load_stacked(&r, t, i, len, state + at, err)
             : t->p[i].tp_share ? load_share(&r, t, i, len, state + at, err)
                                : load_entry(&r, t->p[i].name, len, state + at, err);
        at += len;
    }
    for (size_t k = 0; r.open && k < r.map->n; k++) k3c_st_close(r.open[k]);
    free(r.open);
    k3c_json_free(root);
    return rc;
}

int k3c_train_ckpt_load_state(const char *dir, const k3c_param_table *t, const k3c_optim *o, const uint8_t *mine,
                              float *state, char **trainer_state, k3c_err *err) {
    char p[4200], ix[4200];
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    snprintf(ix, sizeof ix, "%s/optimizer.safetensors.index.json", dir);
    if (o->n_entries != t->n)
        return k3c_errf(err, K3C_EINVAL, "%s: optimizer state of a table of %d entries, not %d", dir, o->n_entries,
                        t->n);
    int rc = access(p, F_OK) == 0 ? load_single(p, t, o, mine, state, err)
             : access(ix, F_OK) == 0
                 ? load_sharded(dir, ix, t, o, mine, state, err)
                 : k3c_errf(err, K3C_ENOTFOUND,
                            "%s: neither optimizer.safetensors nor optimizer.safetensors.index.json", dir);
    if (rc || !trainer_state) return rc;
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    return k3c_read_file(p, trainer_state, NULL, err);
}
