/* cmd_post.c — post-training commands: `k3c sft --config RUN.json` (fine-tuning on JSONL trajectories, k3c_sft_run),
 * `k3c rl --config RUN.json` (RL with verifiable rewards in an environment, k3c_rl_run) and `k3c env` (environment
 * tasks and expert conversations as SFT data). */
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int cmd_sft(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        printf("usage: k3c sft --config SFT.json [--resume] [--max-steps N] [--quiet] [--log] [--device cpu|cuda] "
               "[--gemm fp32|tf32|bf16] [--kernels bf16|fp16|fp32]\n\n"
               "Fine-tunes the checkpoint `init` (a k3c step dir or a Hugging Face dir with config.json and\n"
               "safetensors) on `data`, a JSONL file of conversations {\"messages\", \"tools\"?, \"options\"?}\n"
               "rendered through XTML (\"format\": \"xtml\", default, or \"k2\"). The loss covers only what the model\n"
               "writes: assistant reasoning, content, tool-call markup and end markers. Malformed lines are reported\n"
               "(file:line: field: reason) and skipped. Trajectories are shuffled by `seed` and packed `seq_len`\n"
               "tokens per step with document resets. Keys: init, tokenizer, pattern, format, thinking, data,\n"
               "val_data, out_dir, seq_len, steps, lr, min_lr_ratio, warmup, schedule, optimizer {matrix,\n"
               "weight_decay, beta1, beta2, eps, grad_clip}, seed, kda_chunk, threads, log_every, eval_every,\n"
               "eval_batches, checkpoint_every, keep_checkpoints. Writes OUT/metrics.jsonl, OUT/metrics.png and\n"
               "OUT/step_N checkpoints (OUT/latest names the newest).\n"
               "  --resume        continue bit-exactly from OUT/latest\n"
               "  --max-steps N   stop after N steps in total\n"
               "  --quiet         no progress bar;  --log  one line per step (and the skipped lines) on stdout\n"
               "  --device cuda   run on the GPU (build/cuda/k3c);  --gemm fp32|tf32|bf16  its GEMM mode (fp32);\n"
               "                  --kernels bf16|fp16|fp32  its KDA and attention kernels (bf16; fp32: checking)\n");
        return 0;
    }
    const char *path = cli_opt(argc, argv, "--config");
    long long max_steps;
    if (!path) return cli_usage_error("sft", "--config is required");
    if (!cli_opt_int(argc, argv, "--max-steps", 0, &max_steps) || max_steps < 0) return 2;
    const cli_device_opts dopt = cli_device_opts_get(argc, argv);
    if (cli_device_check("sft", &dopt)) return 2;
    k3c_err err = {0};
    k3c_sft_config c;
    if (k3c_sft_config_load(path, &c, &err)) return cli_fail("sft", &err);
    cli_device dev;
    if (cli_device_open(&dopt, &dev, &err)) return cli_fail("sft", &err);
    k3c_train_opts o = {.resume = cli_flag(argc, argv, "--resume"),
                        .max_steps = max_steps,
                        .progress = cli_flag(argc, argv, "--quiet") ? NULL : stderr,
                        .log = cli_flag(argc, argv, "--log") ? stdout : NULL,
                        .backend = dev.backend};
    k3c_sft_result r;
    int failed = k3c_sft_run(&c, &o, &r, &err);
    cli_device_release(&dev);
    if (failed) return cli_fail("sft", &err);
    char jsonl[4200], png[4200];
    snprintf(jsonl, sizeof jsonl, "%s/metrics.jsonl", c.out_dir);
    snprintf(png, sizeof png, "%s/metrics.png", c.out_dir);
    k3c_err perr = {0};
    static const char *const keys[] = {"loss", "lr", "grad_norm", "val_loss"};
    if (cli_plot_panels(jsonl, png, keys, isfinite(r.last_val_loss) ? 4 : 3, &perr) && o.log)
        fprintf(o.log, "note: %s\n", perr.msg);
    printf("sft: %lld steps on %lld trajectories (%lld bad lines skipped) in %.1f s: loss %.4f -> %.4f, validation "
           "loss %.4f, %.0f tokens/s\n",
           (long long)r.steps, (long long)r.n_traj, (long long)r.bad_lines, r.wall_s, r.first_loss, r.last_loss,
           r.last_val_loss, r.tokens_per_s);
    printf("checkpoints in %s (latest: %s/latest)\n", c.out_dir, c.out_dir);
    return 0;
}

