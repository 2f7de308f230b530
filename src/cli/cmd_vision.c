/* cmd_vision.c — `k3c vision encode`: run a checkpoint's vision tower and projector on packed pixels and write the
 * merged tokens and image embeddings. Spec: docs/VISION.md "Command". */
#include "cli.h"

#include <string.h>

static void usage(void) {
    printf("usage: k3c vision encode --model DIR --input FILE.safetensors --out OUT.safetensors\n"
           "                         [--pixels pixel_values] [--grid grid_thws]\n"
           "Runs the vision tower and projector of DIR (config.json vision_config + its vision_tower.* and\n"
           "mm_projector.* tensors) in float32 on the packed patches --pixels [L, 3, 14, 14] (any float dtype) with\n"
           "--grid [n, 3] (t, h, w patches per image or clip, I64 or I32) of FILE, and writes OUT (atomically) with\n"
           "`merged` [N, 4·D] (the 2x2 merge, frames averaged) and `image_embeds` [N, text hidden], float32.\n");
}

static int encode(int argc, char **argv) {
    const char *dir = cli_opt(argc, argv, "--model"), *in = cli_opt(argc, argv, "--input");
    const char *out = cli_opt(argc, argv, "--out"), *px = cli_opt(argc, argv, "--pixels");
    const char *grid = cli_opt(argc, argv, "--grid");
    if (!dir || !in || !out) return cli_usage_error("vision encode", "--model, --input and --out are required");
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
    return cli_usage_error("vision", "unknown subcommand '%s' (expected encode)", argv[1]);
}
