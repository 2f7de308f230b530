#!/usr/bin/env bash
# post_seeds.sh — the 3-seed comparison of `make post` (not part of make test): SFT then RL for seeds 1, 2, 3, then the
# mean and standard deviation of the held-out rewards after SFT and after RL. docs/POST.md "Demo".
set -euo pipefail
cd "$(dirname "$0")/.."
for s in 1 2 3; do
    bash tools/post_demo.sh "$s" "runs/post_seed$s" | tee "runs/post_seed$s.log" | tail -1
done
python3 - <<'PY'
import re, statistics as st
sft, rl = [], []
for s in (1, 2, 3):
    line = open(f"runs/post_seed{s}.log").read().strip().splitlines()[-1]
    m = re.search(r"SFT ([-\d.]+) -> RL ([-\d.]+)", line)
    sft.append(float(m.group(1))), rl.append(float(m.group(2)))
d = [b - a for a, b in zip(sft, rl)]
print(f"seeds: SFT {st.mean(sft):.3f} ± {st.stdev(sft):.3f}, RL {st.mean(rl):.3f} ± {st.stdev(rl):.3f}, "
      f"gain {st.mean(d):.3f} (gain / seed std of RL: {st.mean(d) / max(st.stdev(rl), 1e-9):.2f})")
PY
