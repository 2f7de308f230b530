#!/usr/bin/env bash
# `make ablate`: the two-core ablation demo (docs/EXPERIMENTS.md): the task corpus (once), then the grid of
# configs/ablate/demo.json, timed (wall and CPU seconds); rerunning reads finished runs back and resumes the others.
set -euo pipefail
cd "$(dirname "$0")/.."
TASKS=runs/ablate/tasks
if [ ! -f "$TASKS/data/manifest.json" ]; then
    ./k3c eval data --out "$TASKS" --docs 20000 --seed 1
fi
GRID=${ABLATE_GRID:-configs/ablate/demo.json}
TIMEFORMAT='ablate: wall %R s, CPU %U s user + %S s system'
time ./k3c ablate --config "$GRID"
