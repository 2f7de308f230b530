/* cmd_vision.c — `k3c vision encode`: run a checkpoint's vision tower and projector on packed pixels and write the
 * merged tokens and image embeddings. Spec: docs/VISION.md "Command". */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

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
           "<|media_end|>) is printed with its size.\n");
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
    return cli_usage_error("vision", "unknown subcommand '%s' (expected encode)", argv[1]);
}