int cmd_env(int argc, char **argv) {
    if (cli_wants_help(argc, argv) || argc < 2) {
        printf("usage: k3c env reference|prompt --kind KIND [--seed S] [--split train|heldout] [--n N] [--start I]\n\n"
               "Prints N tasks of an environment, one JSON line each: `reference` gives the expert's conversation\n"
               "{\"messages\", \"tools\"} (SFT data for `k3c sft`), `prompt` the prompt alone. Kinds: arith,\n"
               "arith_tool, arith_small, arith_tool_small (operands 2-5 and 1-9), arith_tool_one (one count times a\n"
               "unit the noun implies), copy (repeat a sentence's number), code, assistant, vfs. Tasks are\n"
               "deterministic in (seed, split, index); the two splits never share a task.\n");
        return argc < 2 ? 2 : 0;
    }
    const char *sub = argv[1], *kind = cli_opt(argc, argv, "--kind"), *split = cli_opt(argc, argv, "--split");
    long long seed, n, start;
    if (strcmp(sub, "reference") && strcmp(sub, "prompt"))
        return cli_usage_error("env", "unknown subcommand '%s'", sub);
    if (!kind) return cli_usage_error("env", "--kind is required");
    if (!cli_opt_int(argc, argv, "--seed", 1, &seed) || !cli_opt_int(argc, argv, "--n", 10, &n) ||
        !cli_opt_int(argc, argv, "--start", 0, &start))
        return 2;
    if (split && strcmp(split, "train") && strcmp(split, "heldout"))
        return cli_usage_error("env", "--split: train or heldout");
    int sp = split && !strcmp(split, "heldout");
    k3c_err err = {0};
    for (long long i = start; i < start + n; i++) {
        k3c_env *e;
        if (k3c_env_new(kind, (uint64_t)seed, sp, i, &e, &err)) return cli_fail("env", &err);
        char *out = NULL;
        int rc = 0;
        if (!strcmp(sub, "reference")) {
            rc = k3c_env_reference(e, &out, &err);
        } else {
            char *m = k3c_env_messages(e);
            const char *t = k3c_env_tools(e);
            size_t len = (m ? strlen(m) : 0) + (t ? strlen(t) : 4) + 32;
            out = malloc(len);
            if (out) snprintf(out, len, "{\"messages\":%s,\"tools\":%s}", m ? m : "[]", t ? t : "null");
            free(m);
        }
        k3c_env_free(e);
        if (rc) return cli_fail("env", &err);
        if (out) printf("%s\n", out);
        free(out);
    }
    return 0;
}

