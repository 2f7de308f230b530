#!/usr/bin/env bash
# post_demo.sh — `make post`: SFT then RL on the tiny demo model (the `make run` checkpoint under runs/demo, trained
# first when missing) in the `arith` environment, ending with the held-out comparison line. docs/POST.md "Demo".
# Usage: tools/post_demo.sh [SEED] [OUT]   (defaults 1, runs/post); K3C_POST_RL_STEPS / K3C_POST_SFT_STEPS override.
set -euo pipefail
cd "$(dirname "$0")/.."
K3C=${K3C:-./k3c} # K3C=/path/to/k3c runs another build
SEED=${1:-1}
OUT=$(realpath -m "${2:-runs/post}") # absolute: run-config paths are read relative to the config's directory
SFT_STEPS=${K3C_POST_SFT_STEPS:-40}
RL_STEPS=${K3C_POST_RL_STEPS:-12}
EVAL=${K3C_POST_EVAL:-32}
if [ ! -f runs/demo/train/latest ]; then
    echo "== no demo model yet: make run first"
    bash tools/run_demo.sh
fi
INIT="$(pwd)/runs/demo/train/$(cat runs/demo/train/latest)"
rm -rf "$OUT" && mkdir -p "$OUT"
t0=$(date +%s)

echo "== SFT data: expert conversations of arith (train split 600, held-out 64 for validation)"
$K3C env reference --kind arith --seed "$SEED" --split train --n 600 > "$OUT/sft_train.jsonl"
$K3C env reference --kind arith --seed "$SEED" --split heldout --n 64 > "$OUT/sft_val.jsonl"

cat > "$OUT/sft.json" <<JSON
{"init": "$INIT", "data": "$OUT/sft_train.jsonl", "val_data": "$OUT/sft_val.jsonl", "out_dir": "$OUT/sft",
 "thinking": false, "seq_len": 1024, "steps": $SFT_STEPS, "lr": 0.002, "warmup": 4, "schedule": "cosine",
 "seed": $SEED, "threads": 2, "eval_every": 10, "checkpoint_every": $SFT_STEPS, "keep_checkpoints": 1}
JSON
echo "== SFT: $SFT_STEPS steps of 1,024 tokens"
$K3C sft --config "$OUT/sft.json" --quiet
SFT_CKPT="$OUT/sft/$(cat "$OUT/sft/latest")"

cat > "$OUT/rl.json" <<JSON
{"init": "$SFT_CKPT", "env": "arith", "out_dir": "$OUT/rl", "steps": $RL_STEPS, "prompts_per_step": 4,
 "group_size": 8, "max_turns": 1, "max_new": 48, "max_tokens": 512, "temperature": 1.0, "lr": 0.0005,
 "ppo_epochs": 2, "advantage": "grpo", "loss_agg": "token_mean", "eval_every": $RL_STEPS, "eval_episodes": $EVAL,
 "checkpoint_every": $RL_STEPS, "keep_checkpoints": 1, "seed": $SEED, "threads": 2}
JSON
echo "== RL: $RL_STEPS steps of 4 prompts x 8 samples, held-out greedy evaluation of $EVAL episodes before and after"
$K3C rl --config "$OUT/rl.json" --quiet
echo "== $(( $(date +%s) - t0 )) s"
python3 - "$OUT/rl/metrics.jsonl" "$EVAL" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ev = [r for r in rows if "eval_reward" in r]
a, b = ev[0], ev[-1]
print(f"post: held-out reward SFT {a['eval_reward']:.3f} -> RL {b['eval_reward']:.3f} over {sys.argv[2]} episodes "
      f"(format-valid {100 * b['eval_format_valid']:.0f}%)")
PY
