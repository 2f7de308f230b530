/* fuzz_safetensors.c — libFuzzer target for the safetensors reader (src/base/safetensors.c): the buffer is written to a
 * file and opened with k3c_st_open; every tensor a validated file lists is looked up and its bytes are read. */
#include "k3c.h"

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    k3c_safetensors *st = NULL;
    k3c_err err = {0};
    if (k3c_st_open(fuzz_file("in.safetensors", data, n), &st, &err) != K3C_OK) return 0;
    volatile unsigned sum = 0;
    for (int i = 0; i < k3c_st_count(st); i++) {
        const k3c_st_tensor *t = k3c_st_at(st, i);
        if (k3c_st_find(st, t->name) == NULL) abort();
        const unsigned char *p = t->data;
        for (size_t k = 0; k < t->nbytes; k++) sum += p[k];
    }
    (void)k3c_st_metadata(st, "format");
    k3c_st_close(st);
    return 0;
}
