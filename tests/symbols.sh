#!/usr/bin/env bash
# The static library defines only castor's names: castor_* (the API),
# castor__* (internal, C or C++-mangled) and what nvcc and g++ emit on their
# own (anonymous-namespace functions under a per-file hash, their device
# stubs, the C++ personality reference). Anything else could clash with a
# name in the program that links libcastor.a.
set -uo pipefail
LIB=${1:?usage: tests/symbols.sh build/libcastor.a}
defined=$(nm -g --defined-only "$LIB") || { echo "FAIL  nm could not read $LIB" >&2; exit 1; }
stray=$(awk 'NF == 3 { print $3 }' <<<"$defined" | sort -u |
    grep -Ev '^castor_|^_Z[0-9]+castor__|^_ZN[0-9]+_GLOBAL__N_' |
    grep -Ev '^_Z[0-9]+__device_stub__ZN[0-9]+_GLOBAL__N_|^DW\.ref\.__gxx_personality_v0$')
if [[ -n "$stray" ]]; then
    echo "FAIL  $LIB defines names outside castor's prefix:" >&2
    sed 's/^/      | /' <<<"$stray" >&2
    exit 1
fi
if ! grep -q ' T castor_model_fit$' <<<"$defined"; then
    echo "FAIL  nm found no castor_model_fit in $LIB" >&2
    exit 1
fi
echo "ok    $LIB defines only castor_* and castor__* names"
