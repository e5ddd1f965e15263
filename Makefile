# castor: make (library + CLI), make check, make demo, make bench,
# make check-gpu, make check-sanitize, make check-gpu-sanitize, make fuzz, make install,
# make uninstall.
#
# Every tool and path can be overridden: make CC=clang CUDA_HOME=/opt/cuda.
# CUDA is built whenever nvcc is found; NO_CUDA=1 opts out, USE_CUDA=1 makes
# a missing nvcc an error.

CC        ?= gcc
BUILD     ?= build
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(shell command -v nvcc 2>/dev/null || { test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc; })
PKG_CONFIG ?= pkg-config
# Machine code for sm_75 through sm_90 (CUDA 13 supports nothing older) plus
# PTX for newer GPUs.
CUDA_ARCHS ?= -gencode arch=compute_75,code=sm_75 -gencode arch=compute_80,code=sm_80 \
              -gencode arch=compute_86,code=sm_86 -gencode arch=compute_89,code=sm_89 \
              -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
OPT       ?= -O2
SANITIZE  ?=

# make install: the GNU directory variables, and DESTDIR for staging (a
# package build); castor.pc names the final PREFIX, not DESTDIR.
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
INSTALL    ?= install
# The library's version is the header's; the soname carries the major number
# only, because the API grows by new functions and never changes a published
# signature (include/castor.h), so every 0.x library serves a 0.x program.
VERSION   := $(shell sed -n 's/^\#define CASTOR_VERSION_STRING "\(.*\)"$$/\1/p' include/castor.h)
SOVERSION := $(firstword $(subst ., ,$(VERSION)))
SONAME     = libcastor.so.$(SOVERSION)

# Without pkg-config, Debian's and Ubuntu's pthread OpenBLAS headers by path:
# the <cblas.h> of another BLAS lacks openblas_set_num_threads.
BLAS_CFLAGS ?= $(shell $(PKG_CONFIG) --cflags openblas 2>/dev/null || \
                 { d=/usr/include/$$(gcc -print-multiarch 2>/dev/null)/openblas-pthread; \
                   test -d "$$d" && echo "-I$$d"; })
BLAS_LIBS   ?= $(shell $(PKG_CONFIG) --libs openblas 2>/dev/null || echo -lopenblas)
CJSON_CFLAGS ?= $(shell $(PKG_CONFIG) --cflags libcjson 2>/dev/null)
CJSON_LIBS   ?= $(shell $(PKG_CONFIG) --libs libcjson 2>/dev/null || echo -lcjson)

# WERROR= turns warnings back into warnings (scripts/gpu-check retries so
# on a machine whose newer compiler warns where ours does not).
WERROR  ?= -Werror
comma   := ,
WARN    = -Wall -Wextra $(WERROR) -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wvla
CFLAGS  ?= $(OPT) -g -fno-math-errno
ALL_CFLAGS = -std=c11 -D_GNU_SOURCE -DCASTOR_BUILDING $(WARN) $(CFLAGS) $(SANITIZE) \
             -fPIC -fvisibility=hidden -pthread -MMD -MP \
             -Iinclude -I. $(BLAS_CFLAGS) $(CJSON_CFLAGS)
LDLIBS  = $(BLAS_LIBS) $(CJSON_LIBS) -lz -lm -pthread

ifeq ($(NO_CUDA),1)
  NVCC :=
endif
ifeq ($(USE_CUDA),1)
  ifeq ($(NVCC),)
    $(error USE_CUDA=1 but nvcc was not found (set NVCC= or CUDA_HOME=))
  endif
endif

