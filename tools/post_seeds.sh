#!/usr/bin/env bash
# post_seeds.sh — the 3-seed comparison of `make post` (not part of make test): for seeds 1, 2, 3 the whole
# tools/post_demo.sh (its own copy SFT, task SFT, RL, held-out sets and samples: only the `make run` checkpoint is
# shared), then the per-seed held-out rewards, the mean and standard deviation across seeds after SFT and after RL and
# of the per-seed gains, and the mean gain over the largest of those standard deviations (the goal is > 3).
# K3C_POST_PARALLEL=1 runs the three seeds at once, one thread each. docs/POST.md "Demo".
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${K3C_POST_PARALLEL:-0}" = 1 ]; then
    for s in 1 2 3; do
        K3C_POST_THREADS=1 bash tools/post_demo.sh "$s" "runs/post_seed$s" > "runs/post_seed$s.log" 2>&1 &
    done
    wait
else
    for s in 1 2 3; do
        bash tools/post_demo.sh "$s" "runs/post_seed$s" | tee "runs/post_seed$s.log" | tail -1
    done
fi
python3 - <<'PY'
import re, statistics as st
sft, rl, fv = [], [], []
for s in (1, 2, 3):
    line = open(f"runs/post_seed{s}.log").read().strip().splitlines()[-1]
    m = re.search(r"SFT ([-\d.]+) -> RL ([-\d.]+) .*format-valid SFT (\d+)%", line)
    sft.append(float(m.group(1))), rl.append(float(m.group(2))), fv.append(int(m.group(3)))
    print(f"seed {s}: {line}")
d = [b - a for a, b in zip(sft, rl)]
sd = max(st.stdev(sft), st.stdev(rl), st.stdev(d), 1e-9)
print(f"seeds: format-valid after SFT {fv} %; SFT {st.mean(sft):.3f} ± {st.stdev(sft):.3f}, "
      f"RL {st.mean(rl):.3f} ± {st.stdev(rl):.3f}, gain {st.mean(d):.3f} ± {st.stdev(d):.3f} "
      f"(per seed {', '.join(f'{x:+.3f}' for x in d)}; gain / largest seed std: {st.mean(d) / sd:.2f}; "
      f"goal > 3)")
PY
