/* stop.c — incremental detokenising with stop strings (stop.h): tokens append their bytes to a pending buffer; the
 * longest prefix that is whole characters and cannot be the start of a stop string is emitted. */
#include "serve/stop.h"

#include "tok/tok.h"

#include <stdlib.h>
#include <string.h>

int k3c_stopper_init(k3c_stopper *s, const k3c_tok *tok, const char *const *stops, int nstop, int flags,
                     k3c_text_fn on_text, void *ctx, k3c_err *err) {
    memset(s, 0, sizeof *s);
    s->tok = tok;
    s->flags = flags;
    s->on_text = on_text;
    s->ctx = ctx;
    k3c_sbuf_init(&s->pending);
    if (nstop < 0 || nstop > K3C_STOP_MAX)
        return k3c_errf(err, K3C_EINVAL, "stop: at most %d stop strings (got %d)", K3C_STOP_MAX, nstop);
    for (int i = 0; i < nstop; i++) {
        size_t n = strlen(stops[i]);
        if (n == 0) {
            k3c_stopper_free(s);
            return k3c_errf(err, K3C_EINVAL, "stop: stop string %d is empty", i);
        }
        if (!(s->stop[i] = strdup(stops[i]))) {
            k3c_stopper_free(s);
            return k3c_errf(err, K3C_ENOMEM, "stop: out of memory");
        }
        s->stop_len[i] = n;
        s->nstop = i + 1;
    }
    return 0;
}

void k3c_stopper_free(k3c_stopper *s) {
    for (int i = 0; i < s->nstop; i++) free(s->stop[i]);
    k3c_sbuf_free(&s->pending);
    memset(s, 0, sizeof *s);
}

/* Length of the character-complete prefix of p[0..n): a trailing lead byte still waiting for its continuation bytes
 * is cut off (at most 3 bytes). Invalid bytes count as complete: they will never become valid. */
static size_t complete_prefix(const unsigned char *p, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = p[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte: look further back for its lead */
        size_t need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 1;
        return need > back ? n - back : n;
    }
    return n;
}

/* Length of the longest suffix of p[0..n) that is a proper prefix of some stop string. */
static size_t stop_prefix_suffix(const k3c_stopper *s, const char *p, size_t n) {
    size_t best = 0;
    for (int i = 0; i < s->nstop; i++)
        for (size_t k = s->stop_len[i] - 1; k > best; k--)
            if (k <= n && memcmp(p + n - k, s->stop[i], k) == 0) {
                best = k;
                break;
            }
    return best;
}

static void emit(k3c_stopper *s, size_t n) {
    if (n == 0) return;
    const char *p = s->pending.buf;
    if (k3c_utf8_check(p, n) == n) {
        s->on_text(s->ctx, p, n);
    } else {
        char *fixed = NULL;
        size_t fl = 0;
        if (k3c_utf8_replace(p, n, &fixed, &fl, NULL, NULL) == 0) s->on_text(s->ctx, fixed, fl);
        free(fixed);
    }
    memmove(s->pending.buf, p + n, s->pending.len - n);
    s->pending.len -= n;
}

/* The earliest position of any stop string in pending, or -1. */
static long first_stop(const k3c_stopper *s) {
    long best = -1;
    const char *p = s->pending.buf;
    for (int i = 0; i < s->nstop; i++) {
        const char *hit = memmem(p, s->pending.len, s->stop[i], s->stop_len[i]);
        if (hit && (best < 0 || hit - p < best)) best = hit - p;
    }
    return best;
}

int k3c_stopper_feed(k3c_stopper *s, int32_t id, k3c_err *err) {
    if (s->stopped) return 1;
    if (!(s->flags & K3C_STOP_SPECIALS) && k3c_tok_is_special(s->tok, id)) return 0;
    const unsigned char *b;
    size_t nb;
    int rc = k3c_tok_token_bytes(s->tok, id, &b, &nb, err);
    if (rc) return rc;
    k3c_sbuf_append(&s->pending, (const char *)b, nb);
    if (!s->pending.ok) return k3c_errf(err, K3C_ENOMEM, "stop: out of memory");
    long at = first_stop(s);
    if (at >= 0) {
        emit(s, (size_t)at);
        s->pending.len = 0;
        s->stopped = 1;
        return 1;
    }
    size_t n = s->pending.len, keep = stop_prefix_suffix(s, s->pending.buf, n);
    size_t whole = complete_prefix((const unsigned char *)s->pending.buf, n);
    emit(s, whole < n - keep ? whole : n - keep);
    return 0;
}

void k3c_stopper_finish(k3c_stopper *s) {
    if (!s->stopped) emit(s, s->pending.len);
    s->pending.len = 0;
}
