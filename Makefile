# k3c — build: `make` (CPU library + CLI), `make cuda` (nvcc, sm_90), `make cuda-tests` (the CUDA test and benchmark
# programs), `make test`, `make test-asan`, `make run` (train the tiny K3 model on a real corpus, then generate),
# `make fuzz` (libFuzzer targets in fuzz/, each run FUZZ_SECONDS), `make nccl` (the NCCL communicator and its test).
# Sources are found by wildcard: add a file, not a rule.
CC      ?= gcc
NVCC    ?= nvcc
BUILD   ?= build
OPT     ?= -O2 -march=x86-64-v3
SAN     ?=
CFLAGS  := -std=c11 $(OPT) $(SAN) -g -fopenmp -Wall -Wextra -Wpointer-arith -Werror -Wno-unused-parameter -D_GNU_SOURCE \
           -Iinclude -Isrc -I/usr/include/x86_64-linux-gnu/openblas-openmp -MMD -MP $(EXTRA_CFLAGS)
OPENBLAS_LIB := /usr/lib/x86_64-linux-gnu/openblas-openmp
LDLIBS  := -L$(OPENBLAS_LIB) -Wl,-rpath,$(OPENBLAS_LIB) -lopenblas -lmicrohttpd -lpng -ljpeg -lseccomp -lm -lpthread $(EXTRA_LDLIBS)
LDFLAGS := -fopenmp $(SAN)
# MPI (src/parallel/comm_mpi.c only): include and link flags from OpenMPI's wrapper or pkg-config, so the library builds
# with the plain compiler; `make K3C_MPI=0` (or no MPI installed) builds the communicator without it.
K3C_MPI ?= $(if $(shell command -v mpicc 2>/dev/null || pkg-config --exists ompi-c 2>/dev/null && echo y),1,0)
ifeq ($(K3C_MPI),1)
MPI_CFLAGS := -DK3C_MPI $(shell mpicc --showme:compile 2>/dev/null || pkg-config --cflags ompi-c)
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null || pkg-config --libs ompi-c)
LDLIBS     += $(MPI_LIBS)
endif

# Library sources: every .c under src/ except the CLI. Files that include base/real.h are compiled twice (float, double).
LIB_SRC  := $(filter-out src/cli/%,$(shell find src -name '*.c' | LC_ALL=C sort))
REAL_SRC := $(shell grep -l '^\#include "base/real.h"' $(LIB_SRC) 2>/dev/null)
ONE_SRC  := $(filter-out $(REAL_SRC),$(LIB_SRC))
CLI_SRC  := $(shell find src/cli -name '*.c' | LC_ALL=C sort)
TEST_SRC := $(shell find tests -name 'test_*.c' | LC_ALL=C sort)
TEST_BIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
BENCH_SRC:= $(shell find bench -name '*.c' 2>/dev/null | LC_ALL=C sort)

LIB_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(ONE_SRC)) \
           $(patsubst %.c,$(BUILD)/obj/%.f32.o,$(REAL_SRC)) $(patsubst %.c,$(BUILD)/obj/%.f64.o,$(REAL_SRC))
CLI_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(CLI_SRC))
LIB     := $(BUILD)/libk3c.a

.PHONY: all setup test test-asan cuda cuda-tests nccl run post vision-demo ablate bench clean fuzz fuzz-build
all: $(LIB) k3c

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@
$(BUILD)/obj/src/parallel/comm_mpi.o: CFLAGS += $(MPI_CFLAGS)
$(BUILD)/obj/%.f32.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DK3C_REAL_DOUBLE=0 -c $< -o $@
$(BUILD)/obj/%.f64.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DK3C_REAL_DOUBLE=1 -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/k3c: $(CLI_OBJ) $(LIB) $(EXTRA_DEPS)
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(LIB) $(LDLIBS)
k3c: $(BUILD)/k3c
	cp $< $@

