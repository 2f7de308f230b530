#!/usr/bin/env bash
# devrun_roll37.sh — on the GPU machine, from the repository root with devrun/ carried (made here by
#   PACK_PROGS="build/cuda/tests/cuda/test_engine_cuda build/cuda/tests/cuda/test_rollout_cuda" tools/device_cuda.sh pack
# after `make -j2 cuda cuda-tests`): unpacks, runs test_engine_cuda (f32 + weights as stored) and test_rollout_cuda
# (64 greedy episodes on one GPU engine vs the CPU's, before/after a device weight change, rollout tokens/s).
# Expected: both end "N passed, 0 failed"; test_rollout_cuda prints "rollout tokens/s ...".
set -uo pipefail
for f in devrun/bin/*.xz devrun/lib/*.gz devrun/golden/*/*.gz; do
    [ -e "$f" ] || continue
    case $f in *.xz) xz -d -f "$f" ;; *.gz) gunzip -f "$f" ;; esac
done
chmod +x devrun/bin/*
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/devrun/lib:${LD_LIBRARY_PATH:-}
export K3C_SHARED=$PWD/devrun OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
OUT=${OUT:-devrun/out}
mkdir -p "$OUT"
rc=0
for t in test_engine_cuda test_rollout_cuda; do
    timeout 150 devrun/bin/$t >"$OUT/$t.log" 2>&1 || rc=1
    echo "== $t: $(tail -1 "$OUT/$t.log")"
    grep -E "FAIL|FATAL|tokens/s|episodes equal|stored|greedy" "$OUT/$t.log" | grep -v "^ " | head -40
done
exit $rc
