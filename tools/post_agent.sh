#!/usr/bin/env bash
# post_agent.sh — SFT then RL in an agent environment (`assistant` or `vfs`), ending with the held-out reward and
# each verifier component before and after RL, paired over the same held-out tasks. docs/POST.md "Agent environments".
# Usage: tools/post_agent.sh ENV [SEED] [OUT]   (defaults vfs, 1, runs/agent_ENV). Overrides: K3C (the binary),
# K3C_AGENT_INIT (the starting checkpoint: default the `make post` SFT checkpoint, else the `make run` model),
# K3C_AGENT_SFT_STEPS, K3C_AGENT_RL_STEPS, K3C_AGENT_PROMPTS (groups a step), K3C_AGENT_EVAL (held-out episodes),
# K3C_AGENT_LR (RL), K3C_POST_THREADS, K3C_POST_DEVICE (cuda: SFT and RL on the GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
K3C=${K3C:-./k3c}
ENV=${1:-vfs}
SEED=${2:-1}
OUT=$(realpath -m "${3:-runs/agent_$ENV}")
SFT_STEPS=${K3C_AGENT_SFT_STEPS:-300}
RL_STEPS=${K3C_AGENT_RL_STEPS:-30}
PROMPTS=${K3C_AGENT_PROMPTS:-8}
EVAL=${K3C_AGENT_EVAL:-256}
RL_LR=${K3C_AGENT_LR:-0.0003}
THREADS=${K3C_POST_THREADS:-2}
DEVICE=() CHUNK=16 # the GPU's KDA kernels run chunks of 64
[ -n "${K3C_POST_DEVICE:-}" ] && DEVICE=(--device "$K3C_POST_DEVICE") && CHUNK=64
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# An episode's length: the tool schemas alone are some 800 tokens; the assistant runs 4-7 days of several calls each.
case $ENV in
vfs) SEQ=2048 TURNS=10 NEW=160 MAXTOK=2048 ;;
assistant) SEQ=4096 TURNS=28 NEW=96 MAXTOK=4096 ;;
*) echo "post_agent.sh: environment '$ENV': expected assistant or vfs" >&2 && exit 2 ;;
esac
if [ -n "${K3C_AGENT_INIT:-}" ]; then
    INIT=$(realpath "$K3C_AGENT_INIT")
elif [ -f runs/post/sft/latest ]; then
    INIT="$(pwd)/runs/post/sft/$(cat runs/post/sft/latest)"
elif [ -f runs/demo/train/latest ]; then
    INIT="$(pwd)/runs/demo/train/$(cat runs/demo/train/latest)"
else
    echo "post_agent.sh: no starting checkpoint: run make run (or make post), or set K3C_AGENT_INIT" >&2 && exit 2
fi
rm -rf "$OUT" && mkdir -p "$OUT"
t0=$(date +%s)
echo "== SFT: $SFT_STEPS steps of $SEQ tokens of $ENV expert conversations (2,000 training, 64 held-out) from $INIT"
$K3C env reference --kind "$ENV" --seed "$SEED" --split train --n 2000 > "$OUT/sft_train.jsonl"
$K3C env reference --kind "$ENV" --seed "$SEED" --split heldout --n 64 > "$OUT/sft_val.jsonl"
cat > "$OUT/sft.json" <<JSON
{"init": "$INIT", "data": "$OUT/sft_train.jsonl", "val_data": "$OUT/sft_val.jsonl", "out_dir": "$OUT/sft",
 "thinking": false, "seq_len": $SEQ, "steps": $SFT_STEPS, "lr": 0.003, "min_lr_ratio": 0.5, "warmup": 4,
 "schedule": "cosine", "seed": $SEED, "threads": $THREADS, "eval_every": $SFT_STEPS, "checkpoint_every": $SFT_STEPS,
 "keep_checkpoints": 1, "kda_chunk": $CHUNK}
JSON
$K3C sft --config "$OUT/sft.json" --quiet "${DEVICE[@]}"
cat > "$OUT/rl.json" <<JSON
{"init": "$OUT/sft/$(cat "$OUT/sft/latest")", "env": "$ENV", "out_dir": "$OUT/rl", "steps": $RL_STEPS,
 "prompts_per_step": $PROMPTS, "group_size": 8, "max_turns": $TURNS, "max_new": $NEW, "max_tokens": $MAXTOK,
 "temperature": 1.0, "lr": $RL_LR, "ppo_epochs": 2, "dynamic_sampling": true, "max_draws": 3, "tis_cap": 2.0,
 "advantage": "grpo", "loss_agg": "token_mean", "eval_every": $RL_STEPS, "eval_episodes": $EVAL,
 "checkpoint_every": $RL_STEPS, "keep_checkpoints": 1, "seed": $SEED, "threads": $THREADS, "kda_chunk": $CHUNK}
JSON
echo "== RL: $RL_STEPS steps of $PROMPTS groups with reward variance x 8 samples (up to $TURNS turns), lr $RL_LR, held-out greedy evaluation of $EVAL episodes before and after"
$K3C rl --config "$OUT/rl.json" --quiet "${DEVICE[@]}"
echo "== $(($(date +%s) - t0)) s wall; curves in $OUT/rl/metrics.png"
python3 - "$OUT" "$ENV" <<'PY'
import glob, json, math, statistics as st, sys
out, env = sys.argv[1], sys.argv[2]
dumps = sorted(glob.glob(f"{out}/rl/eval_step_*.jsonl"))
a = [json.loads(l) for l in open(dumps[0])]
b = [json.loads(l) for l in open(dumps[-1])]
def paired(key, f=lambda e, k: e[k]):  # SFT mean, RL mean, mean paired gain, its standard error
    x = [f(e, key) for e in a]
    y = [f(e, key) for e in b]
    d = [q - p for p, q in zip(x, y)]
    se = st.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
    return st.mean(x), st.mean(y), st.mean(d), se
comps = [k for k in a[0] if k.startswith("r_")]
print(f"{'component':<16}{'SFT':>8}{'RL':>8}{'gain':>9}{'SE':>8}{'gain/SE':>9}")
rows = [("reward", paired("reward", lambda e, k: e[k] * e["format_valid"]))]
rows += [(k[2:], paired(k)) for k in comps] + [("format_valid", paired("format_valid"))]
def ratio(g, se):
    return g / se if se > 0 else (0.0 if g == 0 else math.copysign(math.inf, g))
for name, (x, y, g, se) in rows:
    print(f"{name:<16}{x:8.3f}{y:8.3f}{g:+9.4f}{se:8.4f}{ratio(g, se):9.2f}")
x, y, g, se = rows[0][1]
print(f"agent {env}: held-out reward SFT {x:.3f} -> RL {y:.3f} over {len(a)} episodes: gain {g:+.4f} ± {se:.4f} "
      f"(paired SE; gain / SE {ratio(g, se):.2f}, goal > 2)")
PY