$(BUILD)/tests/%: tests/%.c $(LIB) tests/test.h $(EXTRA_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DK3C_REAL_DOUBLE=1 -Itests $< -o $@ $(LIB) $(LDFLAGS) $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DK3C_REAL_DOUBLE=0 $< -o $@ $(LIB) $(LDFLAGS) $(LDLIBS)

setup:
	@bash tools/setup.sh

# Tests print "N passed, N failed"; tools/run_tests.sh runs them all and sums (last line is the total).
test: setup
	@$(MAKE) --no-print-directory all $(TEST_BIN)
	@bash tools/run_tests.sh $(BUILD) $(TEST_BIN)

test-asan: setup
	@$(MAKE) --no-print-directory BUILD=build/asan OPT="-O1 -fno-omit-frame-pointer" \
	    SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined" build/asan/libk3c.a build/asan/k3c \
	    $(patsubst $(BUILD)/%,build/asan/%,$(TEST_BIN))
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 K3C_K3C_BIN=build/asan/k3c \
	    bash tools/run_tests.sh build/asan $(patsubst $(BUILD)/%,build/asan/%,$(TEST_BIN))

bench: all $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))

# ---------------------------------------------------------------- fuzzing (clang, libFuzzer + ASan + UBSan)
# The library is rebuilt with clang and the sanitizers in build/fuzz; each fuzz/fuzz_NAME.c becomes build/fuzz/bin/
# fuzz_NAME; tools/fuzz.sh seeds build/fuzz/corpus/NAME from the golden data and configs, runs every target for
# FUZZ_SECONDS and prints the executions per target (a crash stops the run and leaves its input in build/fuzz/crashes).
FUZZ_SECONDS ?= 600
FUZZ_SRC := $(shell find fuzz -name 'fuzz_*.c' 2>/dev/null | LC_ALL=C sort)
FUZZ_BIN := $(patsubst fuzz/%.c,build/fuzz/bin/%,$(FUZZ_SRC))
build/fuzz/bin/%: fuzz/%.c fuzz/fuzz.h build/fuzz/libk3c.a
	@mkdir -p $(dir $@)
	clang -std=c11 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fopenmp -D_GNU_SOURCE \
	    -DK3C_REAL_DOUBLE=0 -Iinclude -Isrc $< -o $@ build/fuzz/libk3c.a $(LDLIBS)
fuzz-build:
	@$(MAKE) --no-print-directory BUILD=build/fuzz CC=clang OPT="-O1 -fno-omit-frame-pointer" EXTRA_CFLAGS=-Wno-error \
	    SAN="-fsanitize=fuzzer-no-link,address,undefined" build/fuzz/libk3c.a $(FUZZ_BIN)
fuzz: fuzz-build
	@bash tools/fuzz.sh $(FUZZ_SECONDS) $(FUZZ_BIN)

# ---------------------------------------------------------------- CUDA (compiles without a GPU)
CU_SRC  := $(shell find src/cuda -name '*.cu' 2>/dev/null | LC_ALL=C sort)
CU_OBJ  := $(patsubst %.cu,build/cuda/obj/%.o,$(CU_SRC))
NVFLAGS := -O3 -std=c++17 -Iinclude -Isrc -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=sm_90 \
           -Xcompiler -Wall,-Wextra,-Wno-unused-parameter,-fopenmp -lineinfo
CUDA_HOME ?= /usr/local/cuda
build/cuda/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -c $< -o $@
-include $(CU_OBJ:.o=.d)
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lstdc++
CUDA_MAKE = $(MAKE) --no-print-directory BUILD=build/cuda K3C_MPI=0 EXTRA_CFLAGS="-DK3C_CUDA -I$(CUDA_HOME)/include" \
	    EXTRA_DEPS="$(CU_OBJ)" EXTRA_LDLIBS="$(CU_OBJ) build/cuda/libk3c.a $(CUDA_LIBS)"
cuda:
	@+$(CUDA_MAKE) $(CU_OBJ) build/cuda/k3c

# The CUDA test and benchmark programs, built here (no GPU needed) and run on the GPU machine (tools/device_cuda.sh):
# build/cuda/tests/test_backend_ops and test_backend_ops_decode (tests/test_backend_ops*.c with -DK3C_CUDA: the CUDA
# table and its decode entry against the CPU), build/cuda/tests/test_vision_data (vision training on the GPU),
# build/cuda/tests/cuda/* (the whole-program GPU tests) and build/cuda/bench/cuda/* (nvcc with the one NVFLAGS), all
# linking the objects of `make cuda`.
CU_PROG_SRC := $(shell find tests/cuda bench/cuda -name '*.cu' 2>/dev/null | LC_ALL=C sort)
CU_PROG_BIN := $(patsubst %.cu,build/cuda/%,$(CU_PROG_SRC))
CU_PROG_LIBS := build/cuda/libk3c.a -L$(OPENBLAS_LIB) -Xlinker -rpath,$(OPENBLAS_LIB) -lopenblas -lpng -ljpeg -lseccomp -lgomp -lpthread -lm \
	    $(CUDA_LIBS)
