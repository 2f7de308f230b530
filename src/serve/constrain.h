/* constrain.h — constrained decoding: a JSON-schema pushdown automaton over bytes and chat markers, the chat answers
 * built on it (response_format, tool_choice), and the token mask it puts on the engine's logits (k3c_constraint,
 * k3c/serve.h). docs/SERVING.md "Constrained decoding". */
#ifndef K3C_SERVE_CONSTRAIN_H
#define K3C_SERVE_CONSTRAIN_H

#include "base/json.h"
#include "k3c/serve.h"
#include "tok/xtml.h"

typedef struct k3c_cgrammar k3c_cgrammar;
/* The vocabulary's byte strings as a trie, walked with the automaton by the mask; built once per tokenizer, read-only
 * after, shared by every grammar over it (it must outlive them). */
typedef struct k3c_vtrie k3c_vtrie;

int k3c_vtrie_new(const k3c_tok *tok, int64_t n_vocab, k3c_vtrie **out, k3c_err *err);
void k3c_vtrie_free(k3c_vtrie *t);

/* Compiles schema (NULL: any JSON object, OpenAI's json_object) into an answer grammar over tok's vocabulary:
 * prefix markup, the JSON value, suffix markup (each a string whose chat markers are spelled as in the vocabulary's
 * special tokens). spaced: JSON separators ", " and ": " (Python's json.dumps), else compact. An unsupported keyword is
 * K3C_EUNSUPPORTED with *path (size npath) naming where, e.g. "/properties/a/pattern". trie may be NULL. */
int k3c_cgrammar_new(const k3c_tok *tok, const k3c_vtrie *trie, const k3c_json *schema, const char *prefix,
                     const char *suffix, int spaced, k3c_cgrammar **out, char *path, size_t npath, k3c_err *err);

/* What a chat answer must be. */
typedef enum { K3C_CTOOLS_ANY = 0, K3C_CTOOLS_NONE, K3C_CTOOLS_REQUIRED, K3C_CTOOLS_NAMED } k3c_ctools;
typedef struct {
    k3c_chat_format format;
    int thinking;          /* the generation prompt opened the think channel */
    int json;              /* response_format json_object / json_schema */
    const k3c_json *schema; /* json_schema's schema (NULL: any object) */
    k3c_ctools tools_mode;
    const char *tool_name;  /* K3C_CTOOLS_NAMED */
    const k3c_json *tools;  /* the request's tools (OpenAI function objects) */
    int one_call;           /* parallel_tool_calls false */
} k3c_cchat;

/* The grammar of a chat answer (XTML: think text first when thinking, then a JSON response, a plain response or the
 * tools channel's calls; K2: the JSON response). *out stays NULL when spec asks for nothing. A tool's parameters
 * outside the subset fall back to any object; a response schema outside it is K3C_EUNSUPPORTED with *path. */
int k3c_cgrammar_chat(const k3c_tok *tok, const k3c_vtrie *trie, const k3c_cchat *spec, k3c_cgrammar **out,
                      char *path, size_t npath, k3c_err *err);
/* A grammar is freed when its last holder lets go: k3c_cgrammar_ref adds a holder (e.g. one more constraint that owns
 * it), k3c_cgrammar_free drops one. */
void k3c_cgrammar_ref(k3c_cgrammar *g);
void k3c_cgrammar_free(k3c_cgrammar *g);
/* Tokens (bytes or markers, one each) the shortest complete answer takes: a budget below it cannot be met. */
int64_t k3c_cgrammar_min_tokens(const k3c_cgrammar *g);

/* A fresh automaton at the start of the answer (the grammar must outlive it); release() frees it. With own, the
 * constraint takes over one reference to the grammar and drops it on release (also when this call fails). */
int k3c_constraint_new(const k3c_cgrammar *g, int own, k3c_constraint **out, k3c_err *err);

/* Feeds raw bytes (no markers) / one token id: 1 accepted, 0 refused (state unchanged). For tests. */
int k3c_constraint_feed(k3c_constraint *c, const char *s, size_t n);
/* 1 when the answer is complete (the last marker taken). */
int k3c_constraint_done(const k3c_constraint *c);
/* Tokens the shortest completion from the current state takes (the budget the mask keeps: with left above it, some
 * id is allowed). */
int64_t k3c_constraint_cost(const k3c_constraint *c);
/* The mask computed by trying every id from the state, as mask() must equal: for tests and the benchmark. */
int k3c_constraint_mask_exact(k3c_constraint *c, float *logits, int64_t V, int64_t left);

#endif
