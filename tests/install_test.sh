#!/usr/bin/env bash
# Tests of make install / make uninstall: bash tests/install_test.sh BUILD
#
# A staged install (DESTDIR) puts exactly the program, the header, both
# libraries (soname links included) and castor.pc in place, with the final
# PREFIX in castor.pc; uninstall takes all of it away again. An install into
# a real prefix then serves a program the way a user builds one: against the
# shared library with `pkg-config --cflags --libs castor`, and against the
# static library with what `pkg-config --static` adds; both train a small
# model. The header compiles alone as C99 and as C++. The last line is
# "N passed, M failed".
set -uo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: bash tests/install_test.sh BUILD (the build directory of make)" >&2
    exit 2
fi
BUILD=$1
MAKE=${MAKE:-make}
CC=${CC:-cc}
T=$(mktemp -d "${TMPDIR:-/tmp}/castor-install-test.XXXXXX")
trap 'rm -rf "$T"' EXIT

passed=0
failed=0
ok() { echo "ok    $1"; passed=$((passed + 1)); }
fail() {
    echo "FAIL  $1" >&2
    if [[ $# -gt 1 ]]; then sed 's/^/      | /' <<<"$2" >&2; fi
    failed=$((failed + 1))
}
run_make() { "$MAKE" -s --no-print-directory BUILD="$BUILD" "$@" 2>&1; }

VERSION=$(sed -n 's/^#define CASTOR_VERSION_STRING "\(.*\)"$/\1/p' include/castor.h)
MAJOR=${VERSION%%.*}

# ---- staged install: what lands where ----
STAGE=$T/stage
if out=$(run_make install DESTDIR="$STAGE" PREFIX=/usr/local); then
    ok "make install DESTDIR=... PREFIX=/usr/local"
else
    fail "make install DESTDIR=... PREFIX=/usr/local" "$out"
fi
expected="/usr/local/bin/castor
/usr/local/include/castor.h
/usr/local/lib/libcastor.a
/usr/local/lib/libcastor.so
/usr/local/lib/libcastor.so.$MAJOR
/usr/local/lib/libcastor.so.$VERSION
/usr/local/lib/pkgconfig/castor.pc"
got=$(cd "$STAGE" && find . \( -type f -o -type l \) | sed 's/^\.//' | sort)
if [[ "$got" == "$expected" ]]; then
    ok "the staged tree holds exactly the program, header, libraries and castor.pc"
else
    fail "the staged tree is not what install should write" "$(diff <(echo "$expected") \
        <(echo "$got"))"
fi
links="$(readlink "$STAGE/usr/local/lib/libcastor.so") $(readlink \
    "$STAGE/usr/local/lib/libcastor.so.$MAJOR")"
if [[ "$links" == "libcastor.so.$MAJOR libcastor.so.$VERSION" ]]; then
    ok "libcastor.so -> libcastor.so.$MAJOR -> libcastor.so.$VERSION, relative"
else
    fail "the shared library's links are wrong: $links"
fi
soname=$(readelf -d "$STAGE/usr/local/lib/libcastor.so.$VERSION" 2>&1 | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
if [[ "$soname" == "libcastor.so.$MAJOR" ]]; then
    ok "the shared library's soname is libcastor.so.$MAJOR"
else
    fail "the shared library's soname is '$soname', not libcastor.so.$MAJOR"
fi
modes=$(cd "$STAGE/usr/local" && stat -c '%a %n' bin/castor include/castor.h lib/libcastor.a \
    "lib/libcastor.so.$VERSION" lib/pkgconfig/castor.pc)
if [[ "$modes" == "755 bin/castor
644 include/castor.h
644 lib/libcastor.a
755 lib/libcastor.so.$VERSION
644 lib/pkgconfig/castor.pc" ]]; then
    ok "installed modes: 755 for the program and shared library, 644 for the rest"
else
    fail "installed modes are wrong" "$modes"
fi
pc=$STAGE/usr/local/lib/pkgconfig/castor.pc
if grep -qx 'prefix=/usr/local' "$pc" && grep -qx 'libdir=${prefix}/lib' "$pc" &&
    ! grep -q "$STAGE" "$pc"; then
    ok "castor.pc names the final prefix, not DESTDIR"
else
    fail "castor.pc does not name /usr/local as it should" "$(cat "$pc")"
fi
if out=$(run_make uninstall DESTDIR="$STAGE" PREFIX=/usr/local) &&
    [[ -z "$(find "$STAGE" \( -type f -o -type l \))" ]]; then
    ok "make uninstall removes every file install wrote"
else
    fail "make uninstall left files behind" "$out
$(find "$STAGE" \( -type f -o -type l \))"
fi

# ---- an install a program builds against ----
P=$T/prefix
if out=$(run_make install PREFIX="$P"); then
    ok "make install PREFIX=DIR"
else
    fail "make install PREFIX=DIR" "$out"
fi
export PKG_CONFIG_PATH=$P/lib/pkgconfig
modversion=$(pkg-config --modversion castor 2>&1)
if [[ "$modversion" == "$VERSION" ]]; then
    ok "pkg-config --modversion castor: $VERSION"
else
    fail "pkg-config --modversion castor says '$modversion', the header $VERSION"
fi
out=$("$P/bin/castor" version 2>&1)
if [[ "$out" == *"$VERSION"* ]]; then
    ok "the installed program runs: castor version"
else
    fail "the installed castor version says" "$out"
fi

# A program that checks it runs the library it was compiled against, then
# trains and evaluates a small model on two separable classes.
cat >"$T/app.c" <<'EOF'
#include <castor.h>
#include <stdio.h>

enum { N = 128, FEATURES = 4 };

int main(void)
{
    if (castor_version_number() != CASTOR_VERSION_NUMBER) {
        fprintf(stderr, "header %s, library %s\n", CASTOR_VERSION_STRING, castor_version());
        return 1;
    }
    static float x[N * FEATURES];
    static int32_t labels[N];
    for (int i = 0; i < N; i++) {
        labels[i] = i % 2;
        for (int f = 0; f < FEATURES; f++)
            x[i * FEATURES + f] = (labels[i] ? 1.0f : -1.0f) + 0.01f * (float)((i * 7 + f) % 5);
    }
    castor_strategy *strategy = NULL;
    castor_dataset *data = NULL;
    castor_model *model = NULL;
    castor_optimizer adam = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    castor_fit_options fit = CASTOR_FIT_OPTIONS_INIT;
    fit.epochs = 20;
    fit.batch_size = 16;
    castor_metrics metrics;
    int rc;
    if ((rc = castor_strategy_create(&strategy, CASTOR_STRATEGY_CENTRAL, "cpu:2", NULL)) ||
        (rc = castor_dataset_from_memory(&data, x, N, FEATURES, labels, NULL, 0)) ||
        (rc = castor_model_create(&model, FEATURES)) ||
        (rc = castor_model_add_layers(model, "8:relu,2")) ||
        (rc = castor_model_compile(model, strategy, CASTOR_LOSS_SOFTMAX_XENT, &adam, 1)) ||
        (rc = castor_model_fit(model, data, &fit, NULL)) ||
        (rc = castor_model_evaluate(model, data, 64, &metrics)))
        fprintf(stderr, "%s: %s %s %s\n", castor_errstr(rc), castor_strategy_errmsg(strategy),
                castor_dataset_errmsg(data), castor_model_errmsg(model));
    else
        printf("castor %s accuracy %.2f\n", castor_version(), metrics.accuracy);
    castor_model_free(model);
    castor_dataset_free(data);
    castor_strategy_free(strategy);
    return rc != 0 || metrics.accuracy < 0.99;
}
EOF

# shellcheck disable=SC2046  # pkg-config's output is meant to split into flags
if out=$($CC -std=c11 -Wall -Wextra -Werror "$T/app.c" -o "$T/app-shared" \
    $(pkg-config --cflags --libs castor) 2>&1); then
    ok "a program builds with \$(pkg-config --cflags --libs castor)"
else
    fail "a program does not build with pkg-config's flags" "$out"
fi
if ldd_out=$(LD_LIBRARY_PATH=$P/lib ldd "$T/app-shared" 2>&1) &&
    grep -q "libcastor.so.$MAJOR => $P/lib/libcastor.so.$MAJOR" <<<"$ldd_out"; then
    ok "it loads the installed libcastor.so.$MAJOR"
else
    fail "it does not load the installed libcastor.so.$MAJOR" "$ldd_out"
fi
if out=$(OPENBLAS_NUM_THREADS=1 LD_LIBRARY_PATH=$P/lib "$T/app-shared" 2>&1) &&
    [[ "$out" == "castor $VERSION accuracy 1.00" ]]; then
    ok "it runs against the shared library: $out"
else
    fail "the shared-library program failed" "$out"
fi

# Static: the archive by path, and every other flag pkg-config --static gives.
static_libs=$(pkg-config --static --libs castor | sed 's/\(^\| \)-lcastor\( \|$\)/ /')
# shellcheck disable=SC2086
if out=$($CC -std=c11 -Wall -Wextra -Werror "$T/app.c" -o "$T/app-static" \
    $(pkg-config --cflags castor) "$P/lib/libcastor.a" $static_libs 2>&1); then
    ok "a program builds against libcastor.a with pkg-config --static's flags"
else
    fail "a program does not build against libcastor.a with pkg-config --static's flags" "$out"
fi
if readelf -d "$T/app-static" 2>/dev/null | grep -q 'NEEDED.*libcastor'; then
    fail "the static program still needs libcastor.so"
elif out=$(OPENBLAS_NUM_THREADS=1 "$T/app-static" 2>&1) &&
    [[ "$out" == "castor $VERSION accuracy 1.00" ]]; then
    ok "it runs with libcastor linked in: $out"
else
    fail "the static program failed" "$out"
fi

# ---- the build tree, not installed ----
# -lcastor from the build directory: the program needs libcastor.so.MAJOR (the
# soname), which the build directory lacked, so it linked and then could not
# start ("cannot open shared object file").
B=$(cd "$BUILD" && pwd)
if out=$($CC -std=c11 -Wall -Wextra -Werror "$T/app.c" -o "$T/app-tree" -Iinclude -L"$B" \
    -lcastor -Wl,-rpath,"$B" 2>&1) &&
    out=$(OPENBLAS_NUM_THREADS=1 "$T/app-tree" 2>&1) &&
    [[ "$out" == "castor $VERSION accuracy 1.00" ]]; then
    ok "a program linked with -L$BUILD -lcastor runs from the build tree: $out"
else
    fail "a program linked with -L$BUILD -lcastor does not run from the build tree" "$out"
fi

# ---- the installed header on its own ----
if out=$(printf '#include <castor.h>\nint main(void) { return castor_version_number() < 0; }\n' |
    $CC -std=c99 -pedantic -Wall -Wextra -Werror -fsyntax-only -I"$P/include" -x c - 2>&1); then
    ok "castor.h compiles alone as C99 (-pedantic)"
else
    fail "castor.h does not compile alone as C99" "$out"
fi
CXX=${CXX:-c++}
if ! command -v "$CXX" >/dev/null; then
    echo "skip  castor.h as C++: no $CXX"
elif out=$(printf '#include <castor.h>\nint main() { return castor_version_number() < 0; }\n' |
    $CXX -std=c++11 -Wall -Wextra -Werror -I"$P/include" -x c++ - -o "$T/app-cxx" \
        -L"$P/lib" -lcastor 2>&1) && LD_LIBRARY_PATH=$P/lib "$T/app-cxx"; then
    ok "castor.h compiles and links as C++ (extern \"C\")"
else
    fail "castor.h does not serve a C++ program" "$out"
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
