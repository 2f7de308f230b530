/* constrain_impl.h — the inside of constrained decoding shared by its files: the grammar's nodes, the automaton's
 * frames and state, the symbol step and the budget. docs/SERVING.md "Constrained decoding". */
#ifndef K3C_SERVE_CONSTRAIN_IMPL_H
#define K3C_SERVE_CONSTRAIN_IMPL_H

#include "serve/constrain.h"

/* JSON values (schema nodes), then the markup around them: a literal of symbols, a sequence, free text up to the next
 * marker, a choice of byte literals each followed by its own node, an optional node. */
enum { N_OBJ, N_ANYOBJ, N_ARR, N_STR, N_NUM, N_INT, N_ENUM, N_ANYOF, N_LIT, N_SEQ, N_TEXT, N_CHOICE, N_OPT };
#define MAX_NODES 4096
#define MAX_DEPTH 64
#define MAX_PROPS 64
#define SYM_MARK 256 /* markers are symbols 256 + their index in g->mark_id */
#define N_MARKS 5

typedef struct {
    int kind, n, items; /* items: N_ARR's element node, N_OPT's node */
    int *kids;          /* N_OBJ: property value nodes; N_ANYOF: branches; N_SEQ: parts; N_CHOICE: per literal */
    char **lits;        /* N_OBJ: `"key":` (+ space when spaced); N_ENUM: the values' JSON; N_CHOICE: literals;
                           sorted in N_ENUM and N_CHOICE */
    size_t *lens;
    int32_t *syms; /* N_LIT: n symbols */
    int32_t *tc;   /* N_LIT: tc[p] = the fewest tokens that spell syms[p..n) */
    int32_t **tcs; /* N_CHOICE: the same per literal */
    unsigned char req[MAX_PROPS];
    uint64_t first[5]; /* the symbols a value of this node may start with */
    int64_t cost;      /* the shortest value in symbols */
} cnode;

struct k3c_cgrammar {
    const k3c_tok *tok;
    const k3c_vtrie *trie; /* NULL: the mask tries every id */
    cnode *nodes;
    int nn, root, spaced, any, any_str; /* any: the any-value node, any_str: its string branch */
    int32_t mark_id[8];
    int32_t *special; /* sorted special ids of the vocabulary */
    int nspecial;
    int refs; /* holders (k3c_cgrammar_ref): the n samples of one request share their grammar */
};

typedef struct {
    int16_t node, phase;
    int32_t i, pos, a;
    uint64_t cand;
} frame;

typedef struct {
    int n;
    frame f[MAX_DEPTH];
} cstate;

/* One symbol (a byte, or SYM_MARK + marker): 1 taken, 0 refused (the state is then garbage). */
int k3c_cstep(const k3c_cgrammar *g, cstate *s, int sym);
/* The state at the start of the answer; the state after the top frame's value ends (a JSON string's quote). */
void k3c_cstate_init(const k3c_cgrammar *g, cstate *s);
void k3c_cstate_close(const k3c_cgrammar *g, cstate *s);
/* Symbols the shortest completion from s takes. */
int64_t k3c_cstate_cost(const k3c_cgrammar *g, const cstate *s);
int64_t k3c_cframe_cost(const k3c_cgrammar *g, const frame *f);
/* The marker symbol of a special id, -1 when it is none of the grammar's markers. */
int k3c_cmarker_of(const k3c_cgrammar *g, int32_t id);
int k3c_cis_special(const k3c_cgrammar *g, int32_t id);
/* The lengths of the vocabulary's tokens that spell a prefix of the bytes b[0..n) (at most max); the count. */
int k3c_vtrie_prefixes(const k3c_vtrie *t, const int32_t *b, int n, int *lens, int max);

#endif
