/* env_vfs.c — autonomous execution in a virtual file system: goals that need several steps (read the inputs, compute,
 * write an artifact, run the check) with list / read / write / delete / run_check tools; scored on the final artifact
 * and key intermediate nodes (inputs read before writing, a passing check after the last write, nothing else
 * touched). docs/POST.md "Environments". */
#include "post/env.h"

#include <stdlib.h>
#include <string.h>

enum { MAX_FILES = 24, MAX_CONTENT = 256 };

typedef struct {
    char path[64], content[MAX_CONTENT];
    int input, decoy, deleted, read, modified;
} vfile;

typedef struct {
    int task; /* 0 sum into report.txt, 1 sorted lines into sorted.txt, 2 set a key in config.ini */
    vfile f[MAX_FILES];
    int n;
    char target[64], want[MAX_CONTENT], key[16], value[16];
    int writes, read_before_write, checked_after_write;
} vfs;

static const char *WORDS[] = {"pear", "apple", "fig", "kiwi", "lime", "date", "plum", "grape", "melon", "berry"};
static const char *KEYS[] = {"debug", "port", "mode", "level", "cache", "retries"};
static const char *VALUES[] = {"true", "false", "8080", "fast", "safe", "3", "high", "off"};

static vfile *add_file(vfs *v, const char *path, const char *content, int input, int decoy) {
    vfile *f = &v->f[v->n++];
    snprintf(f->path, sizeof f->path, "%s", path);
    snprintf(f->content, sizeof f->content, "%s", content);
    f->input = input;
    f->decoy = decoy;
    return f;
}

