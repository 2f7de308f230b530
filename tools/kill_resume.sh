#!/usr/bin/env bash
# kill_resume.sh — crash safety at `make run` scale: trains the demo model (configs/k3_tiny.json under
# configs/demo_run.json, on the runs/demo tokenizer and shards of tools/run_demo.sh) once without interruption, then
# again while killing it with SIGKILL at random moments KILLS times, resuming with --resume after every kill; finally it
# compares the two runs' last checkpoints (model.safetensors, optimizer.safetensors, trainer_state.json) with cmp and
# their metrics.jsonl rows (without the timing field tokens_per_s and without the resume event lines). Not part of
# `make test`: at full size (40 steps, 100 kills) it takes hours on a small machine.
# usage: tools/kill_resume.sh [KILLS]   (default 100)
# env:   STEPS (default 40, the whole demo run; fewer = the first STEPS steps of it), DEMO (runs/demo), OUT
#        (runs/kill_resume), SEED (kill moments), MAX_DELAY (seconds; default startup + 1.3 x the reference's seconds
#        per step), NICE (10), K3C (./k3c), REUSE_REF (1: keep the reference run of an earlier call)
set -uo pipefail
cd "$(dirname "$0")/.."
KILLS=${1:-${KILLS:-100}}
STEPS=${STEPS:-40}
DEMO=${DEMO:-runs/demo}
OUT=${OUT:-runs/kill_resume}
SEED=${SEED:-$(date +%s)}
NICE=${NICE:-10}
K3C=${K3C:-./k3c}
[ -x "$K3C" ] || make -j2 k3c || exit 1
if [ ! -f "$DEMO/data/python_docs/manifest.json" ] || [ ! -f "$DEMO/data/jargon/manifest.json" ]; then
    [ "$DEMO" = runs/demo ] || { echo "kill_resume: $DEMO has no prepared data"; exit 1; }
    tools/run_demo.sh --data-only || exit 1
fi
last=$(printf 'step_%08d' "$STEPS")
if [ -n "${REUSE_REF:-}" ] && [ -f "$OUT/ref/$last/model.safetensors" ] && [ -f "$OUT/ref.seconds" ]; then
    rm -rf "$OUT/kill" "$OUT/kill.log" # REUSE_REF=1: keep the reference run of an earlier call with the same STEPS
else
    rm -rf "$OUT" && mkdir -p "$OUT"
fi
# the demo run config with absolute paths, written twice: the reference and the killed run (a checkpoint every step,
# so that every kill has a checkpoint to come back to; the cadence does not change the arithmetic)
python3 - "$DEMO" "$OUT" <<'PY' || exit 1
import json, os, sys
demo, out = (os.path.abspath(a) for a in sys.argv[1:])
c = json.load(open("configs/demo_run.json"))
c["model"] = os.path.abspath("configs/k3_tiny.json")
c["tokenizer"] = demo + "/tokenizer.tiktoken"
c["data"] = {k: demo + "/data/" + k for k in c["data"]}
for name, every in (("ref", c["checkpoint_every"]), ("kill", 1)):
    c["out_dir"], c["checkpoint_every"] = out + "/" + name, every
    json.dump(c, open(out + "/" + name + ".json", "w"), indent=1)
PY
# exec: a background `train kill &` is then the k3c process itself, so that kill -9 $! hits k3c, not a subshell
train() { exec nice -n "$NICE" "$K3C" train --config "$OUT/$1.json" --max-steps "$STEPS" --quiet "${@:2}"; }

if [ ! -f "$OUT/ref.seconds" ]; then
    t0=$(date +%s.%N)
    (train ref) >"$OUT/ref.log" 2>&1 || { echo "kill_resume: the reference run failed:"; tail -5 "$OUT/ref.log"; exit 1; }
    python3 -c "import time; print(time.time() - $t0)" >"$OUT/ref.seconds"
fi
t_ref=$(cat "$OUT/ref.seconds")
MAX_DELAY=${MAX_DELAY:-$(python3 -c "print(5 + 1.3 * $t_ref / $STEPS)")}
echo "reference: $STEPS steps in $(printf %.0f "$t_ref") s; kill delays uniform in [0, $(printf %.1f "$MAX_DELAY")] s, SEED=$SEED"

kills=0 completions=0 bad=0
for i in $(seq 1 "$KILLS"); do
    if [ "$(cat "$OUT/kill/latest" 2>/dev/null)" = "$(printf 'step_%08d' "$STEPS")" ]; then
        rm -rf "$OUT/kill" # the run finished between kills: start over so that there is something to interrupt
        completions=$((completions + 1))
    fi
    resume=()
    [ -d "$OUT/kill" ] && resume=(--resume)
    train kill "${resume[@]}" >>"$OUT/kill.log" 2>&1 &
    pid=$!
    sleep "$(python3 -c "import random; random.seed($SEED * 100003 + $i); print(random.uniform(0, $MAX_DELAY))")"
    kill -9 "$pid" 2>/dev/null
    wait "$pid"
    rc=$?
    if [ $rc -eq 137 ]; then kills=$((kills + 1)); elif [ $rc -ne 0 ]; then
        echo "kill_resume: round $i: the run failed (exit $rc); see $OUT/kill.log"
        bad=1
    fi
    if [ -f "$OUT/kill/latest" ] && ! "$K3C" inspect "$OUT/kill/$(cat "$OUT/kill/latest")" >/dev/null 2>>"$OUT/kill.log"
    then
        echo "kill_resume: round $i: latest checkpoint does not load (see $OUT/kill.log)"
        bad=1
    fi
    printf '\rkill %d/%d: latest %s' "$i" "$KILLS" "$(cat "$OUT/kill/latest" 2>/dev/null || echo none)"
done
echo
resume=()
[ -d "$OUT/kill" ] && resume=(--resume)
(train kill "${resume[@]}") >>"$OUT/kill.log" 2>&1 || { echo "kill_resume: the final resume failed"; exit 1; }

for f in model.safetensors optimizer.safetensors trainer_state.json; do
    if cmp -s "$OUT/ref/$last/$f" "$OUT/kill/$last/$f"; then echo "identical: $last/$f"; else
        echo "DIFFERENT: $last/$f"
        bad=1
    fi
done
rows() { grep -v '"event"' "$OUT/$1/metrics.jsonl" | sed -E 's/,"tokens_per_s":[^,}]*//'; }
if [ "$(rows ref)" = "$(rows kill)" ]; then echo "identical: metrics.jsonl ($(rows ref | wc -l) rows, tokens_per_s aside)"; else
    echo "DIFFERENT: metrics.jsonl"
    diff <(rows ref) <(rows kill) | head -5
    bad=1
fi
echo "kill_resume: $kills of $KILLS rounds ended by SIGKILL ($completions times the run had finished and started over)," \
    "$STEPS steps of the demo run, SEED=$SEED: $([ $bad = 0 ] && echo PASS || echo FAIL)"
exit $bad
