# Tutti top-level build.  `make help` lists the targets.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BUILD ?= build
CC ?= gcc
NVCC ?= nvcc
# -fvisibility=hidden: only what the public headers declare is exported (they say so with
# "#pragma GCC visibility push(default)"); libtutti/libtutti.map lists it for the linker.
CFLAGS_COMMON := -std=gnu11 -O2 -g -Wall -Wextra -Werror -fPIC -fvisibility=hidden -D_GNU_SOURCE \
	-Ilibtutti/include
# CFLAGS_EXTRA: appended to every C compile and link (ctest-asan sets the sanitizers).
CFLAGS_EXTRA ?=
CFLAGS_COMMON += $(CFLAGS_EXTRA)
LIB_MAP := libtutti/libtutti.map
LIBS := -luring -lxxhash -lpthread
# DEPS_ROOT: a folder with liburing/xxhash headers and static libraries
# unpacked from .debs, for machines where they cannot be installed (the H200:
# scripts/gpu/h200_deps.sh makes .h200/root).
DEPS_ROOT ?=
ifneq ($(DEPS_ROOT),)
CFLAGS_COMMON += -I$(DEPS_ROOT)/usr/include
LDFLAGS += -L$(DEPS_ROOT)/usr/lib/x86_64-linux-gnu -Xlinker -rpath=$(abspath $(DEPS_ROOT))/usr/lib/x86_64-linux-gnu
endif
NVFLAGS := -std=c++17 -arch=sm_90 -O2 -Xcompiler -fPIC,-fvisibility=hidden -Ilibtutti/include \
	-Xcompiler -Wall,-Werror -Werror all-warnings
