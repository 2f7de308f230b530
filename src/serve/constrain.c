/* constrain.c — constrained decoding: a JSON-schema subset compiled to a deterministic pushdown automaton over bytes
 * and chat markers (prefix markup, one JSON value, suffix markup), and the per-step token mask over the vocabulary,
 * budget-aware so the answer always closes within the tokens left. docs/SERVING.md "Constrained decoding". */
#include "serve/constrain.h"

#include "tok/tok.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { N_OBJ, N_ANYOBJ, N_ARR, N_STR, N_NUM, N_INT, N_ENUM, N_ANYOF };
#define MAX_NODES 4096
#define MAX_DEPTH 64
#define MAX_PROPS 64
#define SYM_MARK 256 /* markers are symbols 256 + their index in g->mark_id */

typedef struct {
    int kind, n, items;    /* items: N_ARR's element node */
    int *kids;             /* N_OBJ: property value nodes; N_ANYOF: branches */
    char **lits;           /* N_OBJ: `"key":` (+ space when spaced); N_ENUM: the values' JSON, sorted */
    size_t *lens;
    unsigned char req[MAX_PROPS];
    uint64_t first[4];     /* the bytes a value of this node may start with */
    int64_t cost;          /* the shortest value in bytes */
} cnode;

struct k3c_cgrammar {
    const k3c_tok *tok;
    cnode *nodes;
    int nn, root, spaced, any, any_str; /* any: the any-value node, any_str: its string branch */
    int32_t *pre, *suf; /* symbols */
    int npre, nsuf;
    int32_t mark_id[8];
    int nmark;
    int32_t *special; /* sorted special ids of the vocabulary */
    int nspecial;
};

typedef struct {
    int16_t node, phase;
    int32_t i, pos, a;
    uint64_t cand;
} frame;

typedef struct {
    int part; /* 0 prefix, 1 JSON, 2 suffix, 3 done */
    int pos, n;
    frame f[MAX_DEPTH];
} cstate;

typedef struct {
    k3c_constraint iface;
    const k3c_cgrammar *g;
    cstate st;
} cimpl;

/* ---------------------------------------------------------------- compiling */

