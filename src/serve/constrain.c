/* constrain.c — constrained decoding: a JSON-schema subset compiled to the nodes of a deterministic pushdown automaton
 * over bytes and chat markers, and the chat answers built from them around the JSON value (the think channel, the
 * response, forced tool calls). docs/SERVING.md "Constrained decoding". */
#include "serve/constrain_impl.h"

#include "tok/tok.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- compiling */

static void set_bit(uint64_t *b, int c) { b[c >> 6] |= 1ull << (c & 63); }

typedef struct {
    k3c_cgrammar *g;
    const k3c_json *root;
    char *path;
    size_t npath;
    k3c_err *err;
    int depth;
} compiler;

static int new_node(compiler *c, int kind, k3c_err *err) {
    if (c->g->nn == MAX_NODES) return k3c_errf(err, K3C_EUNSUPPORTED, "schema: more than %d nodes", MAX_NODES);
    cnode *n = &c->g->nodes[c->g->nn];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    return c->g->nn++;
}

static int unsupported(compiler *c, const char *at, const char *what) {
    snprintf(c->path, c->npath, "%s", at);
    return k3c_errf(c->err, K3C_EUNSUPPORTED, "schema %s: %s is not supported", at[0] ? at : "/", what);
}

static int cmp_lit(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* An enum of JSON values (written compact or spaced), sorted so the values sharing a prefix are contiguous. */
static int enum_node(compiler *c, const k3c_json *vals, size_t nv, const char *at) {
    int id = new_node(c, N_ENUM, c->err);
    if (id < 0) return id;
    cnode *n = &c->g->nodes[id];
    if (nv == 0) return unsupported(c, at, "an empty enum");
    n->lits = calloc(nv, sizeof *n->lits);
    n->lens = calloc(nv, sizeof *n->lens);
    if (!n->lits || !n->lens) return k3c_errf(c->err, K3C_ENOMEM, "out of memory");
    n->n = (int)nv;
    for (size_t i = 0; i < nv; i++) {
        k3c_sbuf s;
        k3c_sbuf_init(&s);
        k3c_sbuf_json_value(&s, &vals[i], c->g->spaced ? K3C_JSON_W_SPACED : 0);
        k3c_sbuf_append(&s, "", 0);
        n->lits[i] = s.buf;
    }
    qsort(n->lits, nv, sizeof *n->lits, cmp_lit);
    n->cost = INT64_MAX;
    for (size_t i = 0; i < nv; i++) {
        n->lens[i] = strlen(n->lits[i]);
        if (!n->lens[i]) return k3c_errf(c->err, K3C_ENOMEM, "out of memory");
        set_bit(n->first, (unsigned char)n->lits[i][0]);
        if ((int64_t)n->lens[i] < n->cost) n->cost = (int64_t)n->lens[i];
    }
    return id;
}

static int compile(compiler *c, const k3c_json *s, const char *at);

static int simple_node(compiler *c, int kind) {
    int id = new_node(c, kind, c->err);
    if (id < 0) return id;
    cnode *n = &c->g->nodes[id];
    const char *first = kind == N_OBJ || kind == N_ANYOBJ ? "{" : kind == N_ARR ? "[" : kind == N_STR ? "\"" : "-0123456789";
    for (const char *p = first; *p; p++) set_bit(n->first, (unsigned char)*p);
    n->cost = kind == N_NUM || kind == N_INT ? 1 : 2;
    return id;
}

static int any_value(compiler *c) {
    static const char *lits = "[true,false,null]";
    k3c_json *v = NULL;
    if (k3c_json_parse(lits, strlen(lits), "enum", &v, c->err)) return -1;
    int kinds[5] = {simple_node(c, N_ANYOBJ), simple_node(c, N_ARR), simple_node(c, N_STR), simple_node(c, N_NUM),
                    enum_node(c, v->items, v->n, "")};
    k3c_json_free(v);
    int id = new_node(c, N_ANYOF, c->err);
    for (int k = 0; k < 5; k++)
        if (kinds[k] < 0) return kinds[k];
    if (id < 0) return id;
    cnode *n = &c->g->nodes[id];
    n->kids = malloc(sizeof(int) * 5);
    if (!n->kids) return k3c_errf(c->err, K3C_ENOMEM, "out of memory");
    n->n = 5;
    memcpy(n->kids, kinds, sizeof kinds);
    c->g->nodes[kinds[1]].items = id; /* any array holds any values, any object too (its own rule) */
    n->cost = 1;
    for (int k = 0; k < 4; k++) {
        n->first[k] = 0;
        for (int b = 0; b < 5; b++) n->first[k] |= c->g->nodes[kinds[b]].first[k];
    }
    return id;
}

static int anyof_node(compiler *c, const k3c_json *branches, size_t nb, const char *at, const k3c_json *types) {
    int *kids = calloc(nb ? nb : 1, sizeof *kids);
    if (!kids) return k3c_errf(c->err, K3C_ENOMEM, "out of memory");
    char w[512];
    uint64_t first[4] = {0};
    int64_t cost = INT64_MAX;
    for (size_t i = 0; i < nb; i++) {
        snprintf(w, sizeof w, "%s/anyOf/%zu", at, i);
        if (types) { /* "type": [..]: each type alone */
            k3c_sbuf t;
            k3c_sbuf_init(&t);
            k3c_sbuf_printf(&t, "{\"type\":");
            k3c_sbuf_json_value(&t, &types[i], 0);
            k3c_sbuf_append(&t, "}", 1);
            k3c_json *one = NULL;
            int rc = k3c_json_parse(t.buf, t.len, "type", &one, c->err);
            k3c_sbuf_free(&t);
            kids[i] = rc ? rc : compile(c, one, at);
            k3c_json_free(one);
        } else {
            kids[i] = compile(c, &branches[i], w);
        }
        if (kids[i] < 0) {
            int rc = kids[i];
            free(kids);
            return rc;
        }
        const cnode *k = &c->g->nodes[kids[i]];
        for (int q = 0; q < 4; q++) {
            if (first[q] & k->first[q]) {
                free(kids);
                return unsupported(c, w, "an anyOf whose branches can start with the same character");
            }
            first[q] |= k->first[q];
        }
        if (k->cost < cost) cost = k->cost;
    }
    int id = new_node(c, N_ANYOF, c->err);
    if (id < 0) {
        free(kids);
        return id;
    }
    cnode *n = &c->g->nodes[id];
    n->kids = kids;
    n->n = (int)nb;
    memcpy(n->first, first, sizeof first);
    n->cost = cost;
    return id;
}

static const char *const IGNORED[] = {"description", "title", "default", "examples", "$schema", "$id", "$comment",
                                      "strict", "name", "$defs", "definitions"};

static int compile_object(compiler *c, const k3c_json *s, const char *at) {
    const k3c_json *props = k3c_json_get(s, "properties"), *req = k3c_json_get(s, "required");
    const k3c_json *ap = k3c_json_get(s, "additionalProperties");
    char w[512];
    if (ap && !(ap->type == K3C_JSON_BOOL && !ap->boolean)) {
        snprintf(w, sizeof w, "%s/additionalProperties", at);
        if (!props) return unsupported(c, w, "additionalProperties other than false");
    }
    if (!props) return simple_node(c, N_ANYOBJ);
    if (props->type != K3C_JSON_OBJECT || props->n > MAX_PROPS) {
        snprintf(w, sizeof w, "%s/properties", at);
        return unsupported(c, w, "properties that are not an object of at most 64 entries");
    }
    int id = simple_node(c, N_OBJ);
    if (id < 0) return id;
    int *kids = calloc(props->n ? props->n : 1, sizeof *kids);
    char **lits = calloc(props->n ? props->n : 1, sizeof *lits);
    size_t *lens = calloc(props->n ? props->n : 1, sizeof *lens);
    cnode *n = &c->g->nodes[id];
    n->kids = kids, n->lits = lits, n->lens = lens, n->n = (int)props->n;
    if (!kids || !lits || !lens) return k3c_errf(c->err, K3C_ENOMEM, "out of memory");
    int64_t cost = 2;
    int nreq = 0;
    for (size_t i = 0; i < props->n; i++) {
        snprintf(w, sizeof w, "%s/properties/%s", at, props->keys[i]);
        int k = compile(c, &props->items[i], w);
        if (k < 0) return k;
        n = &c->g->nodes[id];
        n->kids[i] = k;
        k3c_sbuf t;
        k3c_sbuf_init(&t);
        k3c_sbuf_json_string(&t, props->keys[i], strlen(props->keys[i]));
        k3c_sbuf_append(&t, c->g->spaced ? ": " : ":", c->g->spaced ? 2 : 1);
        k3c_sbuf_append(&t, "", 0);
        if (!t.ok) return k3c_errf(c->err, K3C_ENOMEM, "out of memory");
        n->lits[i] = t.buf;
        n->lens[i] = t.len;
        for (size_t r = 0; req && req->type == K3C_JSON_ARRAY && r < req->n; r++)
            if (req->items[r].type == K3C_JSON_STRING && !strcmp(req->items[r].string, props->keys[i])) n->req[i] = 1;
        if (n->req[i]) cost += (int64_t)n->lens[i] + c->g->nodes[k].cost + (nreq++ ? 1 + c->g->spaced : 0);
    }
    n->cost = cost;
    return id;
}

/* One schema node; `at` is its JSON pointer for errors. */
static int compile(compiler *c, const k3c_json *s, const char *at) {
    char w[512];
    if (++c->depth > 32) return unsupported(c, at, "nesting deeper than 32");
    if (s->type == K3C_JSON_BOOL && s->boolean) return c->depth--, any_value(c);
    if (s->type != K3C_JSON_OBJECT) return unsupported(c, at, "a schema that is not an object");
    static const char *const KNOWN[] = {"type", "properties", "required", "additionalProperties", "items",
                                        "enum", "const", "anyOf", "$ref"};
    for (size_t i = 0; i < s->n; i++) {
        int ok = 0;
        for (size_t k = 0; k < sizeof KNOWN / sizeof *KNOWN; k++) ok |= !strcmp(s->keys[i], KNOWN[k]);
        for (size_t k = 0; k < sizeof IGNORED / sizeof *IGNORED; k++) ok |= !strcmp(s->keys[i], IGNORED[k]);
        if (!ok) {
            snprintf(w, sizeof w, "%s/%s", at, s->keys[i]);
            char what[96];
            snprintf(what, sizeof what, "keyword '%.60s'", s->keys[i]);
            return unsupported(c, w, what);
        }
    }
    const k3c_json *t = k3c_json_get(s, "type"), *en = k3c_json_get(s, "enum"), *cn = k3c_json_get(s, "const");
    const k3c_json *any = k3c_json_get(s, "anyOf"), *ref = k3c_json_get(s, "$ref");
    int id;
    if (ref) {
        const char *r = ref->type == K3C_JSON_STRING ? ref->string : "";
        const k3c_json *defs = NULL;
        if (!strncmp(r, "#/$defs/", 8)) defs = k3c_json_get(k3c_json_get(c->root, "$defs"), r + 8);
        if (!strncmp(r, "#/definitions/", 14)) defs = k3c_json_get(k3c_json_get(c->root, "definitions"), r + 14);
        snprintf(w, sizeof w, "%s/$ref", at);
        if (!defs) return unsupported(c, w, "a $ref other than #/$defs/NAME or #/definitions/NAME");
        id = compile(c, defs, w); /* recursion ends at the depth limit */
    } else if (cn) {
        id = enum_node(c, cn, 1, at);
    } else if (en) {
        snprintf(w, sizeof w, "%s/enum", at);
        if (en->type != K3C_JSON_ARRAY) return unsupported(c, w, "an enum that is not an array");
        id = enum_node(c, en->items, en->n, w);
    } else if (any) {
        if (any->type != K3C_JSON_ARRAY) return unsupported(c, at, "an anyOf that is not an array");
        id = anyof_node(c, any->items, any->n, at, NULL);
    } else if (t && t->type == K3C_JSON_ARRAY) {
        id = anyof_node(c, NULL, t->n, at, t->items);
    } else if (!t) {
        id = any_value(c);
    } else {
        const char *ty = t->type == K3C_JSON_STRING ? t->string : "";
        if (!strcmp(ty, "object")) {
            id = compile_object(c, s, at);
        } else if (!strcmp(ty, "array")) {
            const k3c_json *it = k3c_json_get(s, "items");
            snprintf(w, sizeof w, "%s/items", at);
            int item = it ? compile(c, it, w) : any_value(c);
            if (item < 0) return item;
            id = simple_node(c, N_ARR);
            if (id >= 0) c->g->nodes[id].items = item;
        } else if (!strcmp(ty, "string")) {
            id = simple_node(c, N_STR);
        } else if (!strcmp(ty, "number")) {
            id = simple_node(c, N_NUM);
        } else if (!strcmp(ty, "integer")) {
            id = simple_node(c, N_INT);
        } else if (!strcmp(ty, "boolean") || !strcmp(ty, "null")) {
            const char *lit = ty[0] == 'b' ? "[true,false]" : "[null]";
            k3c_json *v = NULL;
            if (k3c_json_parse(lit, strlen(lit), "enum", &v, c->err)) return -1;
            id = enum_node(c, v->items, v->n, at);
            k3c_json_free(v);
        } else {
            snprintf(w, sizeof w, "%s/type", at);
            return unsupported(c, w, "this type");
        }
    }
    c->depth--;
    return id;
}

/* Markup text → symbols: the vocabulary's chat markers become one symbol each, the rest bytes. */
/* ---------------------------------------------------------------- markup nodes */

/* Markup text → symbols: the vocabulary's chat markers become one symbol each, the rest bytes. */
static int symbols(k3c_cgrammar *g, const char *s, int32_t **out, int *n, k3c_err *err) {
    static const char *const MARKS[N_MARKS] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "<|im_end|>"};
    size_t len = strlen(s);
    *out = malloc(sizeof(int32_t) * (len + 1));
    if (!*out) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    *n = 0;
    for (size_t i = 0; i < len;) {
        int hit = -1;
        for (int k = 0; k < N_MARKS && hit < 0; k++)
            if (!strncmp(s + i, MARKS[k], strlen(MARKS[k]))) hit = k;
        if (hit < 0) {
            (*out)[(*n)++] = (unsigned char)s[i++];
            continue;
        }
        int32_t id = k3c_tok_special_id(g->tok, MARKS[hit]);
        if (id < 0) return k3c_errf(err, K3C_EINVAL, "constraint: the vocabulary has no %s", MARKS[hit]);
        g->mark_id[hit] = id;
        (*out)[(*n)++] = SYM_MARK + hit;
        i += strlen(MARKS[hit]);
    }
    return K3C_OK;
}

