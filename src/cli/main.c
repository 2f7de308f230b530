/* main.c — `k3c <command> [options]`: the command table. Each command lives in its own file src/cli/cmd_*.c. */
#include "cli.h"

#include <string.h>

static int cmd_version(int argc, char **argv) {
    (void)argc;
    (void)argv;
    printf("k3c %s\n", K3C_VERSION);
    return 0;
}

static const k3c_command commands[] = {
    {"version", "print the k3c version", cmd_version},
    {"tokenizer", "train a byte-level BPE (tiktoken format); encode / decode text", cmd_tokenizer},
    {"data", "prepare token shards from text / JSONL corpora; check or peek at a prepared directory", cmd_data},
    {"logits", "run a checkpoint on token ids and write float32 logits", cmd_logits},
    {"golden-check", "forward + backward on a golden file; compare logits, loss and gradients", cmd_golden_check},
    {"generate", "generate text from a prompt (or token ids): greedy or temperature / top-p", cmd_generate},
    {"inspect", "print a checkpoint's config summary, tensors, dtypes and parameter count", cmd_inspect},
    {"check-kda", "check the CPU KDA (recurrent and chunked, fwd and bwd) against a golden file", cmd_check_kda},
    {"train", "train a model from a run config (stages, optimizer, balancing, checkpoints, metrics)", cmd_train},
    {"eval", "evaluate a checkpoint: MQAR recall, needle in a haystack, loss by position; write task corpora",
     cmd_eval},
    {"ablate", "run an ablation grid (arms x seeds, resumable): metrics, paired t-intervals, report.md, plots",
     cmd_ablate},
    {"sft", "fine-tune a checkpoint on XTML trajectories (loss on the model's own tokens), checkpoints, metrics",
     cmd_sft},
    {"rl", "RL with verifiable rewards in an environment: group rollouts, GRPO / DAPO / Dr. GRPO update", cmd_rl},
    {"env", "post-training environments: print tasks and expert conversations (SFT data)", cmd_env},
    {"plan", "size a model on N GPUs: parameters, FLOPs, memory, communication, best layouts", cmd_plan},
    {"chat", "chat with a model in the terminal: streamed reasoning, content and tool calls", cmd_chat},
    {"serve", "OpenAI-compatible HTTP server: chat / completions (streamed), tokenize, health, metrics", cmd_serve},
    {"vision", "run a checkpoint's vision tower and projector on packed image patches", cmd_vision},
    {"xtml", "render chat prompts (K3 XTML, K2) and parse model output into reasoning / tool calls", cmd_xtml},
};
#define NCOMMANDS (int)(sizeof commands / sizeof *commands)

static void usage(FILE *out) {
    fprintf(out, "k3c %s — Kimi-K3-class sparse MoE engine (train, post-train, serve) in C\n\n", K3C_VERSION);
    fprintf(out, "usage: k3c <command> [options]    (k3c <command> --help for its options)\n\ncommands:\n");
    for (int i = 0; i < NCOMMANDS; i++) fprintf(out, "  %-14s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("k3c %s\n", K3C_VERSION);
        return 0;
    }
    for (int i = 0; i < NCOMMANDS; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "k3c: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
