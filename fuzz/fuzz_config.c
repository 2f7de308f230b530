/* fuzz_config.c — libFuzzer target for the model config reader (k3c_config_parse, include/k3c.h): arbitrary config.json
 * text; a config it accepts is written back (k3c_config_save) and must read back. */
#include "k3c.h"

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    k3c_config cfg, back;
    k3c_err err = {0};
    if (k3c_config_parse((const char *)data, n, "fuzz", &cfg, &err) != K3C_OK) return 0;
    char path[300];
    snprintf(path, sizeof path, "%s/config.json", fuzz_dir());
    if (k3c_config_save(&cfg, path, &err) == K3C_OK && k3c_config_load(path, &back, &err) != K3C_OK) {
        fprintf(stderr, "written config does not read back: %s\n", err.msg);
        abort();
    }
    return 0;
}
