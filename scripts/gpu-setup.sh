# shellcheck shell=bash
# Sourced by the scripts that need a GPU (gpu-check, gpu-sanitize), from the
# repository's root, with $logs naming their log folder: the packed Debian
# packages on the search paths, the environment of a GPU run, the GPU held
# open where persistence mode is off, NCCL found, and build/build_step for an
# sm_90 build. Defines summary, failed and note for the caller's report.
# Criterion, cJSON and Fashion-MNIST come packed (pack-deps); without them on
# the search paths the build fails and nothing else can run.
if [ -f .devdeps/activate ] &&
    [[ ":${LIBRARY_PATH:-}:" != *":/opt/devdeps/usr/lib/x86_64-linux-gnu:"* ]]; then
    # shellcheck disable=SC1091
    source .devdeps/activate
fi
mkdir -p "${logs:?the caller names its log folder}"
export CASTOR_SKIP_DEPS=1  # the GPU machine cannot apt-get; pack-deps brought them
export CASTOR_FASHION_MNIST=${CASTOR_FASHION_MNIST:-/opt/devdeps/usr/share/datasets/fashion-mnist}
[ -d "$CASTOR_FASHION_MNIST" ] || export CASTOR_FASHION_MNIST=/usr/share/datasets/fashion-mnist
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}  # an NCCL failure then says why
jobs=$(nproc)
summary=()
failed=()  # what failed, for the last line and the exit status
note() { summary+=("$*"); echo "== $*"; }

# Each step has its own time limit, so that one that hangs (a stuck stream,
# a collective waiting for a peer) costs its own time and not the rest of the
# device call.
limit() { timeout -k 10 "$@"; }

# The GPU as the driver sets it up. Without persistence mode every process
# that opens the GPU pays the driver's start (seconds), and the GPU tests
# start a process per test; a process that holds the GPU open for the whole
# run keeps the driver up. Only in the default compute mode: in an exclusive
# one it would lock every test out of the GPU.
nvidia-smi --query-gpu=name,driver_version,persistence_mode,compute_mode,memory.total \
    --format=csv >"$logs/gpu.txt" 2>&1
cat "$logs/gpu.txt"
holder=
if grep -q ', Disabled, Default,' "$logs/gpu.txt"; then
    python3 -c 'import ctypes, sys, time; ctypes.CDLL(sys.argv[1]).cudaFree(None); time.sleep(3600)' \
        "${CUDA_HOME:-/usr/local/cuda}/lib64/libcudart.so" >/dev/null 2>&1 &
    holder=$!
    note "persistence mode off: a background process holds the GPU open (pid $holder)"
fi
trap '[ -n "$holder" ] && kill "$holder" 2>/dev/null' EXIT

# NCCL: the CUDA backend includes <nccl.h> and links -lnccl. Where the
# compiler finds no nccl.h (NCCL only as PyTorch's wheel, nvidia-nccl-cu13,
# which has no unversioned libnccl.so either), the build and the runs use the
# wheel's copy instead of failing the build and with it the whole run.
cuda_inc="${CUDA_HOME:-/usr/local/cuda}/include"
if ! echo '#include <nccl.h>' | "${CC:-cc}" -E -x c - -I"$cuda_inc" >/dev/null 2>&1; then
    wheel=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
    if [ -n "$wheel" ] && [ -f "$wheel/include/nccl.h" ] && [ -f "$wheel/lib/libnccl.so.2" ]; then
        mkdir -p build/nccl-wheel
        ln -sf "$wheel/lib/libnccl.so.2" build/nccl-wheel/libnccl.so
        export CPATH="$wheel/include${CPATH:+:$CPATH}"
        export LIBRARY_PATH="$PWD/build/nccl-wheel${LIBRARY_PATH:+:$LIBRARY_PATH}"
        export LD_LIBRARY_PATH="$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        note "NCCL: no nccl.h on the compiler's paths; using the Python wheel's in $wheel"
    else
        note "NCCL: no nccl.h on the compiler's paths and no nvidia-nccl wheel: the build will fail"
    fi
fi

# sm_90 only: the fat binary for every architecture takes long to build. A
# build that fails only on a warning (a newer compiler than CI's) is retried
# without -Werror, so the GPU work still runs; the warning is reported.
arch=${CUDA_ARCHS:-"-gencode arch=compute_90,code=sm_90"}
nowerror=()  # WERROR= once a step has needed it, so later steps do not rebuild with it
build() { make -j"$jobs" USE_CUDA=1 CUDA_ARCHS="$arch" ${nowerror[@]+"${nowerror[@]}"} "$@"; }
# build_step LOG TARGET...: status 0 once the targets are built, if need be
# without -Werror (then reported as a failure); the output goes to $logs/LOG.log.
build_step() {
    local log=$1; shift
    build "$@" >"$logs/$log.log" 2>&1 && return 0
    grep -q 'Werror\|\[-W' "$logs/$log.log" &&
        build WERROR= "$@" >"$logs/$log-nowerror.log" 2>&1 || return 1
    nowerror=(WERROR=)
    note "$log: FAILED with -Werror, built without it (warnings in $log.log):"
    grep -E 'warning|error' "$logs/$log.log" | head -20
    failed+=("the build with -Werror ($log.log)")
}
