#!/usr/bin/env bash
# post_demo.sh — `make post`: SFT then RL on the tiny demo model (the `make run` checkpoint under runs/demo, trained
# first when missing), ending with the held-out comparison line. docs/POST.md "Demo". SFT has two stages: the `copy`
# task (repeat the number of a sentence: the demo model cannot read a number from its prompt before it), then the
# environment's expert conversations; RL then runs in the environment from the second stage's checkpoint.
# Usage: tools/post_demo.sh [SEED] [OUT]   (defaults 1, runs/post). Overrides: K3C_POST_ENV (environment),
# K3C_POST_COPY_STEPS (0 skips the copy stage), K3C_POST_SFT_STEPS, K3C_POST_RL_STEPS, K3C_POST_RL_LR, K3C_POST_EVAL
# (held-out episodes), K3C_POST_PASS_K, K3C_POST_SFT_FLOOR, K3C_POST_THREADS, K3C_POST_DEVICE (cuda: SFT and RL on the GPU, with K3C=build/cuda/k3c).
set -euo pipefail
cd "$(dirname "$0")/.."
K3C=${K3C:-./k3c} # K3C=/path/to/k3c runs another build
SEED=${1:-1}
OUT=$(realpath -m "${2:-runs/post}") # absolute: run-config paths are read relative to the config's directory
ENV=${K3C_POST_ENV:-arith_tool_one}
COPY_STEPS=${K3C_POST_COPY_STEPS:-250}
SFT_STEPS=${K3C_POST_SFT_STEPS:-150}
RL_STEPS=${K3C_POST_RL_STEPS:-32}
PASS_K=${K3C_POST_PASS_K:-8}         # pass@k from 8 samples of each of 32 training tasks, before and after RL
FLOOR=${K3C_POST_SFT_FLOOR:-0.5}    # the held-out reward the SFT checkpoint must reach (its competence floor)
RL_LR=${K3C_POST_RL_LR:-0.0003}
EVAL=${K3C_POST_EVAL:-256}
THREADS=${K3C_POST_THREADS:-2}
DEVICE=() CHUNK=16 # the GPU's KDA kernels run chunks of 64
[ -n "${K3C_POST_DEVICE:-}" ] && DEVICE=(--device "$K3C_POST_DEVICE") && CHUNK=64
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
    if [ -x /usr/bin/time ]; then
        /usr/bin/time -o "$OUT/time.tmp" -f "$name %e %U %S" "$@"
        cat "$OUT/time.tmp" >> "$OUT/times.txt" && rm -f "$OUT/time.tmp"
    else # no GNU time (the GPU machine): wall seconds only
        local t0=$SECONDS
        "$@"
        echo "$name $((SECONDS - t0)) - -" >> "$OUT/times.txt"
    fi
}

sft() { # sft NAME INIT DATA VAL STEPS: one `k3c sft` run into OUT/NAME
    cat > "$OUT/$1.json" <<JSON
{"init": "$2", "data": "$3", "val_data": "$4", "out_dir": "$OUT/$1",
 "thinking": false, "seq_len": 1024, "steps": $5, "lr": 0.003, "min_lr_ratio": 0.5, "warmup": 4, "schedule": "cosine",
 "seed": $SEED, "threads": $THREADS, "eval_every": $5, "checkpoint_every": $5, "keep_checkpoints": 1,
 "kda_chunk": $CHUNK}
JSON
    timed "$1" $K3C sft --config "$OUT/$1.json" --quiet "${DEVICE[@]}"
}
if [ "$COPY_STEPS" -gt 0 ]; then
    echo "== SFT stage 1: $COPY_STEPS steps of 1,024 tokens of the copy task (3,000 training, 64 held-out conversations)"
    $K3C env reference --kind copy --seed "$SEED" --split train --n 3000 > "$OUT/copy_train.jsonl"
    $K3C env reference --kind copy --seed "$SEED" --split heldout --n 64 > "$OUT/copy_val.jsonl"
    sft sft_copy "$INIT" "$OUT/copy_train.jsonl" "$OUT/copy_val.jsonl" "$COPY_STEPS"
    INIT="$OUT/sft_copy/$(cat "$OUT/sft_copy/latest")"
fi
echo "== SFT stage 2: $SFT_STEPS steps of 1,024 tokens of $ENV expert conversations (600 training, 64 held-out)"
$K3C env reference --kind "$ENV" --seed "$SEED" --split train --n 600 > "$OUT/sft_train.jsonl"
$K3C env reference --kind "$ENV" --seed "$SEED" --split heldout --n 64 > "$OUT/sft_val.jsonl"
sft sft "$INIT" "$OUT/sft_train.jsonl" "$OUT/sft_val.jsonl" "$SFT_STEPS"
SFT_CKPT="$OUT/sft/$(cat "$OUT/sft/latest")"

