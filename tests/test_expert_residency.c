/* test_expert_residency.c — a model that holds only some routed experts (k3c_model_create_experts, expert
 * parallelism's residency; docs/PARALLEL.md "Expert parallelism") loads its part of a whole checkpoint and refuses one
 * that lacks a held expert, naming the tensor. One process; the MPI tests run the residency inside training. */
#include "test.h"

#include "model/model.h"

#include <sys/stat.h>

static int load_dir(k3c_model *m, const char *dir, k3c_err *err) {
    k3c_checkpoint *ck = NULL;
    int rc = k3c_ckpt_open(dir, &ck, err);
    if (!rc) rc = k3c_model_load_f32(m, ck, err);
    if (ck) k3c_ckpt_close(ck);
    return rc;
}

static int save_dir(const k3c_model *m, const char *dir, k3c_err *err) {
    char p[4300];
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    return k3c_model_save_f32(m, p, err);
}

int main(void) {
    k3c_err err = {0};
    k3c_config cfg;
    CHECK_OK(k3c_config_load("configs/k3_test_tiny.json", &cfg, &err), &err);
    const int64_t E = cfg.num_experts, half = E / 2;
    const char *tmp = test_tmpdir("expert_residency");
    char whole_dir[4200], low_dir[4200]; /* test_tmpdir gives at most 4,095 bytes */
    snprintf(whole_dir, sizeof whole_dir, "%s/whole", tmp);
    snprintf(low_dir, sizeof low_dir, "%s/low", tmp);

    k3c_model whole, low, high, high_init;
    CHECK_OK(k3c_model_create_f32(&cfg, 0, &whole, &err), &err);
    k3c_model_init_f32(&whole, 7, 0.1);
    CHECK_OK(save_dir(&whole, whole_dir, &err), &err);

    /* experts [E/2, E) from the whole checkpoint: the same values as the residency's own init (which equals the
     * whole init's part, test_dist_dp), everything else too */
    CHECK_OK(k3c_model_create_experts_f32(&cfg, 0, half, E - half, &high, &err), &err);
    CHECK_OK(k3c_model_create_experts_f32(&cfg, 0, half, E - half, &high_init, &err), &err);
    k3c_model_init_f32(&high_init, 7, 0.1);
    CHECK(high.table.total < whole.table.total, "residency holds %zu of %zu parameters", high.table.total,
          whole.table.total);
    CHECK_OK(load_dir(&high, whole_dir, &err), &err);
    CHECK(memcmp(high.w, high_init.w, sizeof(float) * high.table.total) == 0,
          "experts [%lld, %lld) loaded from the whole checkpoint differ from their init", (long long)half, (long long)E);

    /* a checkpoint of experts [0, E/2) only lacks what `high` holds: a clear error naming an expert tensor */
    CHECK_OK(k3c_model_create_experts_f32(&cfg, 0, 0, half, &low, &err), &err);
    k3c_model_init_f32(&low, 7, 0.1);
    CHECK_OK(save_dir(&low, low_dir, &err), &err);
    k3c_err e2 = {0};
    const int rc = load_dir(&high, low_dir, &e2);
    CHECK(rc == K3C_EFORMAT && strstr(e2.msg, "missing tensor") && strstr(e2.msg, "experts."),
          "loading experts [%lld, %lld) from a checkpoint of [0, %lld): rc %d, '%s'", (long long)half, (long long)E,
          (long long)half, rc, e2.msg);
    printf("a held expert missing from the checkpoint: %s\n", e2.msg);
    /* and the low half loads its own checkpoint back */
    k3c_model low2;
    CHECK_OK(k3c_model_create_experts_f32(&cfg, 0, 0, half, &low2, &err), &err);
    CHECK_OK(load_dir(&low2, low_dir, &err), &err);
    CHECK(memcmp(low2.w, low.w, sizeof(float) * low.table.total) == 0, "experts [0, %lld) round trip", (long long)half);

    k3c_model *all[] = {&whole, &low, &low2, &high, &high_init};
    for (int i = 0; i < 5; i++) k3c_model_free_f32(all[i]);
    return test_summary();
}