LIB_SRC  = $(wildcard src/*.c) $(wildcard host/*.c) $(wildcard device/*.c) $(wildcard device/cpu/*.c)
ifneq ($(NVCC),)
  HAVE_CUDA = 1
  LIB_SRC  += $(wildcard device/cuda/*.c)
  CU_SRC    = $(wildcard device/cuda/*.cu)
  ALL_CFLAGS += -DCASTOR_HAVE_CUDA=1 -I$(CUDA_HOME)/include
  NVCCFLAGS ?= -O2 -std=c++17 $(CUDA_ARCHS) -Xcompiler -fPIC,-fvisibility=hidden,-Wall$(if $(WERROR),$(comma)$(WERROR)) \
               -DCASTOR_BUILDING -DCASTOR_HAVE_CUDA=1 -Iinclude -I.
  LDLIBS   += -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -lcublas -lcudart -lnccl -lstdc++ \
              -Wl,-rpath,$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib
else
  HAVE_CUDA = 0
  LIB_SRC  += device/cuda_none.c
  CU_SRC    =
endif
LIB_SRC := $(filter-out device/cuda_none.c,$(LIB_SRC)) $(if $(filter 0,$(HAVE_CUDA)),device/cuda_none.c)

CLI_SRC  = $(wildcard src/cli/*.c) $(wildcard bench/*.c)
TEST_SRC = $(wildcard tests/test_*.c)
GPU_TEST_SRC = $(wildcard tests/gpu/test_*.c)

LIB_OBJ  = $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.cu.o)
CLI_OBJ  = $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
# bench/ is part of the castor program: main.c dispatches "castor bench" to it.
$(CLI_OBJ): ALL_CFLAGS += -DCASTOR_HAVE_BENCH
TEST_OBJ = $(TEST_SRC:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/tests/support.o \
           $(BUILD)/obj/tests/checkpoint_support.o $(BUILD)/obj/tests/cpu_device_support.o \
           $(BUILD)/obj/tests/fault_support.o $(BUILD)/obj/tests/fault_inject.o \
           $(BUILD)/obj/tests/numerics_support.o
GPU_TEST_OBJ = $(GPU_TEST_SRC:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/tests/support.o \
               $(BUILD)/obj/tests/gpu/gpu_support.o
# The allocation-failure sweeps (tests/alloc/) are a binary of their own:
# linked with --wrap for each allocation function castor calls, so that the
# calls of castor's objects (and the tests') reach tests/alloc/alloc_fail.c,
# which can make any one of them fail; those of OpenBLAS, zlib, cJSON, libc
# and Criterion (shared libraries) do not. tests/alloc/allocators.sh fails
# when castor calls an allocation function missing from this list.
ALLOC_WRAP = malloc calloc realloc free posix_memalign aligned_alloc strdup
# The threads castor starts are failed alike (tests/alloc/thread_fail.h).
THREAD_WRAP = pthread_create
ALLOC_TEST_SRC = $(wildcard tests/alloc/*.c)
ALLOC_TEST_OBJ = $(ALLOC_TEST_SRC:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/tests/support.o

.PHONY: all lib cli check check-gpu check-gpu-sanitize gpu-asan-tests check-sanitize demo bench \
        fuzz clean deps deps-check info-build install uninstall
SHELL := /bin/bash

all: info-build lib cli

info-build:
	@echo "castor build: CUDA $(if $(filter 1,$(HAVE_CUDA)),✓ ($(NVCC)),✗ (no nvcc; NO_CUDA=$(NO_CUDA)))"

lib: $(BUILD)/libcastor.a $(BUILD)/libcastor.so
cli: $(BUILD)/castor

$(BUILD)/libcastor.a: $(LIB_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

# The Makefile is a prerequisite so that a build from before the soname (or
# any other change to this link) is linked again.
$(BUILD)/libcastor.so: $(LIB_OBJ) Makefile
	@mkdir -p $(@D)
	$(CC) -shared -Wl,-soname,$(SONAME) -o $@ $(LIB_OBJ) $(SANITIZE) $(LDLIBS)
	@# A program linked with -L$(BUILD) -lcastor asks for the soname.
	ln -sf libcastor.so $(BUILD)/$(SONAME)

$(BUILD)/castor: $(CLI_OBJ) $(BUILD)/libcastor.a
	$(CC) -o $@ $(CLI_OBJ) $(BUILD)/libcastor.a $(SANITIZE) $(LDLIBS)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

# Dependency files for the .cu objects, as ALL_CFLAGS has for the C ones: nvcc
# writes $(@:.o=.d) beside the object, where the -include at the end finds it.
# Kept out of NVCCFLAGS so that overriding NVCCFLAGS keeps them.
NVCC_DEPFLAGS = -MMD -MP -MF $(@:.o=.d)

# The nvcc flags (the arch list among them) the .cu objects were built with;
# rewritten only when they differ, so that a new CUDA_ARCHS (or NVCCFLAGS)
# rebuilds the .cu objects and an unchanged one rebuilds nothing.
# Written while the Makefile is read, not by a rule: a rule would need a
# phony prerequisite, and `make -q`/`make -n` would then always call the .cu
# objects out of date.
CUDA_FLAGS_STAMP = $(BUILD)/cuda-flags
ifneq ($(NVCC),)
  $(shell mkdir -p $(BUILD) && \
      { printf '%s\n' '$(NVCC) $(NVCCFLAGS) $(NVCC_SANITIZE)' | cmp -s - $(CUDA_FLAGS_STAMP) || \
      printf '%s\n' '$(NVCC) $(NVCCFLAGS) $(NVCC_SANITIZE)' > $(CUDA_FLAGS_STAMP); })
endif

# SANITIZE for the host code of the .cu files: nvcc hands the host compiler
# -Xcompiler's argument split at commas, so -fsanitize=address,undefined goes
# as -fsanitize=address and -fsanitize=undefined, each behind its -Xcompiler.
# Kept out of NVCCFLAGS so that overriding NVCCFLAGS keeps it.
nvcc_host_flag = $(if $(findstring $(comma),$1),$(addprefix $(firstword $(subst =, ,$1))=,\
                     $(subst $(comma), ,$(patsubst $(firstword $(subst =, ,$1))=%,%,$1))),$1)
NVCC_SANITIZE = $(foreach f,$(SANITIZE),$(foreach g,$(call nvcc_host_flag,$f),-Xcompiler $g))

$(BUILD)/obj/%.cu.o: %.cu $(CUDA_FLAGS_STAMP)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(NVCC_SANITIZE) $(NVCC_DEPFLAGS) -c $< -o $@

# ---- install ----
# The program, the header, both libraries (the shared one as
# libcastor.so.VERSION with the soname and development links beside it) and
# castor.pc: `pkg-config --cflags --libs castor` builds a program against
# the shared library; --static adds what the static one needs (LDLIBS).
# A directory under PREFIX is written as ${prefix}/..., so that pkg-config's
# --define-prefix can move the installed tree.
under_prefix = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))
install: lib cli
	$(INSTALL) -d "$(DESTDIR)$(BINDIR)" "$(DESTDIR)$(LIBDIR)" "$(DESTDIR)$(INCLUDEDIR)" \
	    "$(DESTDIR)$(PKGCONFIGDIR)"
	$(INSTALL) -m 755 $(BUILD)/castor "$(DESTDIR)$(BINDIR)/castor"
	$(INSTALL) -m 644 include/castor.h "$(DESTDIR)$(INCLUDEDIR)/castor.h"
	$(INSTALL) -m 644 $(BUILD)/libcastor.a "$(DESTDIR)$(LIBDIR)/libcastor.a"
	$(INSTALL) -m 755 $(BUILD)/libcastor.so "$(DESTDIR)$(LIBDIR)/libcastor.so.$(VERSION)"
	ln -sf libcastor.so.$(VERSION) "$(DESTDIR)$(LIBDIR)/$(SONAME)"
	ln -sf $(SONAME) "$(DESTDIR)$(LIBDIR)/libcastor.so"
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(call under_prefix,$(LIBDIR))' \
	    'includedir=$(call under_prefix,$(INCLUDEDIR))' '' \
	    'Name: castor' \
	    'Description: neural network training with central storage (C library)' \
	    'Version: $(VERSION)' 'Cflags: -I$${includedir}' 'Libs: -L$${libdir} -lcastor' \
	    'Libs.private: $(LDLIBS)' > "$(DESTDIR)$(PKGCONFIGDIR)/castor.pc"
	chmod 644 "$(DESTDIR)$(PKGCONFIGDIR)/castor.pc"

uninstall:
	rm -f "$(DESTDIR)$(BINDIR)/castor" "$(DESTDIR)$(INCLUDEDIR)/castor.h" \
	    "$(DESTDIR)$(LIBDIR)/libcastor.a" "$(DESTDIR)$(LIBDIR)/libcastor.so.$(VERSION)" \
	    "$(DESTDIR)$(LIBDIR)/$(SONAME)" "$(DESTDIR)$(LIBDIR)/libcastor.so" \
	    "$(DESTDIR)$(PKGCONFIGDIR)/castor.pc"

# ---- tests ----
# The bench's bound and byte counts (bench/bound.c) are tested as functions
# (tests/test_bench_bound.c) at placements this machine cannot open: the
# program's objects, less its main, link into the suite.
TEST_CLI_OBJ = $(filter-out $(BUILD)/obj/src/cli/main.o,$(CLI_OBJ))
$(BUILD)/castor-tests: $(TEST_OBJ) $(TEST_CLI_OBJ) $(BUILD)/libcastor.a
	$(CC) -o $@ $(TEST_OBJ) $(TEST_CLI_OBJ) $(BUILD)/libcastor.a $(SANITIZE) -lcriterion $(LDLIBS)

$(BUILD)/castor-alloc-tests: $(ALLOC_TEST_OBJ) $(BUILD)/libcastor.a
	$(CC) -o $@ $(ALLOC_TEST_OBJ) $(BUILD)/libcastor.a $(SANITIZE) \
	    $(ALLOC_WRAP:%=-Wl,--wrap=%) $(THREAD_WRAP:%=-Wl,--wrap=%) -lcriterion $(LDLIBS)

$(BUILD)/castor-gpu-tests: $(GPU_TEST_OBJ) $(BUILD)/libcastor.a
	$(CC) -o $@ $(GPU_TEST_OBJ) $(BUILD)/libcastor.a $(SANITIZE) -lcriterion $(LDLIBS)

# Criterion runs each test in its own process, as many at once as there are
# cores; make check CRITERION_FLAGS=--jobs=1 runs them one at a time.
CRITERION_FLAGS ?= --jobs=$(shell nproc 2>/dev/null || echo 2)

check: deps-check $(BUILD)/castor-tests $(BUILD)/castor-alloc-tests $(BUILD)/castor \
       $(BUILD)/readme-example lib
	# Criterion runs tests side by side; one OpenBLAS thread each keeps them off each other.
	OPENBLAS_NUM_THREADS=1 $(BUILD)/castor-tests $(CRITERION_FLAGS)
	OPENBLAS_NUM_THREADS=1 $(BUILD)/castor-alloc-tests $(CRITERION_FLAGS)
	bash tests/alloc/allocators.sh $(BUILD)/libcastor.a $(ALLOC_WRAP)
	bash tests/symbols.sh $(BUILD)/libcastor.a
	bash tests/cuda_sanitize_flags.sh
	bash tests/install_test.sh $(BUILD)
	bash tests/cli_test.sh $(BUILD)/castor
	bash tests/bench_smoke.sh $(BUILD)/castor

# The C program in README.md must keep compiling against the API it shows.
$(BUILD)/readme-example: README.md $(BUILD)/libcastor.a
	sed -n '/^```c$$/,/^```$$/p' README.md | sed '1d;$$d' > $(BUILD)/readme-example.c
	$(CC) -std=c11 -Wall -Wextra -Werror -Iinclude $(BUILD)/readme-example.c \
	    $(BUILD)/libcastor.a $(SANITIZE) $(LDLIBS) -o $@

check-gpu: deps-check $(BUILD)/castor-gpu-tests $(BUILD)/castor
	$(BUILD)/castor-gpu-tests $(CRITERION_FLAGS)

demo: deps-check $(BUILD)/castor
	$(BUILD)/castor train --data fashion-mnist --layers 128:relu,10 --optimizer adam \
	    --epochs 10 --batch 256 --strategy central --devices cpu:2 --seed 1 --json

bench: deps-check $(BUILD)/castor
	$(BUILD)/castor bench $(BENCH_ARGS)

# ---- sanitizers ----
# The CUDA backend cannot run without a GPU, so sanitizer builds leave it out.
ASAN_FLAGS = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
# malloc_context_size=2: an allocation's stack is malloc and its caller, so the
# one suppression (tests/lsan.supp: Criterion's runner, which calls malloc
# itself) matches only allocations made in libcriterion. With whole stacks it
# matched every leak, since every test runs below libcriterion's frames. To
# see a leak's or a heap error's whole stack, rerun it with a larger size.
ASAN_OPTS = detect_leaks=1:abort_on_error=1:malloc_context_size=2
SAN_OTHER_ENV = UBSAN_OPTIONS=print_stacktrace=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp
ASAN_ENV = ASAN_OPTIONS=$(ASAN_OPTS) $(SAN_OTHER_ENV)
check-sanitize: deps-check
	$(MAKE) --no-print-directory BUILD=$(BUILD)/asan NO_CUDA=1 OPT=-O1 SANITIZE="$(ASAN_FLAGS)" \
	    $(BUILD)/asan/castor-tests $(BUILD)/asan/castor-alloc-tests
	$(ASAN_ENV) $(BUILD)/asan/castor-tests $(CRITERION_FLAGS)
	$(ASAN_ENV) OPENBLAS_NUM_THREADS=1 $(BUILD)/asan/castor-alloc-tests $(CRITERION_FLAGS)
	$(MAKE) --no-print-directory BUILD=$(BUILD)/tsan NO_CUDA=1 OPT=-O1 SANITIZE=-fsanitize=thread \
	    $(BUILD)/tsan/castor-tsan-tests
	OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 $(BUILD)/tsan/castor-tsan-tests

# The CUDA backend's host side (the .cu files' host code: NVCC_SANITIZE) and
# the library around it under ASan and UBSan, on a machine with a GPU;
# without one the GPU tests skip as in check-gpu. protect_shadow_gap=0: the
# CUDA driver maps memory where ASan keeps its shadow gap. Device memory
# errors are compute-sanitizer's (scripts/gpu-sanitize, which runs this too).
gpu-asan-tests: deps-check
	$(MAKE) --no-print-directory BUILD=$(BUILD)/asan-cuda OPT=-O1 SANITIZE="$(ASAN_FLAGS)" \
	    $(BUILD)/asan-cuda/castor-gpu-tests
check-gpu-sanitize: gpu-asan-tests
	ASAN_OPTIONS=$(ASAN_OPTS):protect_shadow_gap=0 $(SAN_OTHER_ENV) \
	    $(BUILD)/asan-cuda/castor-gpu-tests $(CRITERION_FLAGS)

# The threaded paths under TSan (tests/tsan/main.c says what they are), a
# plain program: Criterion's runner cannot start under TSan. It injects
# device faults with the Criterion suites' own code (tests/fault_inject.c).
TSAN_TEST_SRC = $(wildcard tests/tsan/*.c) tests/fault_inject.c
$(BUILD)/castor-tsan-tests: $(TSAN_TEST_SRC:%.c=$(BUILD)/obj/%.o) $(BUILD)/libcastor.a
	$(CC) -o $@ $^ $(SANITIZE) $(LDLIBS)

# ---- fuzzing (clang + libFuzzer, with ASan and UBSan) ----
FUZZ_SECONDS ?= 60
FUZZERS = idx safetensors checkpoint layers devices api
FUZZ_BUILD = $(BUILD)/fuzz
# A harness X is tests/fuzz/fuzz_X.c (its entry points) and, where a harness
# is too big for one file, the files of tests/fuzz/X/ beside it.
fuzz: deps-check
	$(MAKE) --no-print-directory CC=clang BUILD=$(FUZZ_BUILD) NO_CUDA=1 OPT=-O1 \
	    SANITIZE="-fsanitize=fuzzer-no-link,address,undefined" $(FUZZ_BUILD)/libcastor.a
	@# Every harness runs even when one finds a crash; the target fails at the end.
	@failed=""; for f in $(FUZZERS); do \
	    src=tests/fuzz/fuzz_$$f.c; \
	    if [ -d tests/fuzz/$$f ]; then src="$$src $$(echo tests/fuzz/$$f/*.c)"; fi; \
	    clang -g -O1 -fsanitize=fuzzer,address,undefined -Wall -Wextra $(WERROR) \
	        -Wmissing-prototypes -Iinclude -I. $(CJSON_CFLAGS) \
	        $$src $(FUZZ_BUILD)/libcastor.a $(LDLIBS) -o $(FUZZ_BUILD)/fuzz_$$f \
	        || exit 1; \
	    rm -rf $(FUZZ_BUILD)/corpus_$$f; cp -r tests/fuzz/corpus/$$f $(FUZZ_BUILD)/corpus_$$f; \
	    echo "fuzz_$$f: $(FUZZ_SECONDS) s"; \
	    $(FUZZ_BUILD)/fuzz_$$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	        -artifact_prefix=$(FUZZ_BUILD)/crash_$$f- $(FUZZ_BUILD)/corpus_$$f 2>&1 \
	        | grep -E 'stat::number_of_executed_units|ERROR|SUMMARY|Done' ; \
	    test $${PIPESTATUS[0]} -eq 0 || failed="$$failed fuzz_$$f"; \
	done; \
	if [ -n "$$failed" ]; then echo "make fuzz: crashes in$$failed (inputs in $(FUZZ_BUILD)/crash_*)"; exit 1; fi

deps-check:
	@bash scripts/install-deps --check-or-install

deps:
	bash scripts/install-deps

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
