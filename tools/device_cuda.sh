#!/usr/bin/env bash
# device_cuda.sh — runs the CUDA test and benchmark programs that `make cuda-tests` built (issue 5, CUDA backend;
# issue 11: one build). It compiles nothing. The GPU machine has the CUDA runtime but not Debian's OpenBLAS, so build
# here, then `tools/device_cuda.sh pack` (the golden checkpoint and the non-CUDA shared libraries the programs link,
# under devrun/), carry build/cuda and devrun, and run there:
#   tools/device_cuda.sh [what]   # what = all | harness | bench; logs under $OUT (or devrun/out)
# The programs read the golden checkpoint from ../shared (test_model_cuda: devrun/golden/k3_tiny_a when ../shared is
# absent). SEED repeats a run's random inputs (default: a fresh one, printed).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}

if [ "$what" = pack ]; then
    mkdir -p devrun/golden/k3_tiny_a devrun/lib
    cp ../shared/golden/k3_tiny_a/config.json ../shared/golden/k3_tiny_a/model.safetensors devrun/golden/k3_tiny_a/
    # every library the programs need except the CUDA runtime's and the C library's own
    ldd build/cuda/k3c build/cuda/tests/test_backend_ops build/cuda/tests/cuda/* | awk '$3 ~ /^\// { print $3 }' |
        sort -u | grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so|libcu|libnv' |
        while read -r l; do cp -L "$l" devrun/lib/; done
    ls devrun/lib
    exit 0
fi

OUT=${OUT:-devrun/out}
mkdir -p "$OUT"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
[ -d devrun/lib ] && export LD_LIBRARY_PATH="$PWD/devrun/lib:${LD_LIBRARY_PATH:-}"
seed=${SEED:-$(date +%s)}
echo "seed $seed"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt" || true
B=build/cuda
[ -x $B/tests/test_backend_ops ] || { echo "build/cuda/tests missing: run make cuda-tests first" >&2; exit 2; }
golden=../shared/golden/k3_tiny_a
[ -d "$golden" ] || golden=devrun/golden/k3_tiny_a
status=0
if [ "$what" = all ] || [ "$what" = harness ]; then
    # the table-driven harness (every op of the backend table, CUDA against the CPU), then the programs of tests/cuda
    $B/tests/test_backend_ops "$seed" 2>&1 | tee "$OUT/test_backend_ops.log" || status=1
    for t in $B/tests/cuda/*; do
        n=$(basename "$t")
        if [ "$n" = test_model_cuda ]; then
            "$t" "$seed" "$golden" 2>&1 | tee "$OUT/$n.log" || status=1
        else
            "$t" "$seed" 2>&1 | tee "$OUT/$n.log" || status=1
        fi
    done
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
    $B/bench/cuda/bench_cuda ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" || status=1
    $B/bench/cuda/bench_model_cuda 2>&1 | tee "$OUT/bench_model.log" || status=1
fi
exit $status
