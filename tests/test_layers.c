/* test_layers.c — the include graph follows the layers of docs/CODE.md "Layers": a file under src/X may include a
 * header of src/Y only when Y is X or stands above X in that list, the GPU is reached through the op table and the
 * public k3c/device.h (only cuda/ includes cuda/ headers), the CLI builds on the public headers and base/ alone, and
 * the public headers (include/k3c.h and every room in include/k3c/) include nothing of src/. */
#include "test.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>

/* docs/CODE.md "Layers", top to bottom: each may use the ones before it. */
static const char *const LAYERS[] = {"base", "ops",  "cuda",   "model", "tok",  "parallel", "train",
                                     "vision", "serve", "post", "exp",  "plan",  "cli"};
#define N_LAYERS ((int)(sizeof LAYERS / sizeof LAYERS[0]))

static int rank_of(const char *dir, size_t n) {
    for (int i = 0; i < N_LAYERS; i++)
        if (strlen(LAYERS[i]) == n && !strncmp(LAYERS[i], dir, n)) return i;
    return -1;
}

static int is_source(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot && (!strcmp(dot, ".c") || !strcmp(dot, ".h") || !strcmp(dot, ".cu") || !strcmp(dot, ".cuh"));
}

/* Every `#include "Y/..."` of path checked against its own layer (rank; -1 for include/k3c.h): the number of
 * violations, each printed unless quiet. */
static int violations(const char *path, const char *layer, int rank, int *n_inc, int quiet) {
    FILE *f = fopen(path, "r");
    if (!f) {
        printf("%s: cannot open\n", path);
        return 1;
    }
    int bad = 0;
    char line[1024];
    for (int lno = 1; fgets(line, sizeof line, f); lno++) {
        const char *s = line;
        while (*s == ' ' || *s == '\t') s++;
        if (strncmp(s, "#include \"", 10)) continue;
        s += 10;
        const char *slash = strchr(s, '/'), *quote = strchr(s, '"');
        if (!quote || !slash || slash > quote) continue; /* a file of the same folder, or tests' own headers */
        if (!strncmp(s, "k3c/", 4)) continue;            /* the public rooms (include/k3c/): for everyone */
        (*n_inc)++;
        const int target = rank_of(s, (size_t)(slash - s)), w = (int)(quote - s);
        const int cuda = !strncmp(s, "cuda/", 5), cuda_ok = !strcmp(layer, "cuda");
        /* the CLI uses the library through include/ only, plus base/'s utilities (JSON, strings, CHECK_RC) */
        const int cli_inside = !strcmp(layer, "cli") && target >= 0 && strcmp(LAYERS[target], "base");
        if (quiet && (target < 0 || rank < 0 || target > rank || (cuda && !cuda_ok) || cli_inside))
            bad++;
        else if (target < 0)
            bad++, printf("%s:%d: includes \"%.*s\", outside the layers\n", path, lno, w, s);
        else if (rank < 0 || target > rank)
            bad++, printf("%s:%d: %s includes \"%.*s\", which stands below it in docs/CODE.md\n", path, lno, layer,
                          w, s);
        else if (cuda && !cuda_ok)
            bad++, printf("%s:%d: %s reaches the GPU past the op table (\"%.*s\")\n", path, lno, layer, w, s);
        else if (cli_inside)
            bad++, printf("%s:%d: the CLI includes \"%.*s\": it builds on the public headers (include/) and base/ "
                          "only\n", path, lno, w, s);
    }
    fclose(f);
    return bad;
}

static void check_dir(const char *layer, int *n_files, int *n_inc) {
    char dir[256];
    snprintf(dir, sizeof dir, "src/%s", layer);
    DIR *d = opendir(dir);
    CHECK(d != NULL, "%s: cannot open (run from the repository root)", dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!is_source(e->d_name)) continue;
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        CHECK(violations(path, layer, rank_of(layer, strlen(layer)), n_inc, 0) == 0, "%s follows the layers", path);
        (*n_files)++;
    }
    if (d) closedir(d);
}

/* The check itself finds what it should: an op including the model, the model reaching cuda/, an unknown folder. */
static void self_check(void) {
    const char *tmp = test_tmpdir("layers");
    char path[600];
    snprintf(path, sizeof path, "%s/bad.c", tmp);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "%s", path);
    if (!f) return;
    fprintf(f, "#include \"base/base.h\"\n#include \"model/params.h\"\n  #include \"cuda/cuda_ops.h\"\n"
               "#include \"nowhere/x.h\"\n#include \"local.h\"\n#include \"k3c/serve.h\"\n");
    fclose(f);
    int n = 0;
    CHECK(violations(path, "ops", rank_of("ops", 3), &n, 1) == 3 && n == 4, "ops: 3 of 4 includes refused (%d seen)", n);
    n = 0;
    CHECK(violations(path, "model", rank_of("model", 5), &n, 1) == 2, "model: cuda/ and an unknown folder refused");
    n = 0;
    CHECK(violations(path, "cli", rank_of("cli", 3), &n, 1) == 3, "cli: model/, cuda/ and the unknown folder refused");
    n = 0;
    CHECK(violations(path, "serve", rank_of("serve", 5), &n, 1) == 2, "serve: model/ allowed, cuda/ refused");
}

/* include/k3c.h and every room of include/k3c/ include nothing of src/. */
static void check_public(int *n_inc) {
    int before = *n_inc, n_pub = 1;
    CHECK(violations("include/k3c.h", "include", -1, n_inc, 0) == 0 && *n_inc == before,
          "include/k3c.h includes no header of src/");
    DIR *d = opendir("include/k3c");
    CHECK(d != NULL, "include/k3c: cannot open (run from the repository root)");
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!is_source(e->d_name)) continue;
        char path[600];
        snprintf(path, sizeof path, "include/k3c/%s", e->d_name);
        before = *n_inc;
        CHECK(violations(path, "include", -1, n_inc, 0) == 0 && *n_inc == before, "%s includes no header of src/",
              path);
        n_pub++;
    }
    if (d) closedir(d);
    CHECK(n_pub >= 10, "%d public headers checked", n_pub);
}

int main(void) {
    self_check();
    int n_files = 0, n_inc = 0;
    for (int i = 0; i < N_LAYERS; i++) check_dir(LAYERS[i], &n_files, &n_inc);
    /* every folder of src/ is one of the layers */
    DIR *d = opendir("src");
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.') CHECK(rank_of(e->d_name, strlen(e->d_name)) >= 0, "src/%s: not a layer of docs/CODE.md", e->d_name);
    if (d) closedir(d);
    check_public(&n_inc);
    CHECK(n_files > 100 && n_inc > 300, "scanned %d files, %d cross-folder includes", n_files, n_inc);
    return test_summary();
}
