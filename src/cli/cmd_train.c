/* cmd_train.c — `k3c train --config RUN.json`: runs (or resumes) a staged pre-training run with a progress bar, metrics
 * JSONL, periodic validation and atomic checkpoints (k3c_train_run in k3c.h), then plots the metrics to PNG (plot.c). */
#include "cli.h"

#include "k3c/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int cmd_train(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        printf("usage: k3c train --config RUN.json [--resume] [--max-steps N] [--quiet] [--log]\n"
               "                 [--device cpu|cuda] [--gemm fp32|tf32|bf16] [--kernels bf16|fp16|fp32]\n\n"
               "Trains the model described by the run config (see configs/demo_run.json): stages of context length,\n"
               "tokens per step, steps, learning-rate schedule and data mixture; Per-Head Muon + AdamW; QK-Clip;\n"
               "quantile balancing of the MoE routers (or a baseline: \"balancing\": \"bias\", \"aux\", \"none\";\n"
               "docs/TRAINING.md 1.6). Writes OUT/metrics.jsonl, OUT/metrics.png and checkpoints\n"
               "OUT/step_N (Hugging Face layout + optimizer + trainer state; OUT/latest names the newest).\n"
               "  --resume        continue bit-exactly from OUT/latest\n"
               "  --max-steps N   stop after N steps in total (the schedule still follows the config)\n"
               "  --quiet         no progress bar;  --log  print one line per step to stdout\n"
               "  --device cuda   the whole step on the GPU: forward, backward, clipping, the optimizer, quantile\n"
               "                  balancing and QK-Clip (build/cuda/k3c from `make cuda`; needs kda_chunk 64);\n"
               "                  checkpoints are downloaded from device memory\n"
               "  --gemm MODE     the GPU's GEMMs (linears, MLPs, experts): fp32 (default, the checking mode), tf32,\n"
               "                  or bf16 tensor cores on operands rounded on the fly (fp32 masters and sums)\n"
               "  --kernels MODE  the GPU's KDA and attention: bf16 (default, tensor cores), fp16, or fp32 (the\n"
               "                  checking mode: the KDA recurrence and a warp per attention row; with --gemm fp32\n"
               "                  the whole step is fp32, as on the CPU)\n\n"
               "Parallel: `mpirun -np N k3c train --config RUN.json` trains on N ranks; the run config's\n"
               "\"parallel\": {\"dp\": N} block (absent: dp = N) is checked against N and the model. Every rank\n"
               "loads the same global batch and trains on its share; rank 0 prints and writes metrics and\n"
               "checkpoints, which any layout can resume (docs/PARALLEL.md). With --device cuda each rank takes\n"
               "the GPU of its rank on the node and the ranks talk through NCCL (build/nccl/k3c of `make nccl`).\n"
               "\"force\": true in the block runs the parallel step even on one rank (a test of its code paths\n"
               "on one process or one GPU)\n");
        return 0;
    }
    const char *path = cli_opt(argc, argv, "--config");
    long long max_steps;
    if (!path) return cli_usage_error("train", "--config is required");
    if (!cli_opt_int(argc, argv, "--max-steps", 0, &max_steps) || max_steps < 0) return 2;
    const cli_device_opts dopt = cli_device_opts_get(argc, argv);
    if (cli_device_check("train", &dopt)) return 2;
    k3c_err err = {0};
    k3c_run_config rc;
    if (k3c_run_config_load(path, &rc, &err)) return cli_fail("train", &err);
    cli_device dev;
    if (cli_device_open(&dopt, &dev, &err)) return cli_fail("train", &err);
    k3c_comm *world = NULL, *comm = NULL; /* MPI when started by mpirun, else this process alone */
    if (k3c_comm_world(&world, &err)) {
        cli_device_release(&dev);
        return cli_fail("train", &err);
    }
    const char *np = getenv("OMPI_COMM_WORLD_SIZE");
    if (!k3c_comm_mpi_available() && np && atoi(np) > 1) { /* every rank would train alone, into one out_dir */
        k3c_errf(&err, K3C_EUNSUPPORTED,
                 "started by mpirun with %s ranks, but this k3c was built without MPI (on GPUs: build/nccl/k3c of "
                 "`make nccl`)",
                 np);
        cli_device_release(&dev);
        k3c_comm_free(world);
        return cli_fail("train", &err);
    }
    const int parallel = k3c_comm_size(world) > 1 || rc.parallel_force;
    /* the communicator follows the backend: the world's (host memory) on the CPU, NCCL over it on a GPU (one GPU per
       rank: the one cli_device_open chose), alone the one-rank NCCL communicator */
    if (parallel && dev.backend &&
        k3c_comm_nccl(k3c_comm_size(world) > 1 ? world : NULL, NULL, k3c_comm_rank(world), k3c_comm_size(world),
                      cli_local_rank(), &comm, &err)) {
        int code = cli_fail("train", &err);
        if (k3c_comm_size(world) > 1) k3c_comm_mpi_abort(code);
        cli_device_release(&dev);
        k3c_comm_free(world);
        return code;
    }
    int quiet = k3c_comm_rank(world) != 0; /* rank 0 speaks for the run */
    k3c_train_opts o = {cli_flag(argc, argv, "--resume"),
                        max_steps,
                        cli_flag(argc, argv, "--quiet") || quiet ? NULL : stderr,
                        cli_flag(argc, argv, "--log") && !quiet ? stdout : NULL,
                        dev.backend,
                        parallel ? (comm ? comm : world) : NULL};
    k3c_train_result r;
    int failed = k3c_train_run(&rc, &o, &r, &err);
    k3c_comm_free(comm); /* before the device it runs on */
    cli_device_release(&dev);
    if (failed) {
        int code = cli_fail("train", &err);
        if (k3c_comm_size(world) > 1) k3c_comm_mpi_abort(code); /* the other ranks may be waiting for this one */
        k3c_comm_free(world);
        return code;
    }
    k3c_comm_free(world);
    k3c_comm_mpi_finalize();
    if (quiet) return 0;
    char jsonl[4200], png[4200];
    snprintf(jsonl, sizeof jsonl, "%s/metrics.jsonl", rc.out_dir);
    snprintf(png, sizeof png, "%s/metrics.png", rc.out_dir);
    k3c_err perr = {0};
    if (cli_plot_metrics(jsonl, png, &perr) && o.log) fprintf(o.log, "note: %s\n", perr.msg);
    printf("trained %lld steps in %.1f s: loss %.4f, validation loss %.4f, %.0f tokens/s, max/mean expert load %.2f\n",
           (long long)r.steps, r.wall_s, r.last_loss, r.last_val_loss, r.tokens_per_s, r.max_load_ratio);
    printf("summary: validation loss %.4f nats/token vs unigram entropy %.4f nats/token of the corpus (same tokenizer):"
           " %.3f nats below\n",
           r.last_val_loss, r.unigram_entropy, r.unigram_entropy - r.last_val_loss);
    printf("checkpoints in %s (latest: %s/latest)\n", rc.out_dir, rc.out_dir);
    return 0;
}
