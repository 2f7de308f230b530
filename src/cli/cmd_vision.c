/* cmd_vision.c — `k3c vision encode`: run a checkpoint's vision tower and projector on packed pixels and write the
 * merged tokens and image embeddings; `k3c vision train`: train the text model and the tower together on image-text
 * JSONL. Spec: docs/VISION.md "Command", "Training data". */
#include "cli.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(void) {
    printf("usage: k3c vision encode --model DIR --input FILE.safetensors --out OUT.safetensors\n"
           "                         [--pixels pixel_values] [--grid grid_thws]\n"
           "       k3c vision encode --model DIR --image FILE [--image FILE ...] --out OUT.safetensors\n"
           "                         [--max-patches 16384]\n"
           "Runs the vision tower and projector of DIR (config.json vision_config + its vision_tower.* and\n"
           "mm_projector.* tensors) in float32 on the packed patches --pixels [L, 3, 14, 14] (any float dtype) with\n"
           "--grid [n, 3] (t, h, w patches per image or clip, I64 or I32) of FILE, and writes OUT (atomically) with\n"
           "`merged` [N, 4·D] (the 2x2 merge, frames averaged) and `image_embeds` [N, text hidden], float32.\n"
           "With --image, PNG / JPEG files are preprocessed as the release does (resize within --max-patches patches,\n"
           "pad to multiples of 28, normalise, patchify), packed in order, and OUT also gets pixel_values and\n"
           "grid_thws; each image's prompt (<|media_begin|>image WxH<|media_content|> + N <|media_pad|> +\n"
           "<|media_end|>) is printed with its size.\n\n"
           "       k3c vision train --model DIR --data TRAIN.jsonl [--eval TEST.jsonl] [--steps 300] [--batch 16]\n"
           "                        [--lr 3e-3] [--tower-lr 1e-3] [--weight-decay 0] [--grad-clip 1] [--seed 1]\n"
           "                        [--max-tokens 512] [--eval-max 0] [--threads N] [--log-every 10]\n"
           "                        [--device cpu|cuda] [--gemm fp32|tf32|bf16] [--kernels bf16|fp16|fp32]\n"
           "Trains the text model and the vision tower of DIR together (config.json with a vision_config, its\n"
           "tokenizer; its weights when present, else a seeded init) on JSONL lines {\"text\": \"<image>...\",\n"
           "\"images\": [\"a.png\"], \"answer\": \"...\"} (docs/VISION.md \"Training data\"); bad lines are reported\n"
           "and skipped. With --eval, prints the held-out accuracy (each answer scored against every distinct answer)\n"
           "and chance. Writes the weights back into DIR. With --device cuda (a `make cuda` build) the model, the tower\n"
           "and every step (forward, backward, clipping, the optimizer) run on the GPU; --gemm and --kernels as for\n"
           "k3c train.\n");
}

/* CPU seconds of this process, every thread (what a shared machine charges). */
static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int train(int argc, char **argv) {
    k3c_vtrain_opts o = {.dir = cli_opt(argc, argv, "--model"),
                         .data = cli_opt(argc, argv, "--data"),
                         .eval = cli_opt(argc, argv, "--eval"),
                         .log = stdout};
    long long steps, batch, maxt, emax, seed, every, thr;
    if (!o.dir || !o.data) return cli_usage_error("vision train", "--model and --data are required");
    if (!cli_opt_int(argc, argv, "--steps", 300, &steps) || !cli_opt_int(argc, argv, "--batch", 16, &batch) ||
        !cli_opt_int(argc, argv, "--max-tokens", 512, &maxt) || !cli_opt_int(argc, argv, "--eval-max", 0, &emax) ||
        !cli_opt_int(argc, argv, "--seed", 1, &seed) || !cli_opt_int(argc, argv, "--log-every", 10, &every) ||
        !cli_opt_int(argc, argv, "--threads", 0, &thr) || !cli_opt_double(argc, argv, "--lr", 3e-3, &o.lr) ||
        !cli_opt_double(argc, argv, "--tower-lr", 1e-3, &o.tower_lr) ||
        !cli_opt_double(argc, argv, "--weight-decay", 0, &o.weight_decay) ||
        !cli_opt_double(argc, argv, "--grad-clip", 1, &o.grad_clip))
        return 2;
    const cli_device_opts dopt = cli_device_opts_get(argc, argv);
    if (cli_device_check("vision train", &dopt)) return 2;
    o.steps = steps, o.batch = batch, o.max_tokens = maxt, o.eval_max = emax, o.seed = (uint64_t)seed;
    o.log_every = (int)every;
    if (thr > 0) k3c_set_num_threads((int)thr);
    k3c_vtrain_result r;
    k3c_err err = {0};
    cli_device dev;
    if (cli_device_open(&dopt, &dev, &err)) return cli_fail("vision train", &err);
    o.backend = dev.backend;
    const double c0 = cpu_seconds();
    const int rc = k3c_vision_train(&o, &r, &err);
    cli_device_release(&dev); /* everything on it was freed by k3c_vision_train */
    if (rc) return cli_fail("vision train", &err);
    printf("trained %lld steps on %lld samples (%lld bad lines skipped): loss %.4f -> %.4f, %lld tokens, %.1f s\n",
           (long long)o.steps, (long long)r.n_train, (long long)r.bad_train, r.first_loss, r.last_loss,
           (long long)r.tokens, r.train_s);
    if (o.eval)
        printf("held-out accuracy %.4f on %lld samples (chance %.4f, %lld bad lines skipped), %.1f s\n", r.accuracy,
               (long long)r.n_eval, r.chance, (long long)r.bad_eval, r.eval_s);
    printf("cpu time %.1f s; wrote %s\n", cpu_seconds() - c0, o.dir);
    return 0;
}

