#!/usr/bin/env bash
# device_cuda.sh — builds (here, no GPU needed) and runs (on the GPU machine) the CUDA op harness and benchmarks.
# Issue 5 (CUDA backend). Usage:
#   tools/device_cuda.sh build        # here: sm_90a objects + devrun/bin/k3c_cuda(.gz): every tests/cuda and bench/cuda
#                                     # program in one binary (k3c_cuda NAME args), plus devrun/golden/k3_tiny_a
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
    # One multi-call binary (argv[1] names the program) keeps a single static OpenBLAS: the carry limit is 64 MiB.
    progs=()
    for t in tests/cuda/op_harness.cu tests/cuda/harness_*.cu tests/cuda/test_model_cuda.cu bench/cuda/*.cu; do
        [ -e "$t" ] || continue
        n=$(basename "${t%.cu}")
        progs+=("$n")
        "$NVCC" "${flags[@]}" -Dmain="main_$n" -c "$t" -o "devrun/obj/prog_$n.o" &
    done
    # the k3c CLI itself (with --device cuda), as program "k3c"
    cflags=(-std=c11 -O2 -march=x86-64-v3 -fopenmp -D_GNU_SOURCE -DK3C_CUDA -Iinclude -Isrc
            -I/usr/include/x86_64-linux-gnu/openblas-openmp -I/usr/local/cuda/include)
    for f in src/cli/*.c; do
        o=devrun/obj/cli_$(basename "${f%.c}").o
        if [ "$f" = src/cli/main.c ]; then gcc "${cflags[@]}" -Dmain=main_k3c -c "$f" -o "$o"; else gcc "${cflags[@]}" -c "$f" -o "$o"; fi
    done
    progs+=(k3c)
    {
        echo '#include <stdio.h>'
        echo '#include <string.h>'
        for n in "${progs[@]}"; do
            if [ "$n" = k3c ]; then echo 'extern "C" int main_k3c(int, char **);'; else echo "int main_$n(int, char **);"; fi
        done
        echo 'int main(int argc, char **argv) {'
        for n in "${progs[@]}"; do
            echo "    if (argc > 1 && strcmp(argv[1], \"$n\") == 0) return main_$n(argc - 1, argv + 1);"
        done
        echo "    fprintf(stderr, \"usage: k3c_cuda PROGRAM [args]: ${progs[*]}\\n\");"
        echo '    return 2;'
        echo '}'
    } > devrun/obj/k3c_cuda_main.cu
    wait
    "$NVCC" "${flags[@]}" devrun/obj/k3c_cuda_main.cu devrun/obj/prog_*.o devrun/obj/cli_*.o "${objs[@]}" "${libs[@]}" \
        -o devrun/bin/k3c_cuda
    rm -f devrun/bin/k3c_cuda.gz && gzip -k devrun/bin/k3c_cuda
    # the golden checkpoint the model test loads (../shared does not travel to the GPU machine)
    mkdir -p devrun/golden/k3_tiny_a
    cp ../shared/golden/k3_tiny_a/config.json ../shared/golden/k3_tiny_a/model.safetensors devrun/golden/k3_tiny_a/
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
[ -x devrun/bin/k3c_cuda ] || gunzip -k devrun/bin/k3c_cuda.gz
bin=devrun/bin/k3c_cuda
ldd $bin | grep -E 'not found|cublas' || true
status=0
if [ "$what" = all ] || [ "$what" = harness ]; then
    for t in op_harness harness_norms harness_seq harness_mix harness_optim test_model_cuda; do
        $bin $t ${SEED:-} 2>&1 | tee "$OUT/$t.log" || status=1
    done
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
    $bin bench_cuda ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" || status=1
    $bin bench_model_cuda 2>&1 | tee "$OUT/bench_model.log" || status=1
fi
exit $status