/* tc[p] for p in [0, n]: the fewest tokens that spell syms[p..n) (a marker is one; a byte run goes through the
 * vocabulary's tokens), so the budget counts markup as the model writes it; one per symbol without a trie. */
static int32_t *token_costs(const k3c_cgrammar *g, const int32_t *syms, int n, k3c_err *err) {
    int32_t *tc = malloc(sizeof(int32_t) * (size_t)(n + 1));
    if (!tc) return k3c_errf(err, K3C_ENOMEM, "out of memory"), NULL;
    tc[n] = 0;
    for (int p = n - 1; p >= 0; p--) {
        tc[p] = 1 + tc[p + 1];
        int lens[64], nl = g->trie ? k3c_vtrie_prefixes(g->trie, syms + p, n - p, lens, 64) : 0;
        for (int k = 0; k < nl; k++)
            if (1 + tc[p + lens[k]] < tc[p]) tc[p] = 1 + tc[p + lens[k]];
    }
    return tc;
}

static int lit_node(compiler *c, const char *text) {
    int id = new_node(c, N_LIT, c->err);
    if (id < 0) return id;
    cnode *n = &c->g->nodes[id];
    if (symbols(c->g, text, &n->syms, &n->n, c->err)) return -1;
    if (n->n == 0) return k3c_errf(c->err, K3C_EINVAL, "constraint: an empty literal");
    set_bit(n->first, n->syms[0]);
    if (!(n->tc = token_costs(c->g, n->syms, n->n, c->err))) return -1;
    n->cost = n->tc[0];
    return id;
}