/* --image FILE, any number of times. */
static int encode_images(int argc, char **argv, const char *dir, const char *out) {
    const char **paths = calloc((size_t)argc, sizeof *paths);
    int n = 0;
    for (int i = 1; paths && i + 1 < argc; i++)
        if (!strcmp(argv[i], "--image")) paths[n++] = argv[++i];
    long long maxp;
    if (!cli_opt_int(argc, argv, "--max-patches", 16384, &maxp) || maxp < 1) {
        free(paths);
        return cli_usage_error("vision encode", "--max-patches must be a positive integer");
    }
    k3c_media_cfg mc = k3c_media_cfg_default();
    mc.in_patch_limit = maxp;
    k3c_resize_plan *plans = calloc((size_t)(n ? n : 1), sizeof *plans);
    k3c_image_size *sizes = calloc((size_t)(n ? n : 1), sizeof *sizes);
    k3c_err err = {0};
    int rc = !paths || !plans || !sizes ? k3c_errf(&err, K3C_ENOMEM, "out of memory")
                                        : k3c_vision_encode_images(dir, paths, n, &mc, out, plans, sizes, &err);
    for (int i = 0; !rc && i < n; i++) {
        printf("%s: %dx%d -> %dx%d + pad %d,%d, %lld tokens: <|media_begin|>image %dx%d<|media_content|>"
               "<|media_pad|> x %lld<|media_end|>\n",
               paths[i], sizes[i].w, sizes[i].h, plans[i].new_w, plans[i].new_h, plans[i].pad_w, plans[i].pad_h,
               (long long)plans[i].tokens, sizes[i].w, sizes[i].h, (long long)plans[i].tokens);
    }
    if (!rc) printf("wrote %s\n", out);
    free(paths);
    free(plans);
    free(sizes);
    return rc ? cli_fail("vision encode", &err) : 0;
}

static int encode(int argc, char **argv) {
    const char *dir = cli_opt(argc, argv, "--model"), *in = cli_opt(argc, argv, "--input");
    const char *out = cli_opt(argc, argv, "--out"), *px = cli_opt(argc, argv, "--pixels");
    const char *grid = cli_opt(argc, argv, "--grid");
    if (dir && out && !in && cli_opt(argc, argv, "--image")) return encode_images(argc, argv, dir, out);
    if (!dir || !in || !out)
        return cli_usage_error("vision encode", "--model, --out and --input (or --image) are required");
    k3c_err err = {0};
    int64_t N = 0;
    if (k3c_vision_encode_file(dir, in, px ? px : "pixel_values", grid ? grid : "grid_thws", out, &N, &err))
        return cli_fail("vision encode", &err);
    printf("wrote %s: %lld merged tokens (merged, image_embeds)\n", out, (long long)N);
    return 0;
}

int cmd_vision(int argc, char **argv) {
    if (argc < 2 || cli_wants_help(argc, argv)) {
        usage();
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "encode") == 0) return encode(argc - 1, argv + 1);
    if (strcmp(argv[1], "train") == 0) return train(argc - 1, argv + 1);
    return cli_usage_error("vision", "unknown subcommand '%s' (expected encode or train)", argv[1]);
}
