/* fuzz_run_config.c — libFuzzer target for the training run config reader (k3c_run_config_load, include/k3c.h): the
 * buffer is written to run.json in a scratch directory and loaded. */
#include "base/base.h"

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    k3c_run_config rc;
    k3c_err err = {0};
    (void)k3c_run_config_load(fuzz_file("run.json", data, n), &rc, &err);
    return 0;
}