/* A sequence of nk nodes (negative entries: an error already set). */
static int seq_node(compiler *c, const int *kids, int nk) {
    for (int k = 0; k < nk; k++)
        if (kids[k] < 0) return kids[k];
    int id = new_node(c, N_SEQ, c->err);
    if (id < 0) return id;
    cnode *n = &c->g->nodes[id];
    if (!(n->kids = malloc(sizeof(int) * (size_t)nk))) return k3c_errf(c->err, K3C_ENOMEM, "out of memory");
    memcpy(n->kids, kids, sizeof(int) * (size_t)nk);
    n->n = nk;
    memcpy(n->first, c->g->nodes[kids[0]].first, sizeof n->first);
    for (int k = 0; k < nk; k++) n->cost += c->g->nodes[kids[k]].cost;
    return id;
}

static int text_node(compiler *c) {
    int id = new_node(c, N_TEXT, c->err);
    if (id >= 0)
        for (int q = 0; q < 4; q++) c->g->nodes[id].first[q] = ~0ull;
    return id;
}

static int opt_node(compiler *c, int kid) {
    if (kid < 0) return kid;
    int id = new_node(c, N_OPT, c->err);
    if (id < 0) return id;
    c->g->nodes[id].items = kid;
    memcpy(c->g->nodes[id].first, c->g->nodes[kid].first, sizeof c->g->nodes[id].first);
    return id;
}

