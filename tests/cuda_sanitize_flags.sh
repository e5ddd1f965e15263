#!/usr/bin/env bash
# make check-gpu-sanitize must instrument the host code of the CUDA backend's
# .cu files too: SANITIZE reaches nvcc's host compiler, each flag behind its
# own -Xcompiler (which splits at commas), and an object built so carries
# ASan's checks. Skipped where nvcc is missing (the .cu files are not built).
set -uo pipefail
nvcc_bin=$(make -s --no-print-directory --eval 'show-nvcc: ; @echo $(NVCC)' show-nvcc)
if [[ -z "$nvcc_bin" ]]; then
    echo "skip  no nvcc: this build has no .cu files to sanitize"
    exit 0
fi
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
obj=$build/obj/device/cuda/nccl.cu.o  # the smallest .cu file
sanitize="-fsanitize=address,undefined -fno-omit-frame-pointer"
cmd=$(make -n --no-print-directory BUILD="$build" SANITIZE="$sanitize" \
    CUDA_ARCHS="-gencode arch=compute_90,code=sm_90" "$obj" | grep -- '-c device/cuda/nccl.cu')
fail=0
for flag in -fsanitize=address -fsanitize=undefined -fno-omit-frame-pointer; do
    if [[ " $cmd " != *" -Xcompiler $flag "* ]]; then
        echo "FAIL  nvcc is not given -Xcompiler $flag under SANITIZE=\"$sanitize\": $cmd" >&2
        fail=1
    fi
done
((fail)) && exit 1
if ! make -s --no-print-directory BUILD="$build" SANITIZE="$sanitize" \
    CUDA_ARCHS="-gencode arch=compute_90,code=sm_90" "$obj" >"$build/log" 2>&1; then
    echo "FAIL  building $obj under SANITIZE:" >&2
    sed 's/^/      | /' "$build/log" >&2
    exit 1
fi
if ! nm "$obj" | grep -q '__asan_report'; then
    echo "FAIL  $obj, built under SANITIZE=\"$sanitize\", has no ASan checks" >&2
    exit 1
fi
echo "ok    SANITIZE reaches the host code of the .cu files (nvcc -Xcompiler, one flag each)"
