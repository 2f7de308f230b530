/* args.c — argument helpers for the k3c commands: --name VALUE / --name=VALUE options, flags, positionals. */
#include "cli.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int cli_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) return 1;
    return 0;
}

const char *cli_opt(int argc, char **argv, const char *name) {
    size_t n = strlen(name);
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], name, n) != 0) continue;
        if (argv[i][n] == '=') return argv[i] + n + 1;
        if (argv[i][n] == 0 && i + 1 < argc) return argv[i + 1];
    }
    return NULL;
}

int cli_flag(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], name) == 0) return 1;
    return 0;
}

int cli_opt_int(int argc, char **argv, const char *name, long long def, long long *out) {
    const char *v = cli_opt(argc, argv, name);
    if (!v) {
        *out = def;
        return 1;
    }
    char *end;
    long long x = strtoll(v, &end, 10);
    if (*v == 0 || *end != 0) {
        fprintf(stderr, "k3c: %s expects an integer, got '%s'\n", name, v);
        return 0;
    }
    *out = x;
    return 1;
}

int cli_opt_double(int argc, char **argv, const char *name, double def, double *out) {
    const char *v = cli_opt(argc, argv, name);
    if (!v) {
        *out = def;
        return 1;
    }
    char *end;
    double x = strtod(v, &end);
    if (*v == 0 || *end != 0) {
        fprintf(stderr, "k3c: %s expects a number, got '%s'\n", name, v);
        return 0;
    }
    *out = x;
    return 1;
}

const char *cli_positional(int argc, char **argv, int want, const char *const *value_opts) {
    int k = 0;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-' && argv[i][1] != 0) {
            if (!strchr(argv[i], '=') && value_opts)
                for (const char *const *o = value_opts; *o; o++)
                    if (strcmp(argv[i], *o) == 0) {
                        i++;
                        break;
                    }
            continue;
        }
        if (k++ == want) return argv[i];
    }
    return NULL;
}

int cli_fail(const char *cmd, const k3c_err *err) {
    fprintf(stderr, "k3c %s: error: %s\n", cmd, err && err->msg[0] ? err->msg : "failed");
    return 1;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "k3c %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see k3c %s --help)\n", cmd);
    va_end(ap);
    return 2;
}

int cli_kda_chunk(int argc, char **argv, int *chunk) {
    const char *k = cli_opt(argc, argv, "--kda");
    *chunk = !k || !strcmp(k, "64") ? 64 : !strcmp(k, "16") ? 16 : !strcmp(k, "recurrent") ? 0 : -1;
    return *chunk >= 0;
}