typedef struct {
    char *lit;
    int kid;
} choice_entry;

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const choice_entry *)a)->lit, ((const choice_entry *)b)->lit);
}

/* A choice of byte literals, none a prefix of another, each followed by its node; takes the literals (malloc'd). */
static int choice_node(compiler *c, choice_entry *e, int ne) {
    int id = new_node(c, N_CHOICE, c->err);
    cnode *n = id < 0 ? NULL : &c->g->nodes[id];
    if (n && (!(n->lits = calloc((size_t)ne, sizeof *n->lits)) || !(n->lens = calloc((size_t)ne, sizeof *n->lens)) ||
              !(n->kids = calloc((size_t)ne, sizeof *n->kids)) || !(n->tcs = calloc((size_t)ne, sizeof *n->tcs))))
        id = k3c_errf(c->err, K3C_ENOMEM, "out of memory");
    if (id < 0) {
        for (int k = 0; k < ne; k++) free(e[k].lit);
        return id;
    }
    qsort(e, (size_t)ne, sizeof *e, cmp_entry);
    n->n = ne;
    n->cost = INT64_MAX;
    for (int k = 0; k < ne; k++) n->lits[k] = e[k].lit, n->lens[k] = strlen(e[k].lit), n->kids[k] = e[k].kid;
    for (int k = 0; k < ne; k++) {
        set_bit(n->first, (unsigned char)e[k].lit[0]);
        int32_t b[256];
        int nb = n->lens[k] < 256 ? (int)n->lens[k] : 256;
        for (int q = 0; q < nb; q++) b[q] = (unsigned char)e[k].lit[q];
        if (nb < (int)n->lens[k]) return k3c_errf(c->err, K3C_EUNSUPPORTED, "constraint: a tool name over 200 bytes");
        if (!(n->tcs[k] = token_costs(c->g, b, nb, c->err))) return -1;
        int64_t cost = n->tcs[k][0] + c->g->nodes[e[k].kid].cost;
        if (cost < n->cost) n->cost = cost;
    }
    for (int k = 0; k + 1 < ne; k++)
        if (!strncmp(n->lits[k], n->lits[k + 1], n->lens[k]))
            return k3c_errf(c->err, K3C_EINVAL, "constraint: the choice '%s' is a prefix of '%s'", n->lits[k],
                            n->lits[k + 1]);
    return id;
}

