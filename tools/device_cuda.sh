#!/usr/bin/env bash
# device_cuda.sh — carries the CUDA test and benchmark programs that `make cuda-tests` built to a GPU machine and runs
# them there (one build; nothing is compiled here). The GPU machine has the CUDA runtime but not Debian's
# OpenBLAS, and build/cuda is far larger than a device call may carry, so:
#   tools/device_cuda.sh pack     # here: devrun/bin (stripped, xz), devrun/lib (the non-CUDA shared libraries they
#                                 # link), devrun/golden/k3_tiny_a, k3_vision_tiny; carry devrun (about 40 MB)
#   tools/device_cuda.sh [what]   # there: what = all | harness | engine | bench | speed | dist | muon; logs under $OUT
#                                 # (or devrun/out)
#     harness: test_backend_ops, test_backend_ops_decode, test_vision_data (vision training on the GPU), every program
#     of tests/cuda but test_engine_cuda (engine's), and with `make nccl` test_comm_nccl and test_dist_nccl (the parallel
#     training step on the GPU over NCCL; several GPUs: mpirun -np N devrun/bin/test_dist_nccl); any program failing
#     (or missing) fails the mode
#     dist: only the NCCL programs, then `k3c_nccl train` on the make-run data for 3 steps, plain and with "parallel":
#     {"force": true} (the parallel step on one GPU), their losses side by side (PACK_PROGS=build/cuda/k3c at pack
#     time carries just the NCCL programs and k3c)
#     speed: the whole training step on ../shared/bench's medium configs at each GEMM mode, the Hugging Face
#     transformers + fla anchor in the same call (side_device.py; FLA_TGZ=path/to/fla.tgz at pack time carries fla),
#     and the make-run demo trained on the GPU at fp32 and bf16 GEMMs (validation loss against the CPU's)
#     muon: test_optim_cuda (the optimizer against the CPU, bf16 and fp32 Newton–Schulz) and the Muon update's time at
#     each precision and its share of kimi_linear_medium's step at tf32 and bf16 GEMMs (at pack time
#     PACK_PROGS="build/cuda/tests/cuda/test_optim_cuda build/cuda/bench/cuda/bench_model_cuda" carries just these)
# SEED repeats a run's random inputs (default: a fresh one, printed). `k3c` (with --device cuda) is in devrun/bin too.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}

if [ "$what" = pack ]; then
    # the programs of today's sources (build/cuda may still hold ones whose source is gone)
    progs=(build/cuda/k3c build/cuda/tests/test_backend_ops build/cuda/tests/test_backend_ops_decode
        build/cuda/tests/test_vision_data)
    for s in tests/cuda/*.cu bench/cuda/*.cu; do progs+=("build/cuda/${s%.cu}"); done
    [ -n "${PACK_PROGS:-}" ] && read -r -a progs <<<"$PACK_PROGS" # a subset, e.g. the engine mode's programs
    for p in "${progs[@]}"; do
        [ -x "$p" ] || { echo "$p missing: run make cuda-tests first" >&2; exit 2; }
    done
    # `make nccl`: the one-rank NCCL communicator, the parallel training step on CUDA over it (2 MB each, xz), and
    # build/nccl/k3c (the GPU k3c with NCCL and MPI), carried as devrun/bin/k3c_nccl
    for p in build/nccl/test_comm_nccl build/nccl/test_dist_nccl build/nccl/k3c; do [ -x $p ] && progs+=($p); done
    rm -rf devrun/bin devrun/lib && mkdir -p devrun/bin devrun/lib devrun/golden/k3_tiny_a devrun/golden/k3_vision_tiny
    for p in "${progs[@]}"; do
        n=$(basename "$p") && [ "$p" = build/nccl/k3c ] && n=k3c_nccl
        strip -o "devrun/bin/$n" "$p" && xz -T2 -6 -f "devrun/bin/$n"
    done
    cp ../shared/golden/k3_tiny_a/config.json devrun/golden/k3_tiny_a/
    gzip -c ../shared/golden/k3_tiny_a/model.safetensors >devrun/golden/k3_tiny_a/model.safetensors.gz
    # the engine test's goldens (ids and logits only: the gradients stay here) and the decode benchmark's config
    for g in k3_tiny_a kimi_linear_tiny_a; do
        mkdir -p devrun/golden/$g && cp ../shared/golden/$g/config.json devrun/golden/$g/
        [ -f devrun/golden/$g/model.safetensors.gz ] || gzip -c ../shared/golden/$g/model.safetensors >devrun/golden/$g/model.safetensors.gz
        python3 tools/st_subset.py ../shared/golden/$g/golden.safetensors devrun/golden/$g/golden.safetensors \
            input_ids logits prompt_ids greedy_ids
    done
    mkdir -p devrun/bench && cp ../shared/bench/kimi_linear_medium.json devrun/bench/
    cp bench/hf_generate.py devrun/ # the transformers anchor of the decode benchmark
    cp tools/device_cuda.sh devrun/ # `bash devrun/device_cuda.sh engine` on a tree without this script's newer modes
    cp ../shared/golden/k3_vision_tiny/config.json devrun/golden/k3_vision_tiny/ # test_vision_cuda's whole tower
    gzip -c ../shared/golden/k3_vision_tiny/model.safetensors >devrun/golden/k3_vision_tiny/model.safetensors.gz
    gzip -c ../shared/golden/k3_vision_tiny/golden.safetensors >devrun/golden/k3_vision_tiny/golden.safetensors.gz
    mkdir -p devrun/cfg && cp ../shared/bench/kimi_linear_medium.json ../shared/bench/k3_medium.json \
        ../shared/bench/side_device.py devrun/cfg/
    [ -n "${FLA_TGZ:-}" ] && cp "$FLA_TGZ" devrun/fla.tgz
    if [ -f runs/demo/tokenizer.tiktoken ]; then # the make-run demo's data, for `speed`'s GPU training runs
        mkdir -p devrun/run && cp -r runs/demo/data runs/demo/tokenizer.tiktoken* configs/k3_tiny.json devrun/run/
        gzip -f devrun/run/data/*/*.k3cshard
    fi
    # every library the programs need except the CUDA runtime's and the C and C++ runtimes (the GPU machine's are newer)
    ldd "${progs[@]}" | awk '$3 ~ /^\// { print $3 }' | sort -u |
        grep -Ev '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|libcu|libnv|libnccl' |
        while read -r l; do cp -L "$l" devrun/lib/ && gzip -f "devrun/lib/$(basename "$l")"; done
    du -sh devrun
    exit 0