int cmd_rl(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        printf(
            "usage: k3c rl --config RL.json [--resume] [--max-steps N] [--quiet] [--log] [--device cpu|cuda] [--gemm "
            "fp32|tf32|bf16] [--kernels bf16|fp16|fp32]\n\n"
            "RL with verifiable rewards from the checkpoint `init` (e.g. an SFT step dir) in environment `env`\n"
            "(arith, arith_tool, arith_small, arith_tool_small, arith_tool_one, copy, code, assistant, vfs). Each\n"
            "step samples "
            "group_size episodes of each of\n"
            "prompts_per_step training tasks, decoded together on the inference engine (multi-turn: tool calls\n"
            "answered by the environment, up to max_turns\n"
            "turns, max_new ids per turn, max_tokens per episode), scores them with the environment's verifier,\n"
            "computes group-relative advantages (\"advantage\": grpo | dr_grpo), drops groups whose rewards are all\n"
            "equal and applies ppo_epochs (default 1) clipped policy-gradient updates (\"loss_agg\": token_mean |\n"
            "seq_mean | const), with the k3 KL to the frozen init checkpoint when beta > 0.\n"
            "Other keys: out_dir, steps, temperature, top_p, lr, grad_clip, matrix_optimizer (adamw | muon),\n"
            "eps_low, eps_high, beta (>= 0), overlong_buffer, overlong_penalty, eval_every, eval_episodes\n"
            "(greedy, held-out split), checkpoint_every, keep_checkpoints, seed, thinking, kda_chunk, threads,\n"
            "format_gate (default true: an episode whose output is not valid XTML scores 0), dynamic_sampling\n"
            "(DAPO: draw batches of prompts until prompts_per_step groups have reward variance, at most max_draws\n"
            "batches, default 4), tis_cap (truncated importance sampling against the rollout engine's log-probs,\n"
            "0 = off), pass_k / pass_n / pass_tasks (at each evaluation greedy pass@1 and unbiased pass@k from\n"
            "pass_n samples of the first pass_tasks training tasks; pass_k 0 = off).\n"
            "OUT/metrics.jsonl gets per step the reward and each verifier component, format-valid fraction,\n"
            "response length, zero-variance fraction, entropy, KL, clip fractions and rollout / update tokens/s;\n"
            "each evaluation writes OUT/eval_step_N.jsonl (per held-out episode: reward, format, the output).\n");
        return 0;
    }
    const char *path = cli_opt(argc, argv, "--config");
    long long max_steps;
    if (!path) return cli_usage_error("rl", "--config is required");
    if (!cli_opt_int(argc, argv, "--max-steps", 0, &max_steps) || max_steps < 0) return 2;
    const cli_device_opts dopt = cli_device_opts_get(argc, argv);
    if (cli_device_check("rl", &dopt)) return 2;
    k3c_err err = {0};
    k3c_rl_config c;
    if (k3c_rl_config_load(path, &c, &err)) return cli_fail("rl", &err);
    cli_device dev;
    if (cli_device_open(&dopt, &dev, &err)) return cli_fail("rl", &err);
    k3c_train_opts o = {.resume = cli_flag(argc, argv, "--resume"),
                        .max_steps = max_steps,
                        .progress = cli_flag(argc, argv, "--quiet") ? NULL : stderr,
                        .log = cli_flag(argc, argv, "--log") ? stdout : NULL,
                        .backend = dev.backend};
    k3c_rl_result r;
    int failed = k3c_rl_run(&c, &o, &r, &err);
    cli_device_release(&dev);
    if (failed) return cli_fail("rl", &err);
    char jsonl[4200], png[4200];
    snprintf(jsonl, sizeof jsonl, "%s/metrics.jsonl", c.out_dir);
    snprintf(png, sizeof png, "%s/metrics.png", c.out_dir);
    static const char *const keys[] = {"reward",       "eval_reward", "format_valid",
                                       "response_len", "entropy",     "zero_var_groups"};
    k3c_err perr = {0};
    if (cli_plot_panels(jsonl, png, keys, 6, &perr) && o.log) fprintf(o.log, "note: %s\n", perr.msg);
    printf("rl: %lld steps, %lld episodes in %.1f s: train reward %.4f, held-out reward %.4f -> %.4f (format-valid "
           "%.0f%%)\n",
           (long long)r.steps, (long long)r.episodes, r.wall_s, r.last_train_reward, r.first_eval_reward,
           r.last_eval_reward, 100 * r.last_eval_format);
    if (c.pass_k)
        printf("rl: training tasks pass@1 (greedy) %.4f -> %.4f, pass@%lld %.4f -> %.4f\n", r.pass1[0], r.pass1[1],
               (long long)c.pass_k, r.pass_k[0], r.pass_k[1]);
    return 0;
}