/* ---------------------------------------------------------------- grammars */

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int grammar_alloc(const k3c_tok *tok, const k3c_vtrie *trie, int spaced, k3c_cgrammar **out, k3c_err *err) {
    k3c_cgrammar *g = calloc(1, sizeof *g);
    if (!g || !(g->nodes = calloc(MAX_NODES, sizeof *g->nodes))) {
        free(g);
        return k3c_errf(err, K3C_ENOMEM, "out of memory");
    }
    g->tok = tok, g->trie = trie, g->spaced = spaced, g->refs = 1;
    for (int k = 0; k < 8; k++) g->mark_id[k] = -1;
    g->nspecial = k3c_tok_n_specials(tok);
    if (!(g->special = malloc(sizeof(int32_t) * (size_t)(g->nspecial + 1)))) {
        k3c_cgrammar_free(g);
        return k3c_errf(err, K3C_ENOMEM, "out of memory");
    }
    for (int i = 0; i < g->nspecial; i++) k3c_tok_special_at(tok, i, NULL, NULL, &g->special[i]);
    qsort(g->special, (size_t)g->nspecial, sizeof *g->special, cmp_i32);
    *out = g;
    return K3C_OK;
}

static int grammar_done(k3c_cgrammar *g, int root, k3c_err *err, k3c_cgrammar **out) {
    if (root < 0) {
        int rc = err->code ? err->code : K3C_EINVAL;
        k3c_cgrammar_free(g);
        return rc;
    }
    g->root = root;
    *out = g;
    return K3C_OK;
}

