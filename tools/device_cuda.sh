#!/usr/bin/env bash
# device_cuda.sh — builds (here, no GPU needed) and runs (on the GPU machine) the CUDA op harness and benchmarks.
# Issue 5 (CUDA backend). Usage:
#   tools/device_cuda.sh build        # here: sm_90a objects + devrun/bin/{op_harness,bench_cuda}, static CPU deps
#   tools/device_cuda.sh run [what]   # there: harness then benches; logs under $OUT (or devrun/out); what = all|harness|bench
# The binaries link libk3c.a (the CPU float32 ops are the harness's reference), OpenBLAS/gfortran/gomp/libstdc++
# statically and cuBLASLt dynamically, so the GPU machine needs only its CUDA runtime libraries.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
mode=${1:-build}
what=${2:-all}

if [ "$mode" = build ]; then
    make --no-print-directory BUILD=build/cuda -j2 build/cuda/libk3c.a >/dev/null
    mkdir -p devrun/obj devrun/bin
    flags=(-O3 -std=c++17 -Iinclude -Isrc -Itests/cuda -gencode=arch=compute_90a,code=sm_90a -lineinfo
           -Xcompiler -Wall,-Wextra,-Wno-unused-parameter)
    objs=()
    for f in src/cuda/*.cu; do
        o=devrun/obj/$(basename "${f%.cu}").o
        objs+=("$o")
        if [ ! -e "$o" ] || [ "$f" -nt "$o" ] || [ -n "$(find src/cuda -name '*.cuh' -newer "$o" -o -name '*.h' -newer "$o")" ]; then
            echo "nvcc $f"
            "$NVCC" "${flags[@]}" -Xptxas -warn-spills -c "$f" -o "$o" &
        fi
    done
    wait
    sa() { gcc -print-file-name="$1"; }
    libs=(build/cuda/libk3c.a /usr/lib/x86_64-linux-gnu/libopenblas.a "$(sa libgfortran.a)" "$(sa libquadmath.a)"
          "$(sa libgomp.a)" -L/usr/local/cuda/lib64 -lcublasLt -lpthread -ldl -lm
          -Xcompiler -static-libstdc++,-static-libgcc)
    "$NVCC" "${flags[@]}" tests/cuda/op_harness.cu "${objs[@]}" "${libs[@]}" -o devrun/bin/op_harness &
    "$NVCC" "${flags[@]}" bench/cuda/bench_cuda.cu "${objs[@]}" "${libs[@]}" -o devrun/bin/bench_cuda &
    wait
    ls -la devrun/bin
    exit 0
fi

# ---------------------------------------------------------------- run (on the GPU machine)
OUT=${OUT:-devrun/out}
mkdir -p "$OUT"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
# pip's nvidia-cublas wheel as a fallback home of libcublasLt
for d in $(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null); do
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH}:$d"
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
ldd devrun/bin/op_harness | grep -E 'not found|cublas' || true
status=0
if [ "$what" = all ] || [ "$what" = harness ]; then
    ./devrun/bin/op_harness ${SEED:-} 2>&1 | tee "$OUT/harness.log" || status=1
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
    ./devrun/bin/bench_cuda ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" || status=1
fi
exit $status
