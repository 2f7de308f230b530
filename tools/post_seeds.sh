#!/usr/bin/env bash
# post_seeds.sh — the seed comparison of `make post` (not part of make test): for each seed the whole
# tools/post_demo.sh (its own copy SFT, task SFT, RL, held-out sets and samples: only the `make run` checkpoint is
# shared) with 512 held-out episodes per evaluation, then per seed the RL gain in held-out reward with its standard
# error paired over the same held-out tasks (the SFT and RL evaluations score the same tasks greedily), the mean gain
# over seeds and the standard error of that mean. docs/POST.md "Demo".
# Usage: tools/post_seeds.sh [SEEDS...] (default 1 2 3). K3C_POST_PARALLEL=1 runs the seeds at once, one thread each;
# K3C_POST_EVAL (default 512) and the other K3C_POST_* settings pass through to post_demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=("$@")
[ ${#SEEDS[@]} -gt 0 ] || SEEDS=(1 2 3)
export K3C_POST_EVAL=${K3C_POST_EVAL:-512}
t0=$(date +%s)
if [ "${K3C_POST_PARALLEL:-0}" = 1 ]; then
    for s in "${SEEDS[@]}"; do
        K3C_POST_THREADS=1 bash tools/post_demo.sh "$s" "runs/post_seed$s" > "runs/post_seed$s.log" 2>&1 &
    done
    wait
else
    for s in "${SEEDS[@]}"; do
        mkdir -p runs
        bash tools/post_demo.sh "$s" "runs/post_seed$s" > "runs/post_seed$s.log" 2>&1
        tail -1 "runs/post_seed$s.log"
    done
fi
echo "== ${#SEEDS[@]} seeds in $(( $(date +%s) - t0 )) s wall (load: $(cut -d' ' -f1-3 /proc/loadavg))"
python3 - "${SEEDS[@]}" <<'PY'
import glob, json, math, statistics as st, sys
gains = []
for s in sys.argv[1:]:
    d = f"runs/post_seed{s}/rl"
    dumps = sorted(glob.glob(f"{d}/eval_step_*.jsonl"))
    a = [json.loads(l)["reward"] for l in open(dumps[0])]
    b = [json.loads(l)["reward"] for l in open(dumps[-1])]
    # the dumps hold the verifier's reward; the run's metric gates it by format validity, so take that from metrics
    fa = [json.loads(l)["format_valid"] for l in open(dumps[0])]
    fb = [json.loads(l)["format_valid"] for l in open(dumps[-1])]
    a = [r * f for r, f in zip(a, fa)]
    b = [r * f for r, f in zip(b, fb)]
    diff = [y - x for x, y in zip(a, b)]
    n = len(diff)
    g = st.mean(diff)
    se = st.stdev(diff) / math.sqrt(n) if n > 1 else float("nan")
    gains.append(g)
    line = open(f"runs/post_seed{s}.log").read().strip().splitlines()[-1]
    print(f"seed {s}: SFT {st.mean(a):.3f} -> RL {st.mean(b):.3f} over {n} held-out tasks: gain {g:+.4f} ± {se:.4f} "
          f"(paired SE; gain / SE {g / se if se > 0 else float('inf'):.2f}, goal > 2)")
    print(f"    {line}")
m = st.mean(gains)
sem = st.stdev(gains) / math.sqrt(len(gains)) if len(gains) > 1 else float("nan")
print(f"seeds {len(gains)}: mean gain {m:+.4f}, standard error of the mean over seeds {sem:.4f} "
      f"(mean / SEM {m / sem if sem > 0 else float('inf'):.2f}, goal > 3); per seed {', '.join(f'{x:+.4f}' for x in gains)}")
PY