cat > "$OUT/rl.json" <<JSON
{"init": "$SFT_CKPT", "env": "$ENV", "out_dir": "$OUT/rl", "steps": $RL_STEPS, "prompts_per_step": 4,
 "group_size": 8, "max_turns": 2, "max_new": 96, "max_tokens": 512, "temperature": 1.0, "lr": $RL_LR,
 "ppo_epochs": 2, "dynamic_sampling": true, "max_draws": 3, "tis_cap": 2.0,
 "pass_k": $PASS_K, "pass_n": 8, "pass_tasks": 32, "advantage": "grpo", "loss_agg": "token_mean", "eval_every": $RL_STEPS, "eval_episodes": $EVAL,
 "checkpoint_every": $RL_STEPS, "keep_checkpoints": 1, "seed": $SEED, "threads": $THREADS, "kda_chunk": $CHUNK}
JSON
echo "== RL: $RL_STEPS steps of 4 groups with reward variance (DAPO dynamic sampling, at most 3 draws of 4 prompts) x 8 samples, TIS cap 2, lr $RL_LR, held-out greedy evaluation of $EVAL episodes before and after"
timed rl $K3C rl --config "$OUT/rl.json" --quiet "${DEVICE[@]}"
echo "== $(( $(date +%s) - t0 )) s wall; per phase (wall, user, sys seconds):"
cat "$OUT/times.txt"
$K3C env reference --kind "$ENV" --seed "$SEED" --split heldout --n "$EVAL" > "$OUT/heldout_ref.jsonl"
python3 - "$OUT" "$EVAL" "$FLOOR" <<'PY'
import glob, json, sys
out, n, floor = sys.argv[1], sys.argv[2], float(sys.argv[3])
rows = [json.loads(l) for l in open(f"{out}/rl/metrics.jsonl") if l.strip()]
ev = [r for r in rows if "eval_reward" in r]
a, b = ev[0], ev[-1]
dumps = sorted(glob.glob(f"{out}/rl/eval_step_*.jsonl"))
before = [json.loads(l) for l in open(dumps[0])]
after = [json.loads(l) for l in open(dumps[-1])]
ref = [json.loads(l)["messages"] for l in open(f"{out}/heldout_ref.jsonl")]  # held-out task i = eval episode i
def answer(e):  # the model's text after the last tool result: its final answer turn
    return e["output"].rsplit("<|open|>response<|sep|>", 1)[-1].split("<|close|>")[0].strip()
def call(e):
    o = e["output"]
    return o.split('type="string"<|sep|>', 1)[1].split("<|close|>")[0] if 'type="string"<|sep|>' in o else "-"
def expert(m):  # the expert's calculator expression, or "-" for a task without a tool call
    calls = [c for x in m if x["role"] == "assistant" for c in x.get("tool_calls", [])]
    return json.loads(calls[0]["function"]["arguments"]).get("expression", "-") if calls else "-"
def right_calls(eps):
    return sum(call(e) == expert(m) for e, m in zip(eps, ref))
fixed = [i for i in range(min(len(before), len(after))) if before[i]["reward"] < after[i]["reward"]]
for i in fixed[:3]:
    print(f"held-out task {i}: {ref[i][1]['content']!r}: SFT calculator({call(before[i])!r}) -> "
          f"{answer(before[i])!r}; RL calculator({call(after[i])!r}) -> {answer(after[i])!r}")
print(f"calculator expression equal to the expert's: SFT {right_calls(before)} -> RL {right_calls(after)} of {n}")
tr = [r for r in rows if "step" in r and "draws" in r]
print(f"dynamic sampling: {sum(r['draws'] for r in tr)} draws, {sum(r['groups_drawn'] for r in tr)} groups drawn, "
      f"{sum(r['groups_filtered'] for r in tr)} flat (filtered), {sum(r['groups_kept'] for r in tr)} kept over {len(tr)} steps")
print(f"SFT competence floor: held-out reward {a['eval_reward']:.3f} vs floor {floor:.2f}: "
      f"{'met' if a['eval_reward'] >= floor else 'NOT met'}")
k = a.get("pass_k", 0)
pk = (f"; training tasks pass@1 (greedy) SFT {a['train_pass1']:.3f} -> RL {b['train_pass1']:.3f}, pass@{k} SFT "
      f"{a['train_pass_k']:.3f} -> RL {b['train_pass_k']:.3f}") if k else ""
print(f"post: held-out reward SFT {a['eval_reward']:.3f} -> RL {b['eval_reward']:.3f} over {n} episodes{pk} "
      f"(format-valid SFT {100 * a['eval_format_valid']:.0f}% -> RL {100 * b['eval_format_valid']:.0f}%)")
PY