static void set_bit(uint64_t *b, int c) { b[c >> 6] |= 1ull << (c & 63); }
static int has_bit(const uint64_t *b, int c) { return (int)(b[c >> 6] >> (c & 63) & 1); }

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
    for (int k = 0; k < 4; k++) n->first[k] = ~0ull; /* dispatch checks each branch */
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
            free(kids);
            return kids[i];
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
static int symbols(k3c_cgrammar *g, const char *s, int32_t **out, int *n, k3c_err *err) {
    static const char *const MARKS[] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "<|im_end|>"};
    size_t len = strlen(s);
    *out = malloc(sizeof(int32_t) * (len + 1));
    if (!*out) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    *n = 0;
    for (size_t i = 0; i < len;) {
        int hit = -1;
        for (int k = 0; k < 5 && hit < 0; k++)
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

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int k3c_cgrammar_new(const k3c_tok *tok, const k3c_json *schema, const char *prefix, const char *suffix, int spaced,
                     k3c_cgrammar **out, char *path, size_t npath, k3c_err *err) {
    *out = NULL;
    if (npath) path[0] = '\0';
    k3c_cgrammar *g = calloc(1, sizeof *g);
    if (!g || !(g->nodes = calloc(MAX_NODES, sizeof *g->nodes))) {
        free(g);
        return k3c_errf(err, K3C_ENOMEM, "out of memory");
    }
    g->tok = tok;
    g->spaced = spaced;
    for (int k = 0; k < 8; k++) g->mark_id[k] = -1;
    g->nmark = 5;
    compiler c = {g, schema, path, npath, err, 0};
    int rc = K3C_OK;
    g->any = any_value(&c);
    if (g->any >= 0) g->any_str = g->nodes[g->any].kids[2];
    g->root = g->any < 0 ? g->any : schema ? compile(&c, schema, "") : g->nodes[g->any].kids[0];
    if (g->root < 0) rc = err->code ? err->code : K3C_EINVAL;
    if (!rc) rc = symbols(g, prefix, &g->pre, &g->npre, err);
    if (!rc) rc = symbols(g, suffix, &g->suf, &g->nsuf, err);
    g->nspecial = k3c_tok_n_specials(tok);
    if (!rc && !(g->special = malloc(sizeof(int32_t) * (size_t)(g->nspecial + 1))))
        rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    for (int i = 0; !rc && i < g->nspecial; i++) k3c_tok_special_at(tok, i, NULL, NULL, &g->special[i]);
    if (!rc) qsort(g->special, (size_t)g->nspecial, sizeof *g->special, cmp_i32);
    if (rc) {
        k3c_cgrammar_free(g);
        return rc;
    }
    *out = g;
    return K3C_OK;
}

void k3c_cgrammar_free(k3c_cgrammar *g) {
    if (!g) return;
    for (int i = 0; i < g->nn; i++) {
        cnode *n = &g->nodes[i];
        for (int k = 0; n->lits && k < n->n; k++) free(n->lits[k]);
        free(n->lits), free(n->lens), free(n->kids);
    }
    free(g->nodes), free(g->pre), free(g->suf), free(g->special), free(g);
}

int64_t k3c_cgrammar_min_tokens(const k3c_cgrammar *g) { return g->npre + g->nodes[g->root].cost + g->nsuf; }

/* ---------------------------------------------------------------- the automaton */

enum { R_FAIL, R_TAKEN, R_TAKEN_POP, R_POP, R_PUSHED };

static int push(cstate *s, int node) {
    if (s->n == MAX_DEPTH) return R_FAIL;
    s->f[s->n++] = (frame){(int16_t)node, 0, 0, 0, 0, 0};
    return R_PUSHED;
}

/* Free text inside a JSON string: whole UTF-8 characters, control characters escaped, and never "<|", so the chat
 * parser cannot read a marker into it. */
static int str_byte(frame *f, int b) {
    if (f->a > 0) { /* a = continuation bytes still due, i/pos = the next one's range */
        if (b < f->i || b > f->pos) return R_FAIL;
        f->a--, f->i = 0x80, f->pos = 0xbf;
        return R_TAKEN;
    }
    if (f->phase == 2) { /* after a backslash */
        if (b == 'u') return f->phase = 3, f->cand = 4, R_TAKEN;
        if (!strchr("\"\\/bfnrt", b) || !b) return R_FAIL;
        return f->phase = 1, R_TAKEN;
    }
    if (f->phase == 3) { /* \uXXXX */
        if (!((b >= '0' && b <= '9') || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'))) return R_FAIL;
        if (--f->cand == 0) f->phase = 1;
        return R_TAKEN;
    }
    int lt = (int)(f->cand == 1);
    f->cand = b == '<';
    if (b == '"') return R_TAKEN_POP;
    if (b == '\\') return f->phase = 2, R_TAKEN;
    if (b < 0x20 || (lt && b == '|')) return R_FAIL;
    if (b < 0x80) return R_TAKEN;
    if (b >= 0xc2 && b <= 0xdf) return f->a = 1, f->i = 0x80, f->pos = 0xbf, R_TAKEN;
    if (b >= 0xe0 && b <= 0xef)
        return f->a = 2, f->i = b == 0xe0 ? 0xa0 : 0x80, f->pos = b == 0xed ? 0x9f : 0xbf, R_TAKEN;
    if (b >= 0xf0 && b <= 0xf4)
        return f->a = 3, f->i = b == 0xf0 ? 0x90 : 0x80, f->pos = b == 0xf4 ? 0x8f : 0xbf, R_TAKEN;
    return R_FAIL;
}

/* JSON numbers: phases 0 start, 1 after '-', 2 integer digits, 3 a leading 0, 4 after '.', 5 fraction, 6 after 'e',
 * 7 after the exponent's sign, 8 exponent digits; 2, 3, 5 and 8 may end; i counts the digits of 2 and 8. */
static int num_byte(frame *f, int b, int integer) {
    int d = b >= '0' && b <= '9', p = f->phase;
    /* at most 15 integer digits and 2 exponent digits: every value fits a double and an int64 exactly */
    if (d && (p == 2 || p == 8) && ++f->i > (p == 2 ? 14 : 1)) return p == 2 || p == 8 ? R_POP : R_FAIL;
    if (d && (p == 6 || p == 7)) f->i = 0;
    int ends = p == 2 || p == 3 || p == 5 || p == 8;
    if ((p == 0 && b == '-') ) return f->phase = 1, R_TAKEN;
    if ((p == 0 || p == 1) && d) return f->phase = b == '0' ? 3 : 2, R_TAKEN;
    if ((p == 2 && d) || ((p == 4 || p == 5) && d && (f->phase = 5)) || ((p == 6 || p == 7 || p == 8) && d && (f->phase = 8)))
        return R_TAKEN;
    if (!integer && (p == 2 || p == 3) && b == '.') return f->phase = 4, R_TAKEN;
    if (!integer && (p == 2 || p == 3 || p == 5) && (b == 'e' || b == 'E')) return f->phase = 6, R_TAKEN;
    if (p == 6 && (b == '+' || b == '-')) return f->phase = 7, R_TAKEN;
    return ends ? R_POP : R_FAIL;
}

/* An enum frame: the candidates [i, a) share the first pos bytes. */
static int enum_byte(const cnode *n, frame *f, int b) {
    int lo = f->i, hi = f->a, nlo = -1, nhi = -1, whole = 0;
    for (int k = lo; k < hi; k++) {
        if (n->lens[k] == (size_t)f->pos) whole = 1;
        if (n->lens[k] > (size_t)f->pos && (unsigned char)n->lits[k][f->pos] == b) {
            if (nlo < 0) nlo = k;
            nhi = k + 1;
        }
    }
    if (nlo < 0) return whole ? R_POP : R_FAIL;
    f->i = nlo, f->a = nhi, f->pos++;
    if (nhi - nlo == 1 && n->lens[nlo] == (size_t)f->pos) return R_TAKEN_POP;
    return R_TAKEN;
}

/* First required property at or after i (n when none). */
static int next_req(const cnode *n, int i) {
    while (i < n->n && !n->req[i]) i++;
    return i;
}

/* A typed object: phase 0 before '{', 1 after '{' (a = 1) or ',' (a = 0), 2 in a key (cand: the properties still
 * matching, pos into their literal), 5 key done (a: its property), 3 after a value; i: the next property. */
static int obj_byte(const k3c_cgrammar *g, cstate *s, frame *f, const cnode *n, int b) {
    switch (f->phase) {
    case 0: return b == '{' ? (f->phase = 1, f->a = 1, R_TAKEN) : R_FAIL;
    case 1:
        if (b == '}' && f->a && next_req(n, f->i) == n->n) return R_TAKEN_POP;
        if (b != '"' || f->i >= n->n) return R_FAIL;
        f->cand = 0;
        for (int j = f->i; j <= next_req(n, f->i) && j < n->n; j++) f->cand |= 1ull << j;
        f->phase = 2, f->pos = 0;
        __attribute__((fallthrough)); /* the quote is the literal's first byte */
    case 2: {
        uint64_t keep = 0;
        int done = -1;
        for (int j = 0; j < n->n; j++)
            if (f->cand >> j & 1 && n->lens[j] > (size_t)f->pos && (unsigned char)n->lits[j][f->pos] == b) {
                keep |= 1ull << j;
                if (n->lens[j] == (size_t)f->pos + 1) done = j;
            }
        if (!keep) return R_FAIL;
        f->cand = keep, f->pos++;
        if (done >= 0) f->phase = 5, f->a = done;
        return R_TAKEN;
    }
    case 5:
        f->phase = 3, f->i = f->a + 1;
        return push(s, n->kids[f->a]);
    case 3:
        if (b == '}' && next_req(n, f->i) == n->n) return R_TAKEN_POP;
        if (b == ',' && f->i < n->n) return f->phase = g->spaced ? 6 : 1, f->a = 0, R_TAKEN;
        return R_FAIL;
    case 6: return b == ' ' ? (f->phase = 1, R_TAKEN) : R_FAIL;
    }
    return R_FAIL;
}

/* Any object (json_object): 0 before '{', 1 after '{' (a = 1) or ',', 4 key read (':' due), 7 after ':' (space due
 * when spaced), 5 value due, 3 after a value. */
static int anyobj_byte(const k3c_cgrammar *g, cstate *s, frame *f, int b, int str_node) {
    switch (f->phase) {
    case 0: return b == '{' ? (f->phase = 1, f->a = 1, R_TAKEN) : R_FAIL;
    case 1:
        if (b == '}' && f->a) return R_TAKEN_POP;
        if (b != '"') return R_FAIL;
        f->phase = 4;
        return push(s, str_node);
    case 4: return b == ':' ? (f->phase = g->spaced ? 7 : 5, R_TAKEN) : R_FAIL;
    case 7: return b == ' ' ? (f->phase = 5, R_TAKEN) : R_FAIL;
    case 5: f->phase = 3; return push(s, -1);
    case 3:
        if (b == '}') return R_TAKEN_POP;
        if (b == ',') return f->phase = g->spaced ? 6 : 1, f->a = 0, R_TAKEN;
        return R_FAIL;
    case 6: return b == ' ' ? (f->phase = 1, R_TAKEN) : R_FAIL;
    }
    return R_FAIL;
}

/* Arrays: 0 before '[', 1 after '[', 2 item due, 3 after an item, 6 space due after ','. */
static int arr_byte(const k3c_cgrammar *g, cstate *s, frame *f, const cnode *n, int b) {
    switch (f->phase) {
    case 0: return b == '[' ? (f->phase = 1, R_TAKEN) : R_FAIL;
    case 1:
        if (b == ']') return R_TAKEN_POP;
        __attribute__((fallthrough));
    case 2: f->phase = 3; return push(s, n->items);
    case 3:
        if (b == ']') return R_TAKEN_POP;
        return b == ',' ? (f->phase = g->spaced ? 6 : 2, R_TAKEN) : R_FAIL;
    case 6: return b == ' ' ? (f->phase = 2, R_TAKEN) : R_FAIL;
    }
    return R_FAIL;
}

static int json_byte(const k3c_cgrammar *g, cstate *s, int b) {
    for (int guard = 0; guard < 4 * MAX_DEPTH; guard++) {
        if (s->n == 0) return 0;
        frame *f = &s->f[s->n - 1];
        const cnode *n = &g->nodes[f->node];
        int r = R_FAIL;
        switch (n->kind) {
        case N_STR: r = f->phase == 0 ? (b == '"' ? (f->phase = 1, R_TAKEN) : R_FAIL) : str_byte(f, b); break;
        case N_NUM: r = num_byte(f, b, 0); break;
        case N_INT: r = num_byte(f, b, 1); break;
        case N_ENUM:
            if (f->phase == 0) f->phase = 1, f->i = 0, f->a = n->n, f->pos = 0;
            r = enum_byte(n, f, b);
            break;
        case N_OBJ: r = obj_byte(g, s, f, n, b); break;
        case N_ARR: r = arr_byte(g, s, f, n, b); break;
        case N_ANYOBJ: {
            r = anyobj_byte(g, s, f, b, g->any_str);
            if (r == R_PUSHED && s->f[s->n - 1].node == -1) s->f[s->n - 1].node = (int16_t)g->any;
            break;
        }
        case N_ANYOF: {
            int k = 0;
            while (k < n->n && !has_bit(g->nodes[n->kids[k]].first, b)) k++;
            if (k == n->n) return 0;
            *f = (frame){(int16_t)n->kids[k], 0, 0, 0, 0, 0};
            r = R_PUSHED;
            break;
        }
        }
        if (r == R_FAIL) return 0;
        if (r == R_TAKEN) return 1;
        if (r == R_TAKEN_POP) return s->n--, 1;
        if (r == R_POP) s->n--;
    }
    return 0;
}

/* One symbol (a byte, or SYM_MARK + marker): 1 taken, 0 refused (the state is then garbage). */
static int step(const k3c_cgrammar *g, cstate *s, int sym) {
    if (s->part == 1) {
        if (sym < SYM_MARK && json_byte(g, s, sym)) {
            if (s->n == 0) s->part = 2, s->pos = 0;
            return 1;
        }
        if (sym < SYM_MARK) return 0;
        while (s->n) { /* a root number or enum ends at the marker after it */
            const frame *f = &s->f[s->n - 1];
            const cnode *n = &g->nodes[f->node];
            int ends = (n->kind == N_NUM || n->kind == N_INT) && (f->phase == 2 || f->phase == 3 || f->phase == 5 || f->phase == 8);
            for (int k = f->i; n->kind == N_ENUM && f->phase && k < f->a; k++) ends |= n->lens[k] == (size_t)f->pos;
            if (!ends) return 0;
            s->n--;
        }
        s->part = 2, s->pos = 0;
    }
    if (s->part == 0 || s->part == 2) {
        const int32_t *lit = s->part ? g->suf : g->pre;
        int nl = s->part ? g->nsuf : g->npre;
        if (s->pos >= nl) {
            if (s->part == 2) return 0;
            s->part = 1, s->n = 0;
            push(s, g->root);
            return step(g, s, sym);
        }
        if (lit[s->pos] != sym) return 0;
        if (++s->pos == nl) {
            if (s->part == 2) s->part = 3;
            else s->part = 1, s->n = 0, push(s, g->root);
        }
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- budget: symbols the shortest completion takes */

static int64_t obj_rest(const k3c_cgrammar *g, const cnode *n, int i) { /* from after a value, before , or } */
    int64_t c = 1;
    for (int j = i; j < n->n; j++)
        if (n->req[j]) c += 1 + g->spaced + (int64_t)n->lens[j] + g->nodes[n->kids[j]].cost;
    return c;
}

static int64_t frame_cost(const k3c_cgrammar *g, const frame *f) {
    const cnode *n = &g->nodes[f->node];
    int64_t best = INT64_MAX;
    switch (n->kind) {
    case N_STR:
        if (f->phase == 0) return 2;
        return 1 + f->a + (f->phase == 2 ? 1 : f->phase == 3 ? (int64_t)f->cand : 0);
    case N_NUM:
    case N_INT: return f->phase == 2 || f->phase == 3 || f->phase == 5 || f->phase == 8 ? 0 : 1;
    case N_ENUM:
        if (f->phase == 0) return n->cost;
        for (int k = f->i; k < f->a; k++)
            if ((int64_t)n->lens[k] - f->pos < best) best = (int64_t)n->lens[k] - f->pos;
        return best;
    case N_ARR: return f->phase == 0 ? 2 : f->phase == 2 ? g->nodes[n->items].cost + 1 : f->phase == 6 ? g->nodes[n->items].cost + 2 : 1;
    case N_ANYOBJ: {
        static const int64_t c[8] = {2, 5, 0, 1, 3, 2, 6, 3};
        return f->phase == 1 && f->a ? 1 : c[f->phase];
    }
    case N_ANYOF: return n->cost;
    case N_OBJ:
        if (f->phase == 0) return n->cost;
        if (f->phase == 3) return obj_rest(g, n, f->i);
        if (f->phase == 5) return g->nodes[n->kids[f->a]].cost + obj_rest(g, n, f->a + 1);
        for (int j = f->i; j < n->n && (f->phase != 2 || j < 64); j++) {
            if (f->phase == 2 && !(f->cand >> j & 1)) continue;
            int64_t c = (int64_t)n->lens[j] - (f->phase == 2 ? f->pos : 0) + g->nodes[n->kids[j]].cost +
                        obj_rest(g, n, j + 1) + (f->phase == 6);
            if (c < best) best = c;
            if (n->req[j]) break;
        }
        if (f->phase == 1 && f->a && next_req(n, f->i) == n->n) best = 1;
        return best;
    }
    return 0;
}

static int64_t state_cost(const k3c_cgrammar *g, const cstate *s) {
    if (s->part == 3) return 0;
    if (s->part == 2) return g->nsuf - s->pos;
    if (s->part == 0) return g->npre - s->pos + g->nodes[g->root].cost + g->nsuf;
    int64_t c = g->nsuf;
    for (int k = 0; k < s->n; k++) c += frame_cost(g, &s->f[k]);
    return c;
}

/* ---------------------------------------------------------------- the mask */

static int marker_of(const k3c_cgrammar *g, int32_t id) {
    for (int k = 0; k < g->nmark; k++)
        if (g->mark_id[k] == id) return SYM_MARK + k;
    return -1;
}

static int is_special(const k3c_cgrammar *g, int32_t id) {
    return bsearch(&id, g->special, (size_t)g->nspecial, sizeof id, cmp_i32) != NULL;
}

/* The state after token id, or 0 when the automaton refuses it. */
static int advance(const k3c_cgrammar *g, const cstate *from, int32_t id, cstate *to) {
    const unsigned char *b;
    size_t len;
    if (is_special(g, id)) {
        int m = marker_of(g, id);
        if (m < 0) return 0;
        *to = *from;
        return step(g, to, m);
    }
    if (k3c_tok_token_bytes(g->tok, id, &b, &len, NULL) || len == 0) return 0;
    *to = *from;
    for (size_t i = 0; i < len; i++)
        if (!step(g, to, b[i])) return 0;
    return 1;
}

static int c_mask(void *ctx, float *logits, int64_t V, int64_t left) {
    cimpl *c = ctx;
    cstate t;
    int64_t n_ok = 0;
    for (int64_t id = 0; id < V; id++) {
        if (logits[id] == -INFINITY) continue;
        int ok = advance(c->g, &c->st, (int32_t)id, &t) && state_cost(c->g, &t) <= left - 1;
        if (!ok) logits[id] = -INFINITY;
        n_ok += ok;
    }
    return n_ok ? K3C_OK : K3C_ENUMERIC;
}

static int c_accept(void *ctx, int32_t id) {
    cimpl *c = ctx;
    cstate t;
    if (!advance(c->g, &c->st, id, &t)) return K3C_EINVAL;
    c->st = t;
    return K3C_OK;
}

static void c_release(void *ctx) { free(ctx); }

int k3c_constraint_new(const k3c_cgrammar *g, k3c_constraint **out, k3c_err *err) {
    cimpl *c = calloc(1, sizeof *c);
    if (!c) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    c->g = g;
    c->iface = (k3c_constraint){c, c_mask, c_accept, c_release};
    if (g->npre == 0) c->st.part = 1, push(&c->st, g->root);
    *out = &c->iface;
    return K3C_OK;
}

int k3c_constraint_feed(k3c_constraint *k, const char *s, size_t n) {
    cimpl *c = k->ctx;
    cstate t = c->st;
    for (size_t i = 0; i < n; i++)
        if (!step(c->g, &t, (unsigned char)s[i])) return 0;
    c->st = t;
    return 1;
}

int k3c_constraint_done(const k3c_constraint *k) { return ((const cimpl *)k->ctx)->st.part == 3; }
