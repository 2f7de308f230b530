/* fuzz_jsonl.c — libFuzzer target for the JSONL dataset path of `k3c data prepare` (k3c_data_prepare, src/train/data.h):
 * the buffer is one .jsonl input file, tokenised with a byte-level vocabulary (the 256 bytes + <|endoftext|>) into
 * shards in a scratch directory. */
#include "tok/tok.h"
#include "train/data.h"

#include "fuzz.h"

static const char *vocab_path(void) {
    static const char *path;
    if (path) return path;
    char text[256 * 12], *o = text;
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        o += k3c_base64_encode(&c, 1, o);
        o += sprintf(o, " %d\n", b);
    }
    path = fuzz_file("vocab.tiktoken", text, (size_t)(o - text));
    fuzz_file("vocab.tiktoken.specials.json", "{\"<|endoftext|>\": 256}", 22);
    return path;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    const char *vocab = vocab_path();
    const char *in = fuzz_file("in.jsonl", data, n);
    char out[300];
    snprintf(out, sizeof out, "%s/out", fuzz_dir());
    k3c_prepare_opts o = {.vocab_path = vocab,
                          .pattern = n && data[0] & 1 ? K3C_TOK_PATTERN_CL100K : K3C_TOK_PATTERN_KIMI,
                          .inputs = &in,
                          .n_inputs = 1,
                          .out_dir = out,
                          .val_fraction = 0.25,
                          .shard_tokens = 4096,
                          .seed = 1};
    k3c_prepare_result res;
    k3c_err err = {0};
    (void)k3c_data_prepare(&o, &res, &err);
    return 0;
}