/* The schema's value node: the any-value node first (json_object and `true` refer to it), then the schema's. */
static int value_node(compiler *c, const k3c_json *schema) {
    k3c_cgrammar *g = c->g;
    g->any = any_value(c);
    if (g->any < 0) return g->any;
    g->any_str = g->nodes[g->any].kids[2];
    return schema ? compile(c, schema, "") : g->nodes[g->any].kids[0];
}

int k3c_cgrammar_new(const k3c_tok *tok, const k3c_vtrie *trie, const k3c_json *schema, const char *prefix,
                     const char *suffix, int spaced, k3c_cgrammar **out, char *path, size_t npath, k3c_err *err) {
    *out = NULL;
    if (npath) path[0] = '\0';
    k3c_cgrammar *g;
    int rc = grammar_alloc(tok, trie, spaced, &g, err);
    if (rc) return rc;
    compiler c = {g, schema, path, npath, err, 0};
    int parts[3], np = 0;
    if (prefix[0]) parts[np++] = lit_node(&c, prefix);
    parts[np++] = value_node(&c, schema);
    if (suffix[0]) parts[np++] = lit_node(&c, suffix);
    return grammar_done(g, seq_node(&c, parts, np), err, out);
}

static void node_free(cnode *n) {
    for (int k = 0; n->lits && k < n->n; k++) free(n->lits[k]);
    for (int k = 0; n->tcs && k < n->n; k++) free(n->tcs[k]);
    free(n->lits), free(n->lens), free(n->kids), free(n->syms), free(n->tc), free(n->tcs);
}

/* The arguments of one tool: its parameters where the subset covers them, else any object. */
static int tool_args(compiler *c, const k3c_json *fn) {
    const k3c_json *params = k3c_json_get(fn, "parameters");
    if (!params || params->type != K3C_JSON_OBJECT) return c->g->nodes[c->g->any].kids[0];
    int nn = c->g->nn;
    k3c_err quiet = {0};
    char path[8];
    compiler sub = {c->g, params, path, sizeof path, &quiet, 0};
    int id = compile(&sub, params, "");
    if (id >= 0 && c->g->nodes[id].kind == N_OBJ) return id;
    if (quiet.code == K3C_ENOMEM) return k3c_errf(c->err, K3C_ENOMEM, "out of memory");
    for (int i = nn; i < c->g->nn; i++) node_free(&c->g->nodes[i]); /* drop what the failed compile made */
    c->g->nn = nn;
    return c->g->nodes[c->g->any].kids[0];
}

/* The function object of a tool (OpenAI's {"type":"function","function":{..}}, or the function itself). */
static const k3c_json *tool_function(const k3c_json *t) {
    const k3c_json *fn = k3c_json_get(t, "function");
    return fn && fn->type == K3C_JSON_OBJECT ? fn : t;
}

/* The calls of the tools channel: call k (1-based) of a chosen tool with its arguments as one json element, then
 * optionally call k + 1, up to max. tails[t]: tool t's part after its name. */
static int calls_node(compiler *c, const k3c_cchat *sp, const int *tails, int k, int max) {
    choice_entry e[64];
    int ne = 0;
    for (size_t t = 0; t < sp->tools->n && ne < 64; t++) {
        const k3c_json *name = k3c_json_get(tool_function(&sp->tools->items[t]), "name");
        if (!name || name->type != K3C_JSON_STRING || tails[t] < 0) continue;
        if (sp->tools_mode == K3C_CTOOLS_NAMED && strcmp(name->string, sp->tool_name)) continue;
        k3c_sbuf s;
        k3c_sbuf_init(&s);
        k3c_sbuf_printf(&s, "%s\" index=\"%d\"", name->string, k);
        if (!s.ok) return k3c_errf(c->err, K3C_ENOMEM, "out of memory");
        e[ne++] = (choice_entry){s.buf, tails[t]};
    }
    if (ne == 0) return k3c_errf(c->err, K3C_EINVAL, "constraint: no tool to call");
    int parts[3] = {lit_node(c, "<|open|>call tool=\""), choice_node(c, e, ne), 0};
    int np = 2;
    if (k < max) parts[np++] = opt_node(c, calls_node(c, sp, tails, k + 1, max));
    return seq_node(c, parts, np);
}