fi

# ---------------------------------------------------------------- there: unpack once, then run
for f in devrun/bin/*.xz devrun/lib/*.gz devrun/golden/*/*.gz devrun/run/data/*/*.gz; do
    [ -e "$f" ] || continue
    case $f in *.xz) xz -d -f "$f" ;; *.gz) gunzip -f "$f" ;; esac
done
chmod +x devrun/bin/* 2>/dev/null || true
OUT=${OUT:-devrun/out}
mkdir -p "$OUT"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH="$PWD/devrun/lib:${LD_LIBRARY_PATH:-}"
# NCCL (200 MB) is not carried: the GPU machine's own, from the CUDA toolkit or the nvidia-nccl wheel next to torch
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
[ -n "$nccl" ] && [ -d "$nccl" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$nccl"
[ -d ../shared/golden ] || export K3C_SHARED="$PWD/devrun" # devrun/golden/k3_tiny_a stands in for ../shared
seed=${SEED:-$(date +%s)}
echo "seed $seed"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt" || true
B=devrun/bin
[ -x $B/test_backend_ops ] || [ -x $B/test_engine_cuda ] || [ -x $B/test_dist_nccl ] || [ -x $B/test_optim_cuda ] || { echo "devrun/bin missing: run make cuda-tests and tools/device_cuda.sh pack" >&2; exit 2; }
golden=${K3C_SHARED:-../shared}/golden/k3_tiny_a
status=0
if [ "$what" = all ] || [ "$what" = harness ]; then
    # the table-driven harness (every op of the backend table, CUDA against the CPU), then the programs of tests/cuda
    $B/test_backend_ops "$seed" 2>&1 | tee "$OUT/test_backend_ops.log" || status=1
    $B/test_backend_ops_decode "$seed" 2>&1 | tee "$OUT/test_backend_ops_decode.log" || status=1
    $B/test_vision_data 2>&1 | tee "$OUT/test_vision_data.log" || status=1 # vision training on the GPU
    for t in $(cd tests/cuda && ls *.cu); do
        n=${t%.cu}
        if [ "$n" = test_engine_cuda ] || [ "$n" = test_rollout_cuda ]; then
            continue # the `engine` mode's
        elif [ "$n" = test_model_cuda ]; then
            $B/$n "$seed" "$golden" 2>&1 | tee "$OUT/$n.log" || status=1
        else
            $B/$n "$seed" 2>&1 | tee "$OUT/$n.log" || status=1
        fi
    done
    if [ -x $B/test_comm_nccl ]; then $B/test_comm_nccl 2>&1 | tee "$OUT/test_comm_nccl.log" || status=1; fi
    # the parallel training step (dp, ep: one rank on one GPU; under mpirun one rank per GPU) against one process
    if [ -x $B/test_dist_nccl ]; then $B/test_dist_nccl 2>&1 | tee "$OUT/test_dist_nccl.log" || status=1; fi
fi
if [ "$what" = dist ]; then # the parallel training step on the GPU (make nccl)
    $B/test_comm_nccl 2>&1 | tee "$OUT/test_comm_nccl.log" || status=1
    $B/test_dist_nccl 2>&1 | tee "$OUT/test_dist_nccl.log" || status=1
    if [ -d devrun/run/data ] && [ -x $B/k3c_nccl ]; then
        for f in plain force; do # 3 steps of the make-run schedule, the one-process step and the parallel one
            python3 - "$f" <<'PY'
import json, os, sys
c = json.load(open("configs/demo_run.json"))
r = os.path.abspath("devrun/run")
c.update(model=r + "/k3_tiny.json", tokenizer=r + "/tokenizer.tiktoken", kda_chunk=64, eval_every=0,
         out_dir="/tmp/gpu_dist_" + sys.argv[1], data={k: r + "/data/" + k for k in c["data"]})
if sys.argv[1] == "force":
    c["parallel"] = {"force": True}
json.dump(c, open("/tmp/gpu_dist_%s.json" % sys.argv[1], "w"))
PY
            rm -rf /tmp/gpu_dist_$f
            $B/k3c_nccl train --config /tmp/gpu_dist_$f.json --device cuda --max-steps 3 --quiet 2>&1 | tail -3 |
                tee "$OUT/dist_train_$f.log" || status=1
            grep -h '"loss"' /tmp/gpu_dist_$f/metrics.jsonl | cut -c1-120 | tee -a "$OUT/dist_train_$f.log"
        done
    fi
fi
if [ "$what" = all ] || [ "$what" = engine ]; then # the inference engine on the GPU against the CPU, then its speed
    $B/test_engine_cuda 2>&1 | tee "$OUT/test_engine_cuda.log" || status=1
    # an RL step's episodes on one GPU engine against the CPU's, and rollout tokens/s
    $B/test_rollout_cuda 2>&1 | tee "$OUT/test_rollout_cuda.log" || status=1
    $B/bench_decode_cuda "${K3C_SHARED:-../shared}/bench/kimi_linear_medium.json" ${DECODE_ARGS:-} 2>&1 |
        tee "$OUT/bench_decode.log" || status=1
    if [ -n "${HF_ANCHOR:-}" ]; then # transformers `generate` on the same config (bench/hf_generate.py)
        hf=bench/hf_generate.py && [ -f $hf ] || hf=devrun/hf_generate.py
        timeout "${HF_TIMEOUT:-240}" python3 $hf "${K3C_SHARED:-../shared}/bench/kimi_linear_medium.json" 64 64 1,64,256 \
            2>&1 | grep -v Warning | tee "$OUT/hf_generate.log" || status=1
    fi
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
    $B/bench_cuda ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" || status=1
    $B/bench_model_cuda 2>&1 | tee "$OUT/bench_model.log" || status=1
fi
if [ "$what" = muon ]; then # Muon's Newton–Schulz on the GPU (docs/MODEL.md §10.4)
    $B/test_optim_cuda "$seed" 2>&1 | tee "$OUT/test_optim_cuda.log" || status=1
    for g in 1 2; do # tf32, bf16 GEMMs; the step's update at the default muon precision (auto: bf16)
        $B/bench_model_cuda devrun/cfg/kimi_linear_medium.json 16384 16 $g 0 0 muon 2>&1 |
            tee "$OUT/model_kl_muon_gemm$g.log" || status=1
    done
fi
if [ "$what" = speed ]; then
    for g in 1 2; do # tf32, bf16 GEMMs; 16 documents of 1,024 tokens
        $B/bench_model_cuda devrun/cfg/kimi_linear_medium.json 16384 16 $g 0 2>&1 | tee "$OUT/model_kl_gemm$g.log"
        $B/bench_model_cuda devrun/cfg/k3_medium.json 16384 16 $g 0 2>&1 | tee "$OUT/model_k3_gemm$g.log"
    done
    if [ -f devrun/fla.tgz ]; then
        mkdir -p devrun/anchors && tar xzf devrun/fla.tgz -C devrun/anchors
        FLA_PATH=$PWD/devrun/anchors OUT=$OUT python3 devrun/cfg/side_device.py step devrun/cfg/kimi_linear_medium.json \
            16384 2>&1 | tail -8 | tee "$OUT/side_step.log"
    fi
    if [ -d devrun/run/data ]; then
        for g in fp32 bf16; do # the make-run schedule on the GPU (kda_chunk 64 there); CPU: validation loss 3.8518
            python3 - "$g" <<'PY'
import json, os, sys
c = json.load(open("configs/demo_run.json"))
r = os.path.abspath("devrun/run")
c.update(model=r + "/k3_tiny.json", tokenizer=r + "/tokenizer.tiktoken", kda_chunk=64,
         out_dir="/tmp/gpu_demo_" + sys.argv[1], data={k: r + "/data/" + k for k in c["data"]})
json.dump(c, open("/tmp/gpu_demo_%s.json" % sys.argv[1], "w"))
PY
            $B/k3c train --config /tmp/gpu_demo_$g.json --device cuda --gemm $g --quiet 2>&1 | tail -3 |
                tee "$OUT/demo_$g.log"
            grep -h '"val_loss"' /tmp/gpu_demo_$g/metrics.jsonl | tail -1 | tee -a "$OUT/demo_$g.log"
        done
    fi
fi
exit $status
