/* serve_corpus.h — the text the serving fixture's tokenizer is trained on (words, markup, JSON, multi-byte characters,
 * so its vocabulary has merges of each): shared by tests/serve_fixture.h and bench/bench_constrain.c. */
#ifndef K3C_SERVE_CORPUS_H
#define K3C_SERVE_CORPUS_H

#include "base/json.h"

#include <string.h>

#define SERVE_RANKS 420

/* The corpus in *s (initialised here; the caller frees it). */
static inline void serve_corpus_text(k3c_sbuf *s) {
    static const char *const parts[] = {"Hello world! The weather in Paris is 18°C and clear. ",
                                        "message role=\"user\" ",
                                        "think response tools call ",
                                        "argument key=\"city\" type=\"string\" ",
                                        "{\"city\": \"Paris\", \"units\": \"c\"} ",
                                        "Über café naïve 東京 ",
                                        "get_weather returns the current weather for a city. ",
                                        "You are a helpful assistant. ",
                                        "tool=\"get_weather\" "};
    const size_t np = sizeof parts / sizeof *parts;
    k3c_sbuf_init(s);
    for (int r = 0; r < 60; r++)
        for (size_t i = 0; i < np; i++) {
            const char *p = parts[(i * 7 + (size_t)r) % np];
            k3c_sbuf_append(s, p, strlen(p));
        }
}

#endif