GPU_SRCS := $(sort $(wildcard libtutti/src/gpu/*.cu))
GPU_OBJS := $(GPU_SRCS:%.cu=$(BUILD)/%.o)

LIB_SRCS := $(shell find libtutti/src -name '*.c' | sort)
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/%.o)
CTESTS := $(basename $(notdir $(wildcard libtutti/tests/test_*.c)))
CU_SRCS := $(shell find libtutti benchmarks scripts -name '*.cu' | sort)

PHONY_GPU := gpu-lib
.PHONY: all help deps lib $(PHONY_GPU) ctest ctest-asan lint fuzz-build fuzz-ci fuzz fuzz-seeds cuda-check cuda-check-rest gpu-test gpu-bench venv vllm test test-vllm pytest bench bench-vllm demo hil clean

all: lib

help:
	@echo "make demo       main job: vLLM on CPU reloads a long prefix from a Tutti store (TTFT cold vs warm)"
	@echo "make test       C unit tests, CUDA compile/link + GPU tests (skip without a GPU), ruff + mypy, pytest incl. real vLLM"
	@echo "make hil        tutti.ko + guest suite on QEMU's emulated NVMe (Debian 6.1 and 6.12, TCG)"
	@echo "make bench      store benchmark: layer-wise retrieve vs fio and a naive reader"
	@echo "make bench-vllm TTFT benchmark: no connector vs ExampleConnector vs TuttiConnector"
	@echo "make lib        build/libtutti.a"
	@echo "make ctest      C unit tests (TAP, through prove) + the headers' examples compiled"
	@echo "make ctest-asan C unit tests built with ASan + UBSan (build/asan)"
	@echo "make fuzz-ci    each on-disk-format fuzzer for FUZZ_SECONDS (45) s (clang-14 + libFuzzer)"
	@echo "make fuzz       each fuzzer for FUZZ_RUNS (1000000) executions (docs/reliability.md)"
	@echo "make cuda-check compile every .cu file with nvcc (no GPU needed)"
	@echo "make gpu-lib    build/libtutti_gpu.so: store + GPU data paths for tutti.gpu (needs nvcc)"
	@echo "make gpu-test   build and run the GPU tests (needs a GPU; they skip without one)"
	@echo "make gpu-bench  gpu-test, then the GPU io_uring benchmark (results in build/gpu/out)"
	@echo "make venv       $(VENV) with the tutti package installed"
	@echo "make lint       ruff + mypy (pyproject.toml)"

deps:
	@scripts/bootstrap.sh deps

lib: $(BUILD)/libtutti.a

$(BUILD)/%.o: %.c $(wildcard libtutti/include/tutti/*.h) $(wildcard libtutti/src/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) -c $< -o $@

$(BUILD)/libtutti.a: $(LIB_OBJS)
	@mkdir -p $(BUILD)
	ar rcs $@ $^

$(BUILD)/%.o: %.cu $(wildcard libtutti/include/tutti/*.h) $(wildcard libtutti/src/gpu/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

# The whole library (store + GPU data paths) as one shared object, loaded by
# tutti.gpu (cffi ABI mode) next to PyTorch.
$(BUILD)/libtutti_gpu.so: $(GPU_OBJS) $(LIB_OBJS) $(LIB_MAP)
	$(NVCC) -shared -arch=sm_90 -cudart shared -o $@ $(GPU_OBJS) $(LIB_OBJS) \
	  -Xlinker --version-script=$(LIB_MAP) $(LDFLAGS) $(LIBS) -ldl

gpu-lib: $(BUILD)/libtutti_gpu.so

$(BUILD)/tests/%: libtutti/tests/%.c $(BUILD)/libtutti.a $(wildcard libtutti/tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $< -o $@ $(BUILD)/libtutti.a $(LDFLAGS) $(LIBS)

# The fault-model driver is its own file, so the HIL guests can build it with their own main.
$(BUILD)/tests/test_fault_model: libtutti/tests/test_fault_model.c libtutti/tests/fault_model.c \
		libtutti/tests/fault_model_check.c \
		$(BUILD)/libtutti.a $(wildcard libtutti/tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(filter %.c,$^) -o $@ $(BUILD)/libtutti.a $(LDFLAGS) $(LIBS)

# The public headers' usage examples (the code after "Example" in their comments), each
# compiled with the library's flags, so they cannot drift from the API.
HEADER_EXAMPLES := $(BUILD)/header-examples/compiled
$(HEADER_EXAMPLES): $(wildcard libtutti/include/tutti/*.h) scripts/header_examples.py
	@rm -rf $(dir $@) && $(PY) scripts/header_examples.py $(dir $@)
	@for f in $(dir $@)*.c; do echo "example $$(basename $$f)"; \
	  $(CC) $(CFLAGS_COMMON) -c $$f -o $${f%.c}.o || exit 1; done; touch $@

# Every C test program through the one TAP consumer (scripts/tap-run: prove): a missing or short
# plan fails, skips are reported as skips.  PROVE_FLAGS=-v shows every line.
PROVE_FLAGS ?= --failures --directives --timer
ctest: $(addprefix $(BUILD)/tests/,$(CTESTS)) $(HEADER_EXAMPLES)
	@if scripts/tap-run $(PROVE_FLAGS) $(addprefix $(BUILD)/tests/,$(CTESTS)); then \
	  echo "C unit tests: all passed"; else echo "C unit tests: FAILED"; exit 1; fi

# The C unit tests under AddressSanitizer + UndefinedBehaviorSanitizer (gcc's,
# no extra packages): any report fails the test binary, so the target fails.
SAN_FLAGS := -O1 -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
ctest-asan:
	@$(MAKE) --no-print-directory BUILD=$(BUILD)/asan CFLAGS_EXTRA="$(SAN_FLAGS)" ctest

# libFuzzer targets over everything that parses a store member (libtutti/fuzz,
# docs/reliability.md): the library and each target built with clang-14,
# ASan + UBSan and coverage; seeds in libtutti/fuzz/corpus/<target>.
CLANG ?= clang-14
FUZZ_BUILD := $(BUILD)/fuzz
FUZZ_TARGETS := $(basename $(notdir $(wildcard libtutti/fuzz/fuzz_*.c)))
FUZZ_CFLAGS := -std=gnu11 -O1 -g -Wall -Wextra -Werror -D_GNU_SOURCE -Ilibtutti/include \
  -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_LIB_OBJS := $(LIB_SRCS:%.c=$(FUZZ_BUILD)/%.o)
FUZZ_SECONDS ?= 45
FUZZ_RUNS ?= 1000000

$(FUZZ_BUILD)/%.o: %.c $(wildcard libtutti/include/tutti/*.h) $(wildcard libtutti/src/*/*.h)
	@mkdir -p $(dir $@)
	$(CLANG) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_BUILD)/fuzz_%: libtutti/fuzz/fuzz_%.c libtutti/fuzz/fuzz.h $(FUZZ_LIB_OBJS)
	$(CLANG) $(FUZZ_CFLAGS) -fsanitize=fuzzer $< $(FUZZ_LIB_OBJS) -o $@ $(LDFLAGS) $(LIBS)

