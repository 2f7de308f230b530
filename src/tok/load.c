/* load.c — the one way to load a tokenizer from files: a vocabulary with its special-token sidecar, and the tokenizer
 * a k3c model / checkpoint directory carries (tiktoken.model + sidecar + k3c_tokenizer.json naming the pattern). */
#include "base/json.h"
#include "tok/tok.h"

#include <stdio.h>
#include <unistd.h>

int k3c_tok_load_with_specials(const char *path, k3c_tok_pattern pat, int flags, k3c_tok **out, k3c_err *err) {
    *out = NULL;
    int rc = k3c_tok_load(path, pat, flags, out, err);
    if (rc) return rc;
    char side[4200];
    if (snprintf(side, sizeof side, "%s.specials.json", path) >= (int)sizeof side)
        rc = k3c_errf(err, K3C_EINVAL, "%s: path too long", path);
    else if (access(side, R_OK) == 0) /* a vocabulary without specials has no sidecar */
        rc = k3c_tok_load_specials_json(*out, side, NULL, err);
    if (rc) {
        k3c_tok_free(*out);
        *out = NULL;
    }
    return rc;
}

/* The pattern k3c_tokenizer.json names (cl100k when the file is absent: checkpoints before it was written). */
static int dir_pattern(const char *dir, char *pattern, size_t n, k3c_err *err) {
    char p[4200];
    snprintf(pattern, n, "cl100k");
    snprintf(p, sizeof p, "%s/" K3C_TOK_DIR_SPEC, dir);
    if (access(p, R_OK) != 0) return 0;
    k3c_json *j = NULL;
    int rc = k3c_json_parse_file(p, &j, err);
    if (rc) return rc;
    k3c_json_ctx c = {p, err};
    const char *v;
    rc = k3c_json_get_str(&c, K3C_JSON_OPT, K3C_SPOT(j, "", "pattern"), &v);
    if (!rc && v) snprintf(pattern, n, "%s", v);
    k3c_json_free(j);
    return rc;
}

int k3c_tok_load_dir(const char *dir, const char *pattern, k3c_tok **out, k3c_err *err) {
    *out = NULL;
    char name[32], p[4200];
    int rc = pattern ? 0 : dir_pattern(dir, name, sizeof name, err);
    if (rc) return rc;
    if (pattern) snprintf(name, sizeof name, "%s", pattern);
    k3c_tok_pattern pat;
    if (k3c_tok_pattern_parse(name, &pat)) return k3c_errf(err, K3C_EINVAL, "unknown tokenizer pattern '%s'", name);
    snprintf(p, sizeof p, "%s/" K3C_TOK_DIR_VOCAB, dir);
    return k3c_tok_load_with_specials(p, pat, 0, out, err);
}
