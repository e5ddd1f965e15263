#!/usr/bin/env bash
# The allocation sweeps (tests/alloc/) can fail only the allocation
# functions the test binary is linked to wrap (the Makefile's ALLOC_WRAP):
# one that castor's C objects call and that is not wrapped would go
# untested, so it fails here, by name. (The CUDA objects, *.cu.o, are left
# out: the sweeps run on the emulated devices.)
set -uo pipefail
LIB=${1:?usage: tests/alloc/allocators.sh build/libcastor.a WRAPPED...}
shift
wrapped=" $* "
# What libc (and POSIX) offer that hands out memory for the caller to free.
allocators="malloc calloc realloc reallocarray free posix_memalign aligned_alloc memalign valloc
            pvalloc strdup strndup wcsdup asprintf vasprintf getline getdelim realpath
            canonicalize_file_name open_memstream open_wmemstream tempnam scandir glob"
undefined=$(nm -u "$LIB" 2>/dev/null | awk '
    /:$/ { object = $0; next }
    object !~ /\.cu\.o:$/ && NF >= 2 { print $2 }' | sort -u) ||
    { echo "FAIL  nm could not read $LIB" >&2; exit 1; }
missing=""
for a in $allocators; do
    if grep -qx "$a" <<<"$undefined" && [[ $wrapped != *" $a "* ]]; then
        missing="$missing $a"
    fi
done
if [[ -n $missing ]]; then
    echo "FAIL  castor calls$missing, which tests/alloc cannot make fail: add it to ALLOC_WRAP" \
         "in the Makefile and a __wrap_ function to tests/alloc/alloc_fail.c" >&2
    exit 1
fi
if ! grep -qx malloc <<<"$undefined"; then
    echo "FAIL  nm found no call of malloc in $LIB" >&2
    exit 1
fi
echo "ok    every allocation function castor calls is one tests/alloc makes fail"