.SECONDARY: $(FUZZ_LIB_OBJS)

fuzz-build:
	@scripts/bootstrap.sh fuzz
	@$(MAKE) --no-print-directory $(addprefix $(FUZZ_BUILD)/,$(FUZZ_TARGETS))

fuzz-ci: fuzz-build
	scripts/fuzz.sh --build $(FUZZ_BUILD) --jobs $$(nproc) --seconds $(FUZZ_SECONDS) $(FUZZ_TARGETS)

fuzz: fuzz-build
	scripts/fuzz.sh --build $(FUZZ_BUILD) --runs $(FUZZ_RUNS) $(FUZZ_TARGETS)

# Regenerate the seed corpus from freshly formatted stores (changes every
# seed: new uuids and times); crash regressions (regress-*) are kept.
fuzz-seeds: lib
	$(CC) $(CFLAGS_COMMON) libtutti/fuzz/make_seeds.c -o $(BUILD)/make_seeds $(BUILD)/libtutti.a $(LDFLAGS) $(LIBS)
	rm -f libtutti/fuzz/corpus/*/seed-*
	$(BUILD)/make_seeds libtutti/fuzz/corpus

# make test: gpu-test already compiles the library, the GPU tests and the benchmarks with the same
# warnings-as-errors flags, so only the other .cu files are compiled here a second time.
CUDA_CHECK_SRCS ?= $(CU_SRCS)
CU_REST := $(filter-out $(GPU_SRCS) libtutti/tests/test_gpu_%.cu libtutti/tests/hd_compile.cu benchmarks/%.cu,$(CU_SRCS))
cuda-check-rest:
	@$(MAKE) --no-print-directory cuda-check CUDA_CHECK_SRCS="$(CU_REST)"

cuda-check:
	@if ! command -v $(NVCC) >/dev/null; then echo "nvcc not found: CUDA compile check skipped"; exit 0; fi; \
	mkdir -p $(BUILD)/cuda; for f in $(CUDA_CHECK_SRCS); do \
	  echo "nvcc $$f"; \
	  $(NVCC) -std=c++17 -arch=sm_90 -Ilibtutti/include -Xcompiler -Wall,-Werror -Werror all-warnings \
	    -c $$f -o $(BUILD)/cuda/$$(basename $$f .cu).o || exit 1; done

gpu-test:
	@scripts/gpu/h200_run.sh --tests

gpu-bench:
	@scripts/gpu/h200_run.sh

venv:
	@scripts/bootstrap.sh venv

vllm:
	@scripts/bootstrap.sh vllm

# ruff (style, imports, likely bugs) and mypy (the package's types), configured in pyproject.toml.
lint: venv
	$(VENV)/bin/ruff check python tests scripts benchmarks
	$(VENV)/bin/mypy

pytest: venv
	$(VENV)/bin/python -m pytest -q tests

# gpu-test builds build/gpu/libtutti_gpu.so (nvcc): pytest uses it for GpuStore's host-memory
# path, so the vLLM worker's GPU-memory code runs here too, without a GPU.
TEST_GPU_LIB := $(abspath build/gpu/libtutti_gpu.so)

test: deps lib ctest ctest-asan fuzz-ci cuda-check-rest gpu-test venv lint vllm
	@if [ -z "$$TUTTI_GPU_LIB" ] && [ -f $(TEST_GPU_LIB) ]; then export TUTTI_GPU_LIB=$(TEST_GPU_LIB); fi; \
	echo "pytest: TUTTI_GPU_LIB=$${TUTTI_GPU_LIB:-(none: GpuStore tests skip)}"; \
	$(VENV)/bin/python -m pytest -q --durations=15 tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

test-vllm: vllm
	$(VENV)/bin/python -m pytest -q tests/vllm

demo: vllm
	$(VENV)/bin/python -m tutti.demo

bench-vllm: vllm
	$(VENV)/bin/python benchmarks/vllm_ttft.py

bench: deps venv
	$(VENV)/bin/tutti-admin bench --path $(BUILD)/bench/store.img --size 2GiB --prefix-tokens 8192 --runs 3

hil:
	scripts/hil/hil.sh

clean:
	rm -rf $(BUILD) python/tutti/_tutti*.so python/*.egg-info
