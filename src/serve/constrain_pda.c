/* constrain_pda.c — the automaton of constrained decoding: one symbol (a byte or a chat marker) at a time through a
 * stack of frames over the grammar's nodes, and the shortest completion from a state (the mask's budget).
 * docs/SERVING.md "Constrained decoding". */
#include "serve/constrain_impl.h"

#include <stdlib.h>
#include <string.h>

static int has_bit(const uint64_t *b, int c) { return (int)(b[c >> 6] >> (c & 63) & 1); }

enum { R_FAIL, R_TAKEN, R_TAKEN_POP, R_POP, R_PUSHED };

static int push(cstate *s, int node) {
    if (s->n == MAX_DEPTH) return R_FAIL;
    s->f[s->n++] = (frame){(int16_t)node, 0, 0, 0, 0, 0};
    return R_PUSHED;
}

/* A character's first byte: ASCII is taken whole; a UTF-8 lead byte sets the continuation bytes due (a) and the range
 * of the next one (i..pos), which excludes overlong forms, surrogates and code points above U+10FFFF. */
static int utf8_lead(frame *f, int b) {
    if (b < 0x80) return R_TAKEN;
    if (b >= 0xc2 && b <= 0xdf) return f->a = 1, f->i = 0x80, f->pos = 0xbf, R_TAKEN;
    if (b >= 0xe0 && b <= 0xef)
        return f->a = 2, f->i = b == 0xe0 ? 0xa0 : 0x80, f->pos = b == 0xed ? 0x9f : 0xbf, R_TAKEN;
    if (b >= 0xf0 && b <= 0xf4)
        return f->a = 3, f->i = b == 0xf0 ? 0x90 : 0x80, f->pos = b == 0xf4 ? 0x8f : 0xbf, R_TAKEN;
    return R_FAIL;
}

/* Free text inside a JSON string: whole UTF-8 characters, control characters escaped, and never "<|", so the chat
 * parser cannot read a marker into it. */
static int str_byte(frame *f, int b) {
    if (b >= SYM_MARK) return R_FAIL;
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
    return utf8_lead(f, b);
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

/* Free text up to the next marker: whole UTF-8 characters, no NUL and never "<|" (a marker spelled in bytes would
 * read as markup); a marker ends it. a/i/pos: continuation bytes due and the next one's range, cand: the last byte was
 * '<'. */
static int text_byte(frame *f, int b) {
    if (b >= SYM_MARK) return f->a ? R_FAIL : R_POP;
    if (f->a > 0) {
        if (b < f->i || b > f->pos) return R_FAIL;
        f->a--, f->i = 0x80, f->pos = 0xbf;
        return R_TAKEN;
    }
    int lt = (int)(f->cand == 1);
    f->cand = b == '<';
    if (b == 0 || (lt && b == '|')) return R_FAIL;
    return utf8_lead(f, b);
}

/* A choice frame: the literals [i, a) share the first pos bytes; the one completed gives way to its node. */
static int choice_byte(const cnode *n, frame *f, int b) {
    if (f->phase == 0) f->phase = 1, f->i = 0, f->a = n->n, f->pos = 0;
    int nlo = -1, nhi = -1;
    for (int k = f->i; k < f->a; k++)
        if (n->lens[k] > (size_t)f->pos && (unsigned char)n->lits[k][f->pos] == b) {
            if (nlo < 0) nlo = k;
            nhi = k + 1;
        }
    if (nlo < 0 || b >= SYM_MARK) return R_FAIL;
    f->i = nlo, f->a = nhi, f->pos++;
    if (nhi - nlo == 1 && n->lens[nlo] == (size_t)f->pos) *f = (frame){(int16_t)n->kids[nlo], 0, 0, 0, 0, 0};
    return R_TAKEN;
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
        case N_LIT:
            if (n->syms[f->pos] != b) return 0;
            r = ++f->pos == n->n ? R_TAKEN_POP : R_TAKEN;
            break;
        case N_SEQ: r = f->i == n->n ? R_POP : push(s, n->kids[f->i++]); break;
        case N_TEXT: r = text_byte(f, b); break;
        case N_CHOICE: r = choice_byte(n, f, b); break;
        case N_OPT:
            if (!has_bit(g->nodes[n->items].first, b)) {
                r = R_POP;
                break;
            }
            *f = (frame){(int16_t)n->items, 0, 0, 0, 0, 0};
            r = R_PUSHED;
            break;
        }
        if (r == R_FAIL) return 0;
        if (r == R_TAKEN) return 1;
        if (r == R_TAKEN_POP) return s->n--, 1;
        if (r == R_POP) s->n--;
    }
    return 0;
}

/* Frames with nothing left to take leave at once, so an answer is complete exactly when the stack is empty; free text
 * due next is entered at once (it may be empty: a marker ends it), so the mask sees it as the state's top. */
static void settle(const k3c_cgrammar *g, cstate *s) {
    while (s->n > 0) {
        frame *f = &s->f[s->n - 1];
        const cnode *n = &g->nodes[f->node];
        if (n->kind != N_SEQ) break;
        if (f->i < n->n) {
            if (g->nodes[n->kids[f->i]].kind == N_TEXT) push(s, n->kids[f->i++]);
            break;
        }
        s->n--;
    }
}

void k3c_cstate_close(const k3c_cgrammar *g, cstate *s) {
    s->n--;
    settle(g, s);
}

void k3c_cstate_init(const k3c_cgrammar *g, cstate *s) {
    s->n = 0;
    push(s, g->root);
    settle(g, s);
}

int k3c_cstep(const k3c_cgrammar *g, cstate *s, int sym) {
    if (!json_byte(g, s, sym)) return 0;
    settle(g, s);
    return 1;
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
    case N_ANYOBJ: { /* by phase: "{}", `"":0}` after a comma, -, "}", `:0}`, "0}", the space first, " 0}" */
        const int64_t sp = g->spaced, c[8] = {2, 5 + sp, 0, 1, 3 + sp, 2, 6 + sp, 3};
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
    case N_LIT: return n->tc[f->pos];
    case N_SEQ:
        best = 0;
        for (int k = f->i; k < n->n; k++) best += g->nodes[n->kids[k]].cost;
        return best;
    case N_TEXT: return f->a;
    case N_CHOICE:
        if (f->phase == 0) return n->cost;
        for (int k = f->i; k < f->a; k++) {
            int64_t c = n->tcs[k][f->pos] + g->nodes[n->kids[k]].cost;
            if (c < best) best = c;
        }
        return best;
    case N_OPT: return 0;
    }
    return 0;
}

int64_t k3c_cframe_cost(const k3c_cgrammar *g, const frame *f) { return frame_cost(g, f); }

int64_t k3c_cstate_cost(const k3c_cgrammar *g, const cstate *s) {
    int64_t c = 0;
    for (int k = 0; k < s->n; k++) c += frame_cost(g, &s->f[k]);
    return c;
}

