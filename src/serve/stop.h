/* stop.h — the text side of generation: an incremental detokeniser that never emits half a UTF-8 character and ends
 * generation on stop strings, holding back text that could still become one. */
#ifndef K3C_SERVE_STOP_H
#define K3C_SERVE_STOP_H

#include "base/json.h"

#define K3C_STOP_MAX 16 /* stop strings per request */

/* Receives emitted text: valid UTF-8 (bytes the tokens spelled that are not are replaced by U+FFFD), never a part of a
 * stop string, never the start of a character whose other bytes have not been generated yet. */
typedef void (*k3c_text_fn)(void *ctx, const char *text, size_t len);

enum {
    K3C_STOP_SPECIALS = 1, /* special tokens are spelled out (the chat parser needs its markers); else skipped */
};

typedef struct {
    const k3c_tok *tok;
    int flags;
    int nstop;
    char *stop[K3C_STOP_MAX];
    size_t stop_len[K3C_STOP_MAX];
    k3c_sbuf pending; /* decoded, not yet emitted */
    int stopped;      /* a stop string appeared: everything from it on is dropped */
    k3c_text_fn on_text;
    void *ctx;
} k3c_stopper;

/* Copies the stop strings (each non-empty, at most K3C_STOP_MAX). */
int k3c_stopper_init(k3c_stopper *s, const k3c_tok *tok, const char *const *stops, int nstop, int flags,
                     k3c_text_fn on_text, void *ctx, k3c_err *err);
/* Appends one generated id; returns 1 once a stop string has appeared (the text before it has been emitted; the caller
 * should end generation), 0 to go on, or a negative status (unknown id, out of memory). */
int k3c_stopper_feed(k3c_stopper *s, int32_t id, k3c_err *err);
/* End of generation: emits what was held back (a stop-string prefix that never completed, an unfinished character as
 * U+FFFD). */
void k3c_stopper_finish(k3c_stopper *s);
void k3c_stopper_free(k3c_stopper *s);

#endif
