/* constrain.h — constrained decoding: a JSON-schema pushdown automaton over bytes and chat markers, and the token mask
 * it puts on the engine's logits (k3c_constraint, k3c/serve.h). docs/SERVING.md "Constrained decoding". */
#ifndef K3C_SERVE_CONSTRAIN_H
#define K3C_SERVE_CONSTRAIN_H

#include "base/json.h"
#include "k3c/serve.h"

typedef struct k3c_cgrammar k3c_cgrammar;

/* Compiles schema (NULL: any JSON object, OpenAI's json_object) into an answer grammar over tok's vocabulary:
 * prefix markup, the JSON value, suffix markup (each a string whose chat markers are spelled as in the vocabulary's
 * special tokens). spaced: JSON separators ", " and ": " (Python's json.dumps), else compact. An unsupported keyword is
 * K3C_EUNSUPPORTED with *path (size npath) naming where, e.g. "/properties/a/pattern". */
int k3c_cgrammar_new(const k3c_tok *tok, const k3c_json *schema, const char *prefix, const char *suffix, int spaced,
                     k3c_cgrammar **out, char *path, size_t npath, k3c_err *err);
void k3c_cgrammar_free(k3c_cgrammar *g);
/* Tokens (bytes or markers, one each) the shortest complete answer takes: a budget below it cannot be met. */
int64_t k3c_cgrammar_min_tokens(const k3c_cgrammar *g);

/* A fresh automaton at the start of the answer (the grammar must outlive it); release() frees it. */
int k3c_constraint_new(const k3c_cgrammar *g, k3c_constraint **out, k3c_err *err);

/* Feeds raw bytes (no markers) / one token id: 1 accepted, 0 refused (state unchanged). For tests. */
int k3c_constraint_feed(k3c_constraint *c, const char *s, size_t n);
/* 1 when the answer is complete (the last marker taken). */
int k3c_constraint_done(const k3c_constraint *c);

#endif