static vfile *find(vfs *v, const char *path) {
    for (int i = 0; i < v->n; i++)
        if (!v->f[i].deleted && !strcmp(v->f[i].path, path)) return &v->f[i];
    return NULL;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static void make_task(k3c_env *e, vfs *v, k3c_sbuf *goal) {
    char buf[MAX_CONTENT], path[64];
    v->n = 0;
    add_file(v, "notes/readme.txt", "Project notes. Do not edit.", 0, 1);
    v->task = (int)k3c_env_randint(e, 0, 2);
    if (v->task == 0) {
        int nf = (int)k3c_env_randint(e, 2, 4);
        int64_t total = 0;
        for (int i = 0; i < nf; i++) {
            size_t k = 0;
            int nn = (int)k3c_env_randint(e, 2, 4);
            for (int j = 0; j < nn; j++) {
                int64_t x = k3c_env_randint(e, 1, 99);
                total += x;
                k += snprintf(buf + k, sizeof buf - k, "%lld\n", (long long)x);
            }
            snprintf(path, sizeof path, "data/part%d.txt", i + 1);
            add_file(v, path, buf, 1, 0);
        }
        snprintf(v->target, sizeof v->target, "report.txt");
        snprintf(v->want, sizeof v->want, "total: %lld", (long long)total);
        k3c_sbuf_printf(goal, "Add up all the numbers in the files under data/ and write report.txt containing exactly "
                              "'total: N'. Then run the check.");
    } else if (v->task == 1) {
        const char *w[7];
        int nw = (int)k3c_env_randint(e, 4, 7);
        size_t k = 0;
        for (int i = 0; i < nw; i++) {
            int dup;
            do {
                w[i] = WORDS[k3c_env_randint(e, 0, 9)];
                dup = 0;
                for (int j = 0; j < i; j++) dup |= w[j] == w[i];
            } while (dup);
            k += snprintf(buf + k, sizeof buf - k, "%s\n", w[i]);
        }
        add_file(v, "names.txt", buf, 1, 0);
        qsort(w, nw, sizeof *w, cmp_str);
        k = 0;
        for (int i = 0; i < nw; i++) k += snprintf(v->want + k, sizeof v->want - k, "%s%s", i ? "\n" : "", w[i]);
        snprintf(v->target, sizeof v->target, "sorted.txt");
        k3c_sbuf_printf(goal, "Write sorted.txt with the lines of names.txt in alphabetical order, one per line. "
                              "Then run the check.");
    } else {
        int nk = (int)k3c_env_randint(e, 3, 5), pick = (int)k3c_env_randint(e, 0, nk - 1);
        size_t k = 0, kw = 0;
        for (int i = 0; i < nk; i++) {
            const char *val = VALUES[k3c_env_randint(e, 0, 7)];
            k += snprintf(buf + k, sizeof buf - k, "%s=%s\n", KEYS[i], val);
            if (i == pick) {
                snprintf(v->key, sizeof v->key, "%s", KEYS[i]);
                do snprintf(v->value, sizeof v->value, "%s", VALUES[k3c_env_randint(e, 0, 7)]);
                while (!strcmp(v->value, val));
            }
            kw += snprintf(v->want + kw, sizeof v->want - kw, "%s=%s\n", KEYS[i], i == pick ? v->value : val);
        }
        while (kw && v->want[kw - 1] == '\n') v->want[--kw] = 0;
        add_file(v, "config.ini", buf, 1, 0);
        snprintf(v->target, sizeof v->target, "config.ini");
        k3c_sbuf_printf(goal, "In config.ini set %s to %s, keeping every other line as it is. Then run the check.",
                        v->key, v->value);
    }
}

static int init(k3c_env *e, k3c_err *err) {
    vfs *v = calloc(1, sizeof *v);
    if (!v) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    e->st = v;
    k3c_sbuf goal;
    k3c_sbuf_init(&goal);
    uint64_t key;
    do {
        goal.len = 0;
        make_task(e, v, &goal);
        /* The task is the goal and the files it starts from. */
        key = k3c_env_hash(goal.buf, goal.len, 14695981039346656037ull);
        for (int i = 0; i < v->n; i++) key = k3c_env_hash(v->f[i].content, strlen(v->f[i].content), key);
    } while (!k3c_env_in_split(key, e->split));
    k3c_sbuf_printf(&e->system, "%s", "You work in a file system through tools. Finish the task, then reply 'Done.'");
    k3c_sbuf_append(&e->user, goal.buf, goal.len);
    k3c_sbuf_free(&goal);
    k3c_env_tool(&e->tools, "fs_list", "List files under a directory ('' for all)", "{\"dir\":{\"type\":\"string\"}}",
                 "[]");
    k3c_env_tool(&e->tools, "fs_read", "Read a file", "{\"path\":{\"type\":\"string\"}}", "[\"path\"]");
    k3c_env_tool(&e->tools, "fs_write", "Write a file (replacing it)",
                 "{\"path\":{\"type\":\"string\"},\"content\":{\"type\":\"string\"}}", "[\"path\",\"content\"]");
    k3c_env_tool(&e->tools, "fs_delete", "Delete a file", "{\"path\":{\"type\":\"string\"}}", "[\"path\"]");
    k3c_env_tool(&e->tools, "run_check", "Check whether the task is done", "{}", "[]");
    return K3C_OK;
}

/* Content equality ignoring trailing newlines. */
static int same_text(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    while (na && a[na - 1] == '\n') na--;
    while (nb && b[nb - 1] == '\n') nb--;
    return na == nb && !memcmp(a, b, na);
}

static int artifact_ok(vfs *v) {
    const vfile *t = find(v, v->target);
    return t && same_text(t->content, v->want);
}

static int all_inputs_read(vfs *v) {
    for (int i = 0; i < v->n; i++)
        if (v->f[i].input && !v->f[i].read) return 0;
    return 1;
}

static int step(k3c_env *e, const char *tool, const k3c_json *args, k3c_sbuf *obs, k3c_err *err) {
    vfs *v = e->st;
    const char *path = NULL, *content = NULL;
    int rc;
    if (!strcmp(tool, "fs_list")) {
        const char *dir = "";
        if ((rc = k3c_env_arg_str(args, "dir", 0, &dir, err))) return rc;
        for (int i = 0; i < v->n; i++)
            if (!v->f[i].deleted && !strncmp(v->f[i].path, dir, strlen(dir)))
                k3c_sbuf_printf(obs, "%s\n", v->f[i].path);
        if (!obs->len) k3c_sbuf_printf(obs, "%s", "no files");
        return K3C_OK;
    }
    if (!strcmp(tool, "run_check")) {
        int ok = artifact_ok(v);
        if (ok && v->writes) v->checked_after_write = 1;
        k3c_sbuf_printf(obs, "%s", ok ? "PASS" : find(v, v->target) ? "FAIL: wrong content" : "FAIL: missing file");
        return K3C_OK;
    }
    if (strcmp(tool, "fs_read") && strcmp(tool, "fs_write") && strcmp(tool, "fs_delete"))
        return k3c_errf(err, K3C_EINVAL, "unknown tool \"%s\"", tool);
    if ((rc = k3c_env_arg_str(args, "path", 1, &path, err))) return rc;
    vfile *f = find(v, path);
    if (!strcmp(tool, "fs_read")) {
        if (!f) return k3c_errf(err, K3C_EINVAL, "%s: no such file", path);
        f->read = 1;
        k3c_sbuf_printf(obs, "%s", f->content);
    } else if (!strcmp(tool, "fs_delete")) {
        if (!f) return k3c_errf(err, K3C_EINVAL, "%s: no such file", path);
        f->deleted = 1;
        k3c_sbuf_printf(obs, "deleted %s", path);
    } else {
        if ((rc = k3c_env_arg_str(args, "content", 1, &content, err))) return rc;
        if (strlen(content) >= MAX_CONTENT) return k3c_errf(err, K3C_EINVAL, "content over %d bytes", MAX_CONTENT - 1);
        if (!f && v->n == MAX_FILES) return k3c_errf(err, K3C_EINVAL, "too many files");
        if (!f) f = add_file(v, path, "", 0, 0);
        if (!v->writes) v->read_before_write = all_inputs_read(v);
        v->writes++;
        v->checked_after_write = 0;
        f->modified = 1;
        snprintf(f->content, sizeof f->content, "%s", content);
        k3c_sbuf_printf(obs, "wrote %s", path);
    }
    return K3C_OK;
}

static void score(k3c_env *e, const char *final, k3c_reward *out) {
    vfs *v = e->st;
    int collateral = 0;
    for (int i = 0; i < v->n; i++) {
        const vfile *f = &v->f[i];
        int is_target = !strcmp(f->path, v->target);
        collateral += (f->decoy || f->input) && !is_target && (f->deleted || f->modified);
    }
    k3c_reward_add(out, "artifact", artifact_ok(v), 3);
    k3c_reward_add(out, "inputs_read", v->read_before_write, 1);
    k3c_reward_add(out, "checked", v->checked_after_write, 1);
    k3c_reward_add(out, "no_collateral", collateral == 0, 1);
    snprintf(out->info, sizeof out->info, "%s %s, %d writes, %d files touched outside the task", v->target,
             artifact_ok(v) ? "correct" : "wrong", v->writes, collateral);
    (void) final;
}

static void free_state(k3c_env *e) { free(e->st); }

/* The expert: list, read every input, write the artifact, run the check. */
static int reference(k3c_env *e0, k3c_sbuf *m, k3c_err *err) {
    k3c_env *e;
    int rc = k3c_env_new(e0->kind->name, e0->seed, e0->split, e0->index, &e, err);
    if (rc) return rc;
    vfs *v = e->st;
    k3c_sbuf args;
    k3c_sbuf_init(&args);
    k3c_sbuf_printf(m, "%s", "[");
    for (int step_i = 0;; step_i++) {
        const char *tool;
        args.len = 0;
        int in = 0, which = -1;
        for (int i = 0; i < v->n && which < 0; i++)
            if (v->f[i].input && in++ == step_i - 1) which = i;
        if (step_i == 0) {
            tool = "fs_list";
            k3c_sbuf_printf(&args, "%s", "{\"dir\":\"\"}");
        } else if (which >= 0) {
            tool = "fs_read";
            k3c_sbuf_printf(&args, "{\"path\":\"%s\"}", v->f[which].path);
        } else if (!v->writes) {
            tool = "fs_write";
            k3c_sbuf_printf(&args, "{\"path\":\"%s\",\"content\":", v->target);
            k3c_sbuf_json_string(&args, v->want, strlen(v->want));
            k3c_sbuf_printf(&args, "%s", "}");
        } else {
            tool = "run_check";
            k3c_sbuf_printf(&args, "%s", "{}");
        }
        char *obs = NULL;
        k3c_env_step(e, tool, args.buf, &obs, NULL);
        k3c_sbuf_printf(m,
                        "%s{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"type\":\"function\","
                        "\"function\":{\"name\":\"%s\",\"arguments\":",
                        step_i ? "," : "", tool);
        k3c_sbuf_json_string(m, args.buf, args.len);
        k3c_sbuf_printf(m, "%s", "}}]},{\"role\":\"tool\",\"content\":");
        k3c_sbuf_json_string(m, obs ? obs : "", obs ? strlen(obs) : 0);
        k3c_sbuf_printf(m, "%s", "}");
        free(obs);
        if (!strcmp(tool, "run_check")) break;
    }
    k3c_sbuf_printf(m, "%s", ",{\"role\":\"assistant\",\"content\":\"Done.\"}]");
    k3c_sbuf_free(&args);
    k3c_env_free(e);
    return K3C_OK;
}

const k3c_env_kind k3c_env_vfs = {"vfs", init, step, score, free_state, reference};
