/* layout.c — the run config's "parallel" block checked against the world size and the model before a parallel run
 * starts: clear errors for impossible layouts.
 * Spec: docs/PARALLEL.md "Launch". */
#include "parallel/dp.h"
#include "parallel/tp.h"

#include "base/check.h"

#include "model/config.h"

int k3c_parallel_resolve(const k3c_parallel *p, const k3c_config *cfg, int world, const char *file, k3c_parallel *out,
                         k3c_err *err) {
    int given = p->dp || p->ep || p->tp || p->pp || p->cp;
    *out = given ? *p : (k3c_parallel){world, 1, 1, 1, 1, 0};
    if (out->micro_batches < 1) out->micro_batches = out->pp;
    const int64_t d[5] = {out->dp, out->ep, out->tp, out->pp, out->cp};
    int64_t prod = 1;
    for (int i = 0; i < 5; i++) {
        if (d[i] < 1) return k3c_errf(err, K3C_ECONFIG, "%s: parallel: every degree must be at least 1", file);
        prod *= d[i];
    }
    if (prod != world)
        return k3c_errf(err, K3C_ECONFIG,
                        "%s: parallel: dp×ep×tp×pp×cp = %lld×%lld×%lld×%lld×%lld = %lld ranks, but the run has %d "
                        "(mpirun -np %lld)",
                        file, (long long)out->dp, (long long)out->ep, (long long)out->tp, (long long)out->pp,
                        (long long)out->cp, (long long)prod, world, (long long)prod);
    if (out->ep > 1 && (cfg->num_experts < 1 || cfg->num_experts % out->ep))
        return k3c_errf(err, K3C_ECONFIG, "%s: parallel.ep = %lld does not divide the model's %lld routed experts",
                        file, (long long)out->ep, (long long)cfg->num_experts);
    CHECK_RC(k3c_tp_check(cfg, out->tp, file, err)); /* vocabulary and intermediate widths */
    if (out->pp > cfg->num_layers) /* stages of L / pp layers, the first L mod pp one more (k3c_pp_layers) */
        return k3c_errf(err, K3C_ECONFIG, "%s: parallel.pp = %lld is more stages than the model's %lld layers", file,
                        (long long)out->pp, (long long)cfg->num_layers);
    return K3C_OK;
}
