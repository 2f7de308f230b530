#!/usr/bin/env bash
# post_demo.sh — `make post`: SFT then RL on the tiny demo model (the `make run` checkpoint under runs/demo, trained
# first when missing) in an arith environment, ending with the held-out comparison line. docs/POST.md "Demo".
# Usage: tools/post_demo.sh [SEED] [OUT]   (defaults 1, runs/post). Overrides: K3C_POST_ENV (environment),
# K3C_POST_SFT_STEPS, K3C_POST_RL_STEPS, K3C_POST_EVAL (held-out episodes), K3C_POST_THREADS.
set -euo pipefail
cd "$(dirname "$0")/.."
K3C=${K3C:-./k3c} # K3C=/path/to/k3c runs another build
SEED=${1:-1}
OUT=$(realpath -m "${2:-runs/post}") # absolute: run-config paths are read relative to the config's directory
ENV=${K3C_POST_ENV:-arith_tool_small}
SFT_STEPS=${K3C_POST_SFT_STEPS:-200}
RL_STEPS=${K3C_POST_RL_STEPS:-8}
EVAL=${K3C_POST_EVAL:-64}
THREADS=${K3C_POST_THREADS:-2}
# libgomp's default spins idle threads between the many small parallel regions of this tiny model: on a shared
# machine that tripled the CPU time of an SFT step; passive waiting costs nothing on idle cores.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
if [ ! -f runs/demo/train/latest ]; then
    echo "== no demo model yet: make run first"
    bash tools/run_demo.sh
fi
INIT="$(pwd)/runs/demo/train/$(cat runs/demo/train/latest)"
rm -rf "$OUT" && mkdir -p "$OUT"
t0=$(date +%s)
timed() { # timed NAME CMD...: runs CMD, appends "NAME wall user sys" (seconds) to OUT/times.txt
    local name=$1
    shift
    /usr/bin/time -o "$OUT/time.tmp" -f "$name %e %U %S" "$@"
    cat "$OUT/time.tmp" >> "$OUT/times.txt" && rm -f "$OUT/time.tmp"
}

echo "== SFT data: expert conversations of $ENV (train split 600, held-out 64 for validation)"
$K3C env reference --kind "$ENV" --seed "$SEED" --split train --n 600 > "$OUT/sft_train.jsonl"
$K3C env reference --kind "$ENV" --seed "$SEED" --split heldout --n 64 > "$OUT/sft_val.jsonl"

cat > "$OUT/sft.json" <<JSON
{"init": "$INIT", "data": "$OUT/sft_train.jsonl", "val_data": "$OUT/sft_val.jsonl", "out_dir": "$OUT/sft",
 "thinking": false, "seq_len": 1024, "steps": $SFT_STEPS, "lr": 0.003, "warmup": 4, "schedule": "cosine",
 "seed": $SEED, "threads": $THREADS, "eval_every": $SFT_STEPS, "checkpoint_every": $SFT_STEPS, "keep_checkpoints": 1}
JSON
echo "== SFT: $SFT_STEPS steps of 1,024 tokens"
timed sft $K3C sft --config "$OUT/sft.json" --quiet
SFT_CKPT="$OUT/sft/$(cat "$OUT/sft/latest")"

cat > "$OUT/rl.json" <<JSON
{"init": "$SFT_CKPT", "env": "$ENV", "out_dir": "$OUT/rl", "steps": $RL_STEPS, "prompts_per_step": 4,
 "group_size": 8, "max_turns": 2, "max_new": 96, "max_tokens": 512, "temperature": 1.0, "lr": 0.0001,
 "ppo_epochs": 2, "advantage": "grpo", "loss_agg": "token_mean", "eval_every": $RL_STEPS, "eval_episodes": $EVAL,
 "checkpoint_every": $RL_STEPS, "keep_checkpoints": 1, "seed": $SEED, "threads": $THREADS}
JSON
echo "== RL: $RL_STEPS steps of 4 prompts x 8 samples, held-out greedy evaluation of $EVAL episodes before and after"
timed rl $K3C rl --config "$OUT/rl.json" --quiet
echo "== $(( $(date +%s) - t0 )) s wall; per phase (wall, user, sys seconds):"
cat "$OUT/times.txt"
python3 - "$OUT" "$EVAL" <<'PY'
import glob, json, sys
out, n = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(f"{out}/rl/metrics.jsonl") if l.strip()]
ev = [r for r in rows if "eval_reward" in r]
a, b = ev[0], ev[-1]
dumps = sorted(glob.glob(f"{out}/rl/eval_step_*.jsonl"))
before = [json.loads(l) for l in open(dumps[0])]
after = [json.loads(l) for l in open(dumps[-1])]
def answer(e):  # the model's text after the last tool result: its final answer turn
    return e["output"].rsplit("<|open|>response<|sep|>", 1)[-1].split("<|close|>")[0].strip()
def call(e):
    o = e["output"]
    return o.split('type="string"<|sep|>', 1)[1].split("<|close|>")[0] if 'type="string"<|sep|>' in o else "-"
fixed = [i for i in range(min(len(before), len(after))) if before[i]["reward"] < after[i]["reward"]]
for i in fixed[:3]:
    print(f"held-out task {i}: SFT calculator({call(before[i])!r}) -> {answer(before[i])!r}; "
          f"RL calculator({call(after[i])!r}) -> {answer(after[i])!r}")
print(f"post: held-out reward SFT {a['eval_reward']:.3f} -> RL {b['eval_reward']:.3f} over {n} episodes "
      f"(format-valid SFT {100 * a['eval_format_valid']:.0f}% -> RL {100 * b['eval_format_valid']:.0f}%)")
PY