build/cuda/tests/cuda/%: build/cuda/obj/tests/cuda/%.o $(CU_OBJ) build/cuda/libk3c.a
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $< $(CU_OBJ) $(CU_PROG_LIBS) -o $@
build/cuda/bench/cuda/%: build/cuda/obj/bench/cuda/%.o $(CU_OBJ) build/cuda/libk3c.a
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $< $(CU_OBJ) $(CU_PROG_LIBS) -o $@
.SECONDARY: $(patsubst %.cu,build/cuda/obj/%.o,$(CU_PROG_SRC)) # kept: relinking must not recompile
cuda-tests: cuda
	@+$(CUDA_MAKE) build/cuda/tests/test_backend_ops build/cuda/tests/test_backend_ops_decode \
	    build/cuda/tests/test_vision_data $(CU_PROG_BIN)

# ---------------------------------------------------------------- NCCL (compiles without a GPU; not part of `make cuda`)
# The NCCL communicator (src/parallel/comm_nccl.cu) and its test build/nccl/test_comm_nccl, linked with the CPU library (MPI
# bootstraps the multi-rank case) and -lnccl: run it alone (one rank) or under mpirun with one GPU per rank.
# build/nccl/k3c and build/nccl/test_dist_nccl are the GPU build of `make cuda` with NCCL and MPI (the CPU build's
# comm_mpi.o, which bootstraps NCCL under mpirun): the GPU's parallel training step (docs/PARALLEL.md "Launch").
NCCL_HOME ?= $(CUDA_HOME)
NCCL_LIBS := -L$(NCCL_HOME)/lib64 -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lnccl -lcudart -lstdc++
NCCL_CUDA_LINK := $(BUILD)/obj/src/parallel/comm_mpi.o build/nccl/comm_nccl.o build/cuda/libk3c.a $(CU_OBJ) \
	    build/cuda/libk3c.a $(LDFLAGS) $(LDLIBS) $(CUDA_LIBS) $(NCCL_LIBS)
build/nccl/comm_nccl.o: src/parallel/comm_nccl.cu src/parallel/comm.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -I$(NCCL_HOME)/include -c $< -o $@
build/nccl/test_comm_nccl: tests/nccl/nccl_comm.c build/nccl/comm_nccl.o $(LIB) tests/test.h
	$(CC) $(CFLAGS) -DK3C_REAL_DOUBLE=1 -Itests -I$(CUDA_HOME)/include $< build/nccl/comm_nccl.o -o $@ $(LIB) $(LDFLAGS) \
	    $(LDLIBS) $(NCCL_LIBS)
build/nccl/test_dist_nccl: tests/nccl/dist_nccl.c build/nccl/comm_nccl.o $(BUILD)/obj/src/parallel/comm_mpi.o \
	    build/cuda/libk3c.a $(CU_OBJ) tests/test.h
	$(CC) $(CFLAGS) -DK3C_CUDA -DK3C_REAL_DOUBLE=1 -Itests -I$(CUDA_HOME)/include $< -o $@ $(NCCL_CUDA_LINK)
NCCL_CLI_OBJ := $(patsubst %.c,build/cuda/obj/%.o,$(CLI_SRC))
build/nccl/k3c: build/nccl/comm_nccl.o $(BUILD)/obj/src/parallel/comm_mpi.o build/cuda/libk3c.a $(CU_OBJ) $(NCCL_CLI_OBJ)
	$(CC) -o $@ $(NCCL_CLI_OBJ) $(NCCL_CUDA_LINK)
nccl: $(LIB) build/nccl/test_comm_nccl
	@+$(CUDA_MAKE) $(CU_OBJ) build/cuda/k3c
	@+$(MAKE) --no-print-directory build/nccl/k3c build/nccl/test_dist_nccl

# ---------------------------------------------------------------- the main job
run: setup all
	@bash tools/run_demo.sh

post: setup all
	@bash tools/post_demo.sh

vision-demo: setup all
	@bash tools/vision_demo.sh

# The ablation demo on the CPU (docs/EXPERIMENTS.md): a grid of arms x seeds on the synthetic tasks, report + plots in
# runs/ablate/demo; resumable (a second `make ablate` reads the finished runs back).
ablate: all
	@bash tools/ablate_demo.sh

clean:
	rm -rf build k3c

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