/* A tool name is written raw inside an attribute: quotes, markup and control characters are refused. */
static int plain_name(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (*s == '"' || *s == '<' || *s == '&' || (unsigned char)*s < 0x20) return 0;
    return 1;
}

static int tools_node(compiler *c, const k3c_cchat *sp) {
    int tails[64];
    if (!sp->tools || sp->tools->type != K3C_JSON_ARRAY || sp->tools->n == 0)
        return k3c_errf(c->err, K3C_EINVAL, "tool_choice: the request has no tools");
    if (sp->tools->n > 64) return unsupported(c, "tools", "more than 64 tools");
    for (size_t t = 0; t < sp->tools->n; t++) {
        const k3c_json *fn = tool_function(&sp->tools->items[t]), *name = k3c_json_get(fn, "name");
        tails[t] = -1;
        if (!name || name->type != K3C_JSON_STRING) continue;
        if (!plain_name(name->string)) return unsupported(c, "tools", "a tool name with quotes or markup");
        int args = tool_args(c, fn);
        int parts[3] = {lit_node(c, "<|sep|><|open|>json type=\"object\"<|sep|>"), args,
                        lit_node(c, "<|close|>json<|sep|><|close|>call<|sep|>")};
        if ((tails[t] = seq_node(c, parts, 3)) < 0) return tails[t];
    }
    return calls_node(c, sp, tails, 1, sp->one_call ? 1 : 8);
}

int k3c_cgrammar_chat(const k3c_tok *tok, const k3c_vtrie *trie, const k3c_cchat *sp, k3c_cgrammar **out,
                      char *path, size_t npath, k3c_err *err) {
    *out = NULL;
    if (npath) path[0] = '\0';
    int xtml = sp->format == K3C_CHAT_XTML;
    int tools = xtml && sp->tools_mode != K3C_CTOOLS_ANY;
    if (!sp->json && !tools) return K3C_OK;
    k3c_cgrammar *g;
    int rc = grammar_alloc(tok, trie, 1, &g, err);
    if (rc) return rc;
    compiler c = {g, sp->schema, path, npath, err, 0};
    int parts[6], np = 0, value = value_node(&c, sp->json ? sp->schema : NULL);
    if (!xtml) { /* K2: the JSON value ends the turn */
        parts[np++] = value;
        parts[np++] = lit_node(&c, "<|im_end|>");
        return grammar_done(g, seq_node(&c, parts, np), err, out);
    }
    if (sp->thinking) {
        parts[np++] = text_node(&c);
        parts[np++] = lit_node(&c, "<|close|>think<|sep|><|open|>response<|sep|>");
    }
    const char *end = "<|close|>message<|sep|><|end_of_msg|>";
    char tail[96];
    if (tools && sp->tools_mode != K3C_CTOOLS_NONE) {
        parts[np++] = lit_node(&c, "<|close|>response<|sep|><|open|>tools<|sep|>");
        parts[np++] = value < 0 ? value : tools_node(&c, sp);
        snprintf(tail, sizeof tail, "<|close|>tools<|sep|>%s", end);
    } else {
        parts[np++] = sp->json ? value : text_node(&c);
        snprintf(tail, sizeof tail, "<|close|>response<|sep|>%s", end);
    }
    parts[np++] = lit_node(&c, tail);
    return grammar_done(g, seq_node(&c, parts, np), err, out);
}

void k3c_cgrammar_ref(k3c_cgrammar *g) { __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED); }

/* Drops one holder's reference; the last one frees (the samples of a request end on the engine thread in any order). */
void k3c_cgrammar_free(k3c_cgrammar *g) {
    if (!g || __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    for (int i = 0; i < g->nn; i++) node_free(&g->nodes[i]);
    free(g->nodes), free(g->special), free(g);
}

int64_t k3c_cgrammar_min_tokens(const k3c_cgrammar *g) { return g->nodes[g->root].cost; }
