/* fuzz_xtml_render.c — libFuzzer target for the chat prompt renderer (k3c_chat_render, src/tok/xtml.h): the input is a
 * JSON object like a line of golden/xtml/examples.jsonl ({"messages", "tools", "options"}) or a bare messages array;
 * a rendered prompt's segments must tile its text. */
#include "tok/xtml.h"

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    k3c_json *v = NULL;
    k3c_err err = {0};
    if (k3c_json_parse((const char *)data, n, "fuzz", &v, &err) != K3C_OK) return 0;
    const k3c_json *msgs = v, *tools = NULL, *opts = NULL;
    if (v->type == K3C_JSON_OBJECT) {
        msgs = k3c_json_get(v, "messages");
        tools = k3c_json_get(v, "tools");
        opts = k3c_json_get(v, "options");
    }
    k3c_chat_prompt p = {0};
    if (msgs && k3c_chat_render(msgs, tools, opts, &p, &err) == K3C_OK) {
        size_t off = 0;
        for (size_t i = 0; i < p.nseg; i++) {
            if (p.segs[i].off != off) abort();
            off += p.segs[i].len;
        }
        if (off != p.len || strlen(p.text) > p.len) abort();
        k3c_chat_prompt_free(&p);
    }
    k3c_json_free(v);
    return 0;
}
