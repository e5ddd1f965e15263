#!/usr/bin/env bash
# Tests of the castor command line: bash tests/cli_test.sh build/castor
#
# Help and version, strict flag checking (usage errors are one line starting
# "castor: " and exit 2), castor info, a tiny training run on a synthetic IDX
# data set with --json, the progress display, SIGINT/SIGTERM/SIGHUP stopping
# a run with status 130/143/129 (and left alone when ignored at start); then --save with eval and predict, checkpoints, a run
# killed with SIGKILL and resumed (bitwise equal to one never interrupted),
# SIGTERM writing a checkpoint, two runs into one checkpoint directory, writes
# that fail (a full directory, the file size limit, a broken log pipe), and
# --resume files and flags that cannot work. The last line is "N passed, M
# failed".
set -uo pipefail
# OpenBLAS reads a thread count from any of these, and castor then keeps it:
# from the caller (OMP_NUM_THREADS is common in CI), one made the
# oversubscription warning an extra stderr line and the CLI leave OpenBLAS
# alone where a test wants it to share the cores. Tests that want one set it.
unset OPENBLAS_NUM_THREADS GOTO_NUM_THREADS OMP_NUM_THREADS

if [[ $# -ne 1 ]]; then
    echo "usage: bash tests/cli_test.sh PATH/TO/castor" >&2
    exit 2
fi
BIN=$(realpath "$1")
if [[ ! -x "$BIN" ]]; then
    echo "cli_test: $1 is not an executable" >&2
    exit 2
fi

T=$(mktemp -d "${TMPDIR:-/tmp}/castor-cli-test.XXXXXX")
# tests/ckpt_file.py: the Python snippets read and rewrite checkpoints with it.
export PYTHONPATH="$(cd "$(dirname "$0")" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
BGPID=""
CGROUP=""  # a cgroup a test made, removed if the script ends before the test does
cleanup() {
    if [[ -n "$BGPID" ]]; then kill -KILL "$BGPID" 2>/dev/null; fi
    if [[ -n "$CGROUP" ]]; then rmdir "$CGROUP" 2>/dev/null; fi
    rm -rf "$T"
}
trap cleanup EXIT

passed=0
failed=0
ok() {
    passed=$((passed + 1))
    echo "ok    $1"
}
bad() {
    failed=$((failed + 1))
    echo "FAIL  $1"
    if [[ -n "${2:-}" ]]; then printf '%s\n' "$2" | head -n 20 | sed 's/^/      | /'; fi
}

# run ARGS...: runs castor; sets rc, and $T/out, $T/err
run() {
    timeout 300 "$BIN" "$@" >"$T/out" 2>"$T/err"
    rc=$?
}
lines() { if [[ -s "$1" ]]; then wc -l <"$1"; else echo 0; fi; }
# wait_for PID CMD...: every 5 ms until CMD succeeds (0) or PID has ended or
# 20 s have passed (1).
wait_for() {
    local pid=$1
    shift
    for _ in $(seq 1 4000); do
        "$@" && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.005
    done
    return 1
}
tmp_file_in() { compgen -G "$1/ckpt-*.safetensors.tmp.*" >/dev/null; }
# Run "$@" with SIGINT and SIGHUP at their default action. A script's
# background job ('cmd &' without job control) starts with SIGINT ignored,
# and castor leaves a signal it inherits ignored as such (as nohup needs):
# the tests that stop a background run with SIGINT start it this way.
signals_default() {
    exec python3 -c '
import os, signal, sys
for s in (signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_DFL)
os.execv(sys.argv[1], sys.argv[1:])' "$@"
}
# Wait for process $1 at most $2 seconds, then kill it: a run that ignores
# the signal it was sent must fail its test, not hang the suite. Sets rc.
wait_at_most() {
    local waited=0
    while kill -0 "$1" 2>/dev/null && [[ $waited -lt $(($2 * 10)) ]]; do
        sleep 0.1
        waited=$((waited + 1))
    done
    kill -0 "$1" 2>/dev/null && kill -KILL "$1" 2>/dev/null
    wait "$1"
    rc=$?
}
# Whether process $1 is $BIN (signals_default's python has made way for
# it) and has a handler for SIGINT yet: a signal before the handler would
# kill it without a word.
catches_sigint() {
    local caught name
    name=$(basename "$BIN")
    [[ "$(cat "/proc/$1/comm" 2>/dev/null)" == "${name:0:15}" ]] || return 1
    caught=$(awk '/^SigCgt:/ {print $2}' "/proc/$1/status" 2>/dev/null) || return 1
    [[ -n "$caught" ]] && (( 0x$caught & 2 ))
}

# A failure that must be one line on stderr starting "castor: " with status $1.
expect_error() {
    local want=$1 name=$2
    shift 2
    run "$@"
    local n
    n=$(lines "$T/err")
    if [[ $rc -eq $want && $n -eq 1 ]] && head -n 1 "$T/err" | grep -q '^castor: '; then
        ok "$name -> $want: $(head -c 100 "$T/err")"
    else
        bad "$name: want status $want and one 'castor: ' line on stderr; got status $rc, $n lines" \
            "$(cat "$T/err")"
    fi
}

# ---- a small synthetic data set: 16x16 images, 10 classes, each class a
# bright 4x4 cell at its own place on a dim noisy background ------------------
DATA="$T/data"
mkdir -p "$DATA"
if ! python3 - "$DATA" <<'EOF'
import gzip, os, random, struct, sys

out = sys.argv[1]
rng = random.Random(20240601)

def make(n):
    images = bytearray()
    labels = bytearray()
    for _ in range(n):
        c = rng.randrange(10)
        px = [rng.randrange(0, 64) for _ in range(256)]
        cy, cx = divmod(c, 4)
        for y in range(4):
            for x in range(4):
                px[(cy * 4 + y) * 16 + cx * 4 + x] = rng.randrange(192, 256)
        images += bytes(px)
        labels.append(c)
    return images, labels

def write(name, magic, dims, payload):
    with gzip.open(os.path.join(out, name), "wb") as f:
        f.write(struct.pack(">I", magic))
        for d in dims:
            f.write(struct.pack(">I", d))
        f.write(payload)

for prefix, n in (("train", 512), ("t10k", 128)):
    images, labels = make(n)
    write(prefix + "-images-idx3-ubyte.gz", 0x803, (n, 16, 16), images)
    write(prefix + "-labels-idx1-ubyte.gz", 0x801, (n,), labels)
EOF
then
    bad "python3 could not write the synthetic data set"
fi
TRAIN=(train --data "$DATA" --layers "32:relu,10" --optimizer adam --lr 0.01 --seed 1)

# ---- help and version -----------------------------------------------------------
run --help
if [[ $rc -eq 0 ]] && grep -q 'train' "$T/out" && grep -q 'info' "$T/out"; then
    ok "castor --help"
else
    bad "castor --help: status $rc" "$(cat "$T/out" "$T/err")"
fi

run help
if [[ $rc -eq 0 ]] && grep -q 'usage: castor' "$T/out"; then ok "castor help"; else bad "castor help: status $rc"; fi

run --version
if [[ $rc -eq 0 ]] && grep -Eq '^castor [0-9]+\.[0-9]+\.[0-9]+' "$T/out"; then
    ok "castor --version: $(head -n 1 "$T/out")"
else
    bad "castor --version: status $rc" "$(cat "$T/out" "$T/err")"
fi

expect_error 2 "castor version with an argument" version extra
for how in "version --help" "help version" "--help version"; do
    # shellcheck disable=SC2086
    run $how
    if [[ $rc -eq 0 ]] && grep -q '^usage: castor version' "$T/out"; then
        ok "castor $how"
    else
        bad "castor $how: status $rc" "$(cat "$T/out" "$T/err")"
    fi
done
expect_error 2 "castor --version with an argument" --version junk
for how in "help --help" "help -h"; do
    # shellcheck disable=SC2086
    run $how
    if [[ $rc -eq 0 ]] && grep -q '^usage: castor <command>' "$T/out"; then ok "castor $how"; else bad "castor $how: status $rc" "$(cat "$T/err")"; fi
done
run --help train
if [[ $rc -eq 0 ]] && grep -q '^usage: castor train' "$T/out"; then ok "castor --help train"; else bad "castor --help train: status $rc" "$(head -3 "$T/out")"; fi
expect_error 2 "castor --help with an unknown command" --help bogus

# Output that cannot be written is a failure (status 1 and a message), not 0.
if [[ -w /dev/full ]]; then
    for how in "info" "info --json" "version" "--help" "help train" "train --help" "eval --help"; do
        # shellcheck disable=SC2086
        timeout 60 "$BIN" $how >/dev/full 2>"$T/err"
        rc=$?
        if [[ $rc -eq 1 ]] && grep -q '^castor: .*cannot write' "$T/err"; then
            ok "castor $how >/dev/full -> 1"
        else
            bad "castor $how >/dev/full: status $rc" "$(cat "$T/err")"
        fi
    done
fi

TRAIN_FLAGS=(--data --layers --optimizer --lr --momentum --nesterov --weight-decay --epochs
    --batch --strategy --devices --seed --loss --validation-split --device-memory
    --host-threads --tf32 --json --quiet --verbose --help --save --checkpoint-dir
    --checkpoint-every --keep --resume)
for how in "train --help" "help train"; do
    # shellcheck disable=SC2086
    run $how
    missing=()
    for f in "${TRAIN_FLAGS[@]}"; do
        grep -q -- "$f\b" "$T/out" || missing+=("$f")
    done
    ndef=$(grep -c '(default:' "$T/out")
    if [[ $rc -eq 0 && ${#missing[@]} -eq 0 && $ndef -ge $((${#TRAIN_FLAGS[@]} - 1)) ]]; then
        ok "castor $how mentions every flag with its default"
    else
        bad "castor $how: status $rc, missing: ${missing[*]:-none}, $ndef defaults" \
            "$(cat "$T/out" "$T/err")"
    fi
done

run info --help
if [[ $rc -eq 0 ]] && grep -q -- '--json' "$T/out"; then ok "castor info --help"; else bad "castor info --help: status $rc"; fi

# ---- usage errors: one line, status 2, before any work --------------------------------
expect_error 2 "no command"
expect_error 2 "unknown command" frobnicate
expect_error 2 "unknown global flag" --frobnicate
expect_error 2 "unknown train flag" train --frobnicate
expect_error 2 "positional argument" train extra
expect_error 2 "missing value" train --epochs
expect_error 2 "flag as a value" train --epochs --batch 64
expect_error 2 "empty value" train --epochs=
expect_error 2 "value to a switch" train --json=1
# --help is a switch like --json: a value to it is that mistake, not an unknown flag
for args in "train --help=x" "eval --help=" "--help=train"; do
    # shellcheck disable=SC2086
    run $args
    if [[ $rc -eq 2 && $(lines "$T/err") -eq 1 ]] && grep -q '^castor: .*--help takes no value' \
        "$T/err" && ! grep -q 'unknown' "$T/err"; then
        ok "castor $args -> 2: $(head -c 100 "$T/err")"
    else
        bad "castor $args: want status 2 and '--help takes no value'; got status $rc" \
            "$(cat "$T/err")"
    fi
done
expect_error 2 "--epochs 0" train --epochs 0
expect_error 2 "--epochs abc" train --epochs abc
expect_error 2 "--epochs 5x" train --epochs 5x
expect_error 2 "--epochs ' 5'" train --epochs " 5"
expect_error 2 "--epochs 99999999999" train --epochs 99999999999
expect_error 2 "--batch -5" train --batch -5
expect_error 2 "--batch 0" train --batch 0
# the flag refuses it, before any data loads (compile refused it after)
expect_error 2 "--lr 0" train --data "$T/no-such-dir" --lr 0
expect_error 2 "--lr nan" train --lr nan
expect_error 2 "--lr inf" train --lr inf
# checked as a flag, before any data loads (the directory does not exist)
expect_error 2 "--lr 1e-50 (zero as a float)" train --data "$T/no-such-dir" --lr 1e-50
expect_error 2 "--lr -0.1" train --lr -0.1
expect_error 2 "--lr 1e999" train --lr 1e999
expect_error 2 "--momentum 1" train --optimizer sgd --momentum 1
expect_error 2 "--momentum 0.9999999999 (1 as a float)" train --data "$T/no-such-dir" --optimizer sgd --momentum 0.9999999999
expect_error 2 "--momentum with adam" train --optimizer adam --momentum 0.9
expect_error 2 "--nesterov with adamw" train --optimizer adamw --nesterov
# (before any data loads: compile refused it too, after)
expect_error 2 "--weight-decay with sgd" train --data "$T/no-such-dir" --optimizer sgd \
    --weight-decay 0.01
expect_error 2 "--seed -1" train --seed -1
expect_error 2 "--seed 18446744073709551616" train --seed 18446744073709551616
# A leading '+' is a number's, as --epochs +5 is one: the parse passes and the
# missing data fails the run (it said "'+1': not a non-negative integer").
for flag in --seed --epochs; do
    expect_error 1 "$flag +1 is a number" train --data "$T/no-such-dir" "$flag" +1
    grep -q 'cannot load the training data' "$T/err" || bad "$flag +1: refused" "$(cat "$T/err")"
done
expect_error 2 "--validation-split -1" train --validation-split -1
expect_error 2 "--device-memory 12Q" train --device-memory 12Q
expect_error 2 "--device-memory 99999999T" train --device-memory 99999999T
expect_error 2 "--host-threads -1" train --host-threads -1
# Each range's top: one past it is a usage error, before any data loads (the
# library takes any weight decay >= 0, so for it the flag is the only check);
# the top itself passes the parse and the missing data fails the run.
NODATA=(train --data "$T/no-such-dir")
expect_error 2 "--epochs 1000001" "${NODATA[@]}" --epochs 1000001
expect_error 2 "--host-threads 1025" "${NODATA[@]}" --host-threads 1025
expect_error 2 "--batch 16777217" "${NODATA[@]}" --batch 16777217
expect_error 2 "--weight-decay 1.5" "${NODATA[@]}" --optimizer adamw --weight-decay 1.5
for flag in "--epochs 1000000" "--host-threads 1024" "--batch 16777216" \
    "--optimizer adamw --weight-decay 1"; do
    # shellcheck disable=SC2086
    expect_error 1 "$flag is in range" "${NODATA[@]}" $flag
    grep -q 'cannot load the training data' "$T/err" || bad "$flag: refused" "$(cat "$T/err")"
done
expect_error 2 "--optimizer rmsprop" train --optimizer rmsprop
expect_error 2 "--strategy sideways" train --strategy sideways
expect_error 2 "--loss hinge" train --loss hinge
expect_error 2 "--verbose with --quiet" train --verbose --quiet
expect_error 2 "unknown info flag" info --frobnicate
expect_error 2 "help for an unknown command" help frobnicate
expect_error 2 "batch smaller than the replicas" "${TRAIN[@]}" --devices cpu:4 --batch 2 --epochs 1
expect_error 2 "--validation-split >= training samples" "${TRAIN[@]}" --validation-split 512 --epochs 1

# Left to the library, but the error must be printed (one line, castor: ...).
run "${TRAIN[@]}" --devices gpu:1 --epochs 1
if [[ ($rc -eq 1 || $rc -eq 2) && $(lines "$T/err") -eq 1 ]] && grep -q '^castor: ' "$T/err"; then
    ok "--devices gpu:1 -> $rc: $(head -c 100 "$T/err")"
else
    bad "--devices gpu:1: status $rc, want 1 or 2 with one 'castor: ' line" "$(cat "$T/err")"
fi
# A count in range with more after it: the message quotes what is wrong, not only the range
# that 2 is in ("cpu:2abc: the count after cpu: must be 1..64" read as nonsense)
for dev in "cpu:2abc" "cpu:2x2x"; do
    expect_error 2 "--devices $dev" train --devices "$dev" --epochs 1
    want=${dev#cpu:}
    [[ $dev == *x*x ]] && want=${want#*x}
    if ! grep -q "a whole number 1\.\.64, not '$want'" "$T/err"; then
        bad "--devices $dev: want \"a whole number 1..64, not '$want'\"" "$(cat "$T/err")"
    fi
done
expect_error 1 "missing data directory" train --data "$T/no-such-dir" --epochs 1
# ... which is what it says: not that the IDX files are missing from it (a typo in --data
# is not a data set without its files); nor is a file given as --data
if grep -q 'no-such-dir: No such file or directory' "$T/err" && ! grep -q 'missing' "$T/err"; then
    ok "a missing --data directory is named as such"
else
    bad "a missing --data directory: want 'DIR: No such file or directory'" "$(cat "$T/err")"
fi
# The Debian package's hint only for a directory that is Fashion-MNIST by its name (it came
# with every missing directory and every directory without its files)
if ! grep -q 'dataset-fashion-mnist' "$T/err"; then
    ok "a missing --data directory of the user's own: no hint to install Fashion-MNIST"
else
    bad "a missing --data directory of the user's own: the Fashion-MNIST hint" "$(cat "$T/err")"
fi
mkdir -p "$T/data-empty"
expect_error 1 "a --data directory without the files" train --data "$T/data-empty" --epochs 1
if grep -q 'data-empty: missing train-images-idx3-ubyte\[.gz\] and train-labels-idx1-ubyte\[.gz\]$' \
    "$T/err"; then
    ok "... names what is missing, with no hint to install Fashion-MNIST"
else
    bad "a --data directory without the files: want 'missing ...' and no hint" "$(cat "$T/err")"
fi
for how in "--data $T/none/fashion-mnist/" "--data fashion-mnist"; do
    # shellcheck disable=SC2086
    CASTOR_FASHION_MNIST="$T/none/fashion-mnist" run train $how --epochs 1
    if [[ $rc -eq 1 ]] && grep -q 'fashion-mnist/*: No such file or directory (for Fashion-MNIST install the Debian package dataset-fashion-mnist)$' "$T/err"; then
        ok "train $how, missing: the hint to install Fashion-MNIST"
    else
        bad "train $how, missing: want the hint to install Fashion-MNIST; status $rc" "$(cat "$T/err")"
    fi
done
# A missing test set is found before the training set is read (it was read first, whole,
# then the run failed on t10k-*): here the training images are not even IDX, and the
# message must be the test set's
mkdir -p "$T/data-notest"
cp "$DATA/train-labels-idx1-ubyte.gz" "$T/data-notest/"
echo "not an IDX file" >"$T/data-notest/train-images-idx3-ubyte"
expect_error 1 "train without a test set" train --data "$T/data-notest" --epochs 1
grep -q "^castor: cannot load the test data from $T/data-notest: $T/data-notest: missing t10k-images-idx3-ubyte\[.gz\] and t10k-labels-idx1-ubyte\[.gz\]$" "$T/err" ||
    bad "train without a test set: not refused for it before reading the training set" \
        "$(cat "$T/err")"
run train --data "$BIN" --epochs 1
if [[ $rc -eq 1 ]] && grep -q "$BIN: not a directory" "$T/err" && ! grep -q 'missing' "$T/err"
then
    ok "--data FILE -> 1: not a directory"
else
    bad "--data FILE: want status 1 and 'not a directory'; got status $rc" "$(cat "$T/err")"
fi

# ---- info -------------------------------------------------------------------------------
run info
if [[ $rc -eq 0 ]] && grep -q '^castor ' "$T/out" && grep -Eq '^cpu: [0-9]+ cores?' "$T/out" &&
    grep -Eq '^(no GPU: .+|gpus: [0-9]+)' "$T/out"; then
    ok "castor info: $(grep -E '^(no GPU|gpus)' "$T/out" | head -n 1)"
else
    bad "castor info: status $rc" "$(cat "$T/out" "$T/err")"
fi
run info --json
if [[ $rc -eq 0 ]] && tail -n 1 "$T/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert {"version", "features", "cpu_cores", "gpus"} <= d.keys(), d' 2>"$T/py"; then
    ok "castor info --json"
else
    bad "castor info --json: status $rc" "$(cat "$T/out" "$T/err" "$T/py")"
fi
# The cores castor may run on, as bench.json counts them: under taskset -c 0
# one, of however many are online (it said every core online).
if command -v taskset >/dev/null 2>&1 && taskset -c 0 true 2>/dev/null &&
    [[ $(getconf _NPROCESSORS_ONLN) -ge 2 ]]; then
    taskset -c 0 "$BIN" info --json >"$T/out" 2>"$T/err"
    rc=$?
    taskset -c 0 "$BIN" info >"$T/text" 2>>"$T/err"
    if [[ $rc -eq 0 ]] && grep -Eq '^cpu: 1 core of the [0-9]+ online' "$T/text" &&
        tail -n 1 "$T/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["cpu_cores"] == 1 and d["cpu_cores_online"] >= 2, d' 2>"$T/py"; then
        ok "castor info under taskset -c 0: 1 core of those online"
    else
        bad "castor info under taskset -c 0: status $rc" \
            "$(cat "$T/text" "$T/out" "$T/err" "$T/py")"
    fi
else
    ok "castor info under taskset -c 0: skipped (no taskset, or fewer than 2 cores)"
fi
# Under a cgroup CPU quota of one core (docker --cpus 1, a Kubernetes CPU
# limit), one core: threads beyond the quota only get the group throttled (it
# counted every core the cpuset allows). Needs a cgroup this test may make:
# root and a writable cpu controller, v1's or v2's, and at least 2 cores that
# castor counts without it (else the quota would change nothing).
cg=
cores=$("$BIN" info --json 2>/dev/null | tail -n 1 |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["cpu_cores"])' 2>/dev/null)
if [[ ${cores:-0} -ge 2 ]]; then
    if [[ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]] &&
        mkdir "/sys/fs/cgroup/cpu/castor-test-$$" 2>/dev/null; then
        cg=/sys/fs/cgroup/cpu/castor-test-$$
        CGROUP=$cg
        { echo 100000 >"$cg/cpu.cfs_period_us" && echo 100000 >"$cg/cpu.cfs_quota_us"; } \
            2>/dev/null || { rmdir "$cg"; cg=; }
    elif [[ -f /sys/fs/cgroup/cgroup.controllers ]] &&
        grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null &&
        mkdir "/sys/fs/cgroup/castor-test-$$" 2>/dev/null; then
        cg=/sys/fs/cgroup/castor-test-$$
        CGROUP=$cg
        echo "100000 100000" 2>/dev/null >"$cg/cpu.max" || { rmdir "$cg"; cg=; }
    fi
fi
if [[ -n $cg ]]; then
    sh -c 'echo $$ >"$1/cgroup.procs" && exec "$2" info --json' sh "$cg" "$BIN" \
        >"$T/out" 2>"$T/err"
    rc=$?
    rmdir "$cg" 2>/dev/null && CGROUP=""
    if [[ $rc -eq 0 ]] && tail -n 1 "$T/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["cpu_cores"] == 1 and d["cpu_cores_online"] >= 2, d' 2>"$T/py"; then
        ok "castor info under a cgroup quota of one core: 1 core"
    else
        bad "castor info under a cgroup quota of one core: status $rc" \
            "$(cat "$T/out" "$T/err" "$T/py")"
    fi
else
    ok "castor info under a cgroup quota: skipped (under 2 cores, or no cgroup to make)"
fi

# ---- training -------------------------------------------------------------------------------
check_json() { # check_json NAME EXTRA-PYTHON-ASSERTS
    if tail -n 1 "$T/out" | python3 -c '
import json, math, sys
d = json.loads(sys.stdin.read())
need = ["test_accuracy", "test_loss", "epochs", "seconds", "samples_per_second",
        "replicas", "device_peak_bytes", "strategy", "devices", "batch", "params",
        "train_loss", "train_accuracy", "steps"]
missing = [k for k in need if k not in d]
assert not missing, "missing keys: %s" % missing
assert d["seconds"] > 0 and d["samples_per_second"] > 0, d
assert math.isfinite(d["test_loss"]) and math.isfinite(d["train_loss"]), d
'"$2" 2>"$T/py"; then
        ok "$1"
        return 0
    fi
    bad "$1" "$(cat "$T/py"; tail -n 3 "$T/out"; cat "$T/err")"
    return 1
}

run "${TRAIN[@]}" --strategy central --devices cpu:2 --epochs 2 --batch 64 --json
if [[ $rc -eq 0 ]]; then
    ok "train central cpu:2 --json exits 0"
    check_json "train central: the last line of stdout is the JSON summary" '
assert d["replicas"] == 2 and d["epochs"] == 2 and d["batch"] == 64, d
assert d["strategy"] == "central" and d["devices"] == "cpu:2", d
assert d["steps"] == 16, "512 samples / 64 = 8 steps x 2 epochs, got %r" % d["steps"]
assert d["train_samples"] == 512 and d["test_samples"] == 128, d
assert d["params"] == 256 * 32 + 32 + 32 * 10 + 10, d["params"]
assert d["test_accuracy"] > 0.5, "the synthetic classes are easy: %r" % d["test_accuracy"]
'
    if grep -Eq '^epoch 1/2 +loss [0-9.]+ +acc [0-9.]+ .*[0-9.]+s$' "$T/err" &&
        grep -Eq '^epoch 2/2 ' "$T/err" && ! grep -q $'\r' "$T/err"; then
        ok "progress off a terminal: one plain line per epoch"
    else
        bad "progress off a terminal: want 'epoch 1/2  loss ...  acc ...  N.Ns' lines" "$(cat "$T/err")"
    fi
else
    bad "train central cpu:2 --json: status $rc" "$(cat "$T/out" "$T/err")"
fi

run "${TRAIN[@]}" --strategy mirrored --devices cpu:2 --epochs 2 --batch 64 --json --quiet
if [[ $rc -eq 0 ]]; then
    check_json "train mirrored cpu:2 --json" '
assert d["strategy"] == "mirrored" and d["replicas"] == 2, d'
    if [[ ! -s "$T/err" ]]; then ok "--quiet: nothing on stderr"; else bad "--quiet printed" "$(cat "$T/err")"; fi
else
    bad "train mirrored cpu:2: status $rc" "$(cat "$T/out" "$T/err")"
fi

run "${TRAIN[@]}" --devices cpu:2 --epochs 1 --batch 32 --validation-split 128 \
    --optimizer sgd --lr 0.05 --momentum 0.9 --nesterov --json
if [[ $rc -eq 0 ]]; then
    check_json "train sgd with --validation-split 128" '
assert d["train_samples"] == 384 and d["validation_samples"] == 128, d
assert d["val_loss"] is not None and d["val_accuracy"] is not None, d'
    if grep -Eq '^epoch 1/1 .*val_loss [0-9.]+ +val_acc [0-9.]+' "$T/err"; then
        ok "the epoch line shows val_loss and val_acc"
    else
        bad "the epoch line lacks val_loss/val_acc" "$(cat "$T/err")"
    fi
else
    bad "train sgd --validation-split: status $rc" "$(cat "$T/out" "$T/err")"
fi

run "${TRAIN[@]}" --devices cpu:2 --epochs 2 --batch 64 --loss mse --json
if [[ $rc -eq 0 ]]; then
    check_json "train --loss mse (one-hot targets)" '
assert d["loss"] == "mse" and d["test_accuracy"] is None, d'
else
    bad "train --loss mse: status $rc" "$(cat "$T/out" "$T/err")"
fi
# samples_per_second counts the samples trained: a last batch of 32 (512 =
# 5 x 96 + 32) as 32, not as a whole batch of 96.
run "${TRAIN[@]}" --devices cpu:2 --epochs 1 --batch 96 --quiet --json
if [[ $rc -eq 0 ]] && tail -n 1 "$T/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["steps"] == 6, d
n = d["samples_per_second"] * d["seconds"]
assert abs(n - 512) < 1e-6 * 512, "samples_per_second x seconds: %r, want 512" % n' 2>"$T/py"; then
    ok "samples_per_second: 512 samples in 6 steps of batch 96"
else
    bad "samples_per_second with a last batch of 32: status $rc" "$(cat "$T/py"; tail -n 1 "$T/out")"
fi
# The defaults --help gives: --batch 256 (512 samples: 2 steps) and --seed 1.
run train --data "$DATA" --layers 10 --epochs 1 --quiet --json
if [[ $rc -eq 0 ]] && tail -n 1 "$T/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["batch"] == 256 and d["steps"] == 2 and d["seed"] == 1, d' 2>"$T/py"; then
    ok "--batch and --seed left out: 256 and 1"
else
    bad "the defaults of --batch and --seed: status $rc" "$(cat "$T/py"; tail -n 1 "$T/out")"
fi
expect_error 2 "--loss mse with fewer units than classes" "${TRAIN[@]}" --layers 4 --loss mse --epochs 1
expect_error 2 "--loss mse with one unit for ten classes" "${TRAIN[@]}" --layers 1 --loss mse \
    --epochs 1
if grep -q 'the last layer has 1 unit (' "$T/err"; then
    ok "one unit is '1 unit'"
else
    bad "one unit is '1 unit'" "$(cat "$T/err")"
fi

# --loss mse turns the labels into one-hot targets without a second copy of
# the samples: on 16000 images of 28x28 (49 MiB as floats) train --loss mse
# must peak within 16 MiB of the same run with xent (it copied each set's
# samples, and peaked 35 MiB above; eval of an MSE model copied the test set).
BIG="$T/big"
mkdir -p "$BIG"
python3 - "$BIG" <<'EOF'
import os, random, struct, sys
rng = random.Random(7)
for prefix, n in (("train", 16000), ("t10k", 100)):
    labels = bytes(rng.randrange(10) for _ in range(n))
    with open(os.path.join(sys.argv[1], prefix + "-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + rng.randbytes(n * 784))
    with open(os.path.join(sys.argv[1], prefix + "-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + labels)
EOF
peak_kib() { # peak_kib ARGS...: castor's peak RSS in KiB, or -1 if it failed
    python3 -c '
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if r.returncode == 0 else -1)' \
        "$BIN" "$@"
}
xent_kib=$(peak_kib train --data "$BIG" --layers 10 --epochs 1 --batch 64 --quiet)
mse_kib=$(peak_kib train --data "$BIG" --layers 10 --epochs 1 --batch 64 --quiet --loss mse)
if [[ $xent_kib -gt 0 && $mse_kib -gt 0 && $((mse_kib - xent_kib)) -lt 16384 ]]; then
    ok "train --loss mse peaks $(((mse_kib - xent_kib) / 1024)) MiB above xent: no copy of the samples"
else
    bad "train --loss mse: peak RSS $mse_kib KiB, xent $xent_kib KiB: want less than 16 MiB more"
fi

run "${TRAIN[@]}" --devices cpu --epochs 1 --batch 64
if [[ $rc -eq 0 ]] && grep -q '^test: ' "$T/out" && grep -q 'accuracy' "$T/out"; then
    ok "train without --json prints a text summary"
else
    bad "train text summary: status $rc" "$(cat "$T/out" "$T/err")"
fi

# The summary's values start in one column, "checkpoints:" and "saved:" too
# (the value after "checkpoints:" started two columns right of the others),
# and --verbose names the strategy once (the library's line and the CLI's
# said the same).
rm -rf "$T/align-ck"
run "${TRAIN[@]}" --devices cpu:2 --epochs 1 --batch 64 --verbose --checkpoint-dir "$T/align-ck" \
    --save "$T/align.safetensors"
columns=$(grep -E '^[a-z]+: ' "$T/out" | sed -E 's/^([a-z]+: +).*/\1/' | awk '{print length}' |
    sort -u | tr '\n' ' ')
labels=$(grep -cE '^[a-z]+: ' "$T/out")
named=$(grep -c "central strategy on\|strategy central on" "$T/err")
if [[ $rc -eq 0 && $columns == "13 " && $labels -eq 8 && $named -eq 1 ]]; then
    ok "train summary: 8 labels, every value in column 13; --verbose names the strategy once"
else
    bad "train summary: status $rc, value columns '$columns' of $labels labels, strategy named \
$named times" "$(cat "$T/out" "$T/err")"
fi

# OpenBLAS gets the cores castor may run on, not every core online: under
# taskset -c 0 one replica's GEMMs get 1 thread (it gave them all, and ran
# them on the one core it had).
if command -v taskset >/dev/null 2>&1 && taskset -c 0 true 2>/dev/null &&
    [[ $(getconf _NPROCESSORS_ONLN) -ge 2 ]]; then
    timeout 300 env -u OPENBLAS_NUM_THREADS taskset -c 0 "$BIN" "${TRAIN[@]}" --devices cpu \
        --epochs 1 --batch 64 --verbose >"$T/out" 2>"$T/err"
    rc=$?
    if [[ $rc -eq 0 ]] && grep -q '^castor: OpenBLAS: 1 thread per GEMM$' "$T/err"; then
        ok "taskset -c 0: OpenBLAS gets the one core castor may use"
    else
        bad "taskset -c 0: status $rc, want 'OpenBLAS: 1 thread per GEMM'" "$(cat "$T/err")"
    fi
else
    ok "taskset -c 0: skipped (no taskset, or fewer than 2 cores)"
fi

# A thread count for OpenBLAS is one it reads: a positive number in
# OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or OMP_NUM_THREADS. An empty or zero
# value is none to OpenBLAS (all cores), and the CLI shares the cores as
# without it (it left OpenBLAS alone on any value); a set count is kept.
for setting in OPENBLAS_NUM_THREADS= OPENBLAS_NUM_THREADS=0 OMP_NUM_THREADS=1 \
    GOTO_NUM_THREADS=1; do
    timeout 300 env -u OPENBLAS_NUM_THREADS -u GOTO_NUM_THREADS -u OMP_NUM_THREADS "$setting" \
        "$BIN" "${TRAIN[@]}" --devices cpu:2 --epochs 1 --batch 64 --verbose \
        >"$T/out" 2>"$T/err"
    rc=$?
    shared=0
    grep -Eq '^castor: OpenBLAS: [0-9]+ threads? per GEMM$' "$T/err" && shared=1
    want=1
    [[ $setting == *=1 ]] && want=0
    if [[ $rc -eq 0 && $shared -eq $want ]]; then
        ok "$setting: the CLI $( ((want)) && echo shares the cores || echo keeps the count)"
    else
        bad "$setting: status $rc, cores shared: $shared, want $want" "$(cat "$T/err")"
    fi
done

# The progress bar, when stderr is a terminal (needs script(1) for a pty).
if command -v script >/dev/null 2>&1 && script -qec true /dev/null </dev/null >/dev/null 2>&1; then
    TERM=xterm script -qec "$(printf '%q ' "$BIN" "${TRAIN[@]}" --devices cpu:2 --epochs 2 \
        --batch 64 --json)" /dev/null </dev/null >"$T/tty" 2>&1
    rc=$?
    if [[ $rc -eq 0 ]] && grep -q $'\r' "$T/tty" && grep -q 'epoch 2/2' "$T/tty"; then
        ok "progress on a terminal: a line redrawn with \\r"
    else
        bad "progress on a terminal: status $rc" "$(tr '\r' '\n' <"$T/tty" | tail -n 5)"
    fi
    # A terminal that says it cannot clear a line (TERM=dumb) gets plain
    # lines, not escape codes it would print as text.
    TERM=dumb script -qec "$(printf '%q ' "$BIN" "${TRAIN[@]}" --devices cpu:2 --epochs 2 \
        --batch 64 --json)" /dev/null </dev/null >"$T/tty" 2>&1
    rc=$?
    if [[ $rc -eq 0 ]] && ! grep -q $'\033' "$T/tty" && grep -q '^epoch 2/2' "$T/tty"; then
        ok "progress on a TERM=dumb terminal: plain lines, no escape codes"
    else
        bad "progress on a TERM=dumb terminal: status $rc" "$(cat -v "$T/tty" | tail -n 5)"
    fi
else
    ok "progress on a terminal: skipped (no script(1) or no pty)"
fi

# ---- SIGINT / SIGTERM / SIGHUP stop training after the current step -----------------------
# The run starts with SIGINT and SIGTERM blocked, as a process may inherit
# them from whatever launched it (CI runners do): castor must unblock the
# signals it handles, or a pending SIGINT never arrives.
start_with_stop_signals_blocked() {
    exec python3 -c '
import os, signal, sys
for s in (signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
os.execv(sys.argv[1], sys.argv[1:])' "$@"
}
interrupt_test() { # interrupt_test SIGNAL STATUS
    local sig=$1 want=$2
    # Empty it first: the wait below must not read the last test's lines
    # before the new run has opened the file.
    : >"$T/err"
    start_with_stop_signals_blocked "$BIN" "${TRAIN[@]}" --devices cpu:2 --epochs 100000 --batch 8 \
        >"$T/out" 2>"$T/err" &
    BGPID=$!
    local waited=0
    while ! grep -q '^epoch 1/' "$T/err" 2>/dev/null; do
        if ! kill -0 "$BGPID" 2>/dev/null || [[ $waited -ge 600 ]]; then break; fi
        sleep 0.1
        waited=$((waited + 1))
    done
    kill -s "$sig" "$BGPID" 2>/dev/null
    # it must stop after the current step: give it 30 s at most
    waited=0
    while kill -0 "$BGPID" 2>/dev/null && [[ $waited -lt 300 ]]; do
        sleep 0.1
        waited=$((waited + 1))
    done
    if kill -0 "$BGPID" 2>/dev/null; then
        kill -KILL "$BGPID" 2>/dev/null
        wait "$BGPID" 2>/dev/null
        BGPID=""
        bad "SIG$sig: still running 30 s after the signal" "$(tail -n 3 "$T/err")"
        return
    fi
    wait "$BGPID"
    rc=$?
    BGPID=""
    if [[ $rc -eq $want ]] &&
        grep -Eq 'interrupted after step [0-9]+; no checkpoint directory set, progress lost' "$T/err"; then
        ok "SIG$sig during training -> status $rc, '$(grep -o 'interrupted after step [0-9]*' "$T/err")'"
    else
        bad "SIG$sig: want status $want and 'interrupted after step N'; got $rc" "$(tail -n 3 "$T/err")"
    fi
}
interrupt_test INT 130
interrupt_test TERM 143
# A closed terminal or ssh session: its default action killed the run, and
# with it every step since the newest checkpoint.
interrupt_test HUP 129

# ---- a signal ignored at start stays ignored (nohup; 'castor train &' in a script) ----------
# Handlers installed over them made nohup useless and let the terminal's
# Ctrl-C stop a run that the shell had put in the background.
: >"$T/err"
python3 -c '
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
os.execv(sys.argv[1], sys.argv[1:])' "$BIN" "${TRAIN[@]}" --devices cpu:2 --epochs 100000 --batch 8 \
    >"$T/out" 2>"$T/err" &
BGPID=$!
waited=0
while ! grep -q '^epoch 1/' "$T/err" 2>/dev/null; do
    if ! kill -0 "$BGPID" 2>/dev/null || [[ $waited -ge 600 ]]; then break; fi
    sleep 0.1
    waited=$((waited + 1))
done
kill -INT "$BGPID" 2>/dev/null
kill -HUP "$BGPID" 2>/dev/null
sleep 1
alive=0
kill -0 "$BGPID" 2>/dev/null && alive=1
kill -TERM "$BGPID" 2>/dev/null
wait_at_most "$BGPID" 60
BGPID=""
if [[ $alive -eq 1 && $rc -eq 143 ]] && grep -q 'interrupted after step' "$T/err"; then
    ok "SIGINT and SIGHUP ignored at start: still training 1 s after both, SIGTERM -> 143"
else
    bad "SIGINT and SIGHUP ignored at start: alive $alive after them, then status $rc (want 143)" \
        "$(tail -n 3 "$T/err")"
fi

# ---- the first signal is acknowledged at once; a second one quits ------------------------
# (stderr stayed empty until the step or validation in progress ended,
# seconds on a large step, and users pressed Ctrl-C again, which quits
# without the checkpoint they were waiting for). Steps of 2048 samples
# through 2048:relu,2048:relu,10 take a second or more: the line must come
# before the run says it stopped, once for two signals, and not with --quiet.
ACK="$T/data-ack"
mkdir -p "$ACK"
python3 - "$ACK" <<'EOF'
import os, struct, sys
for prefix, n in (("train", 2048), ("t10k", 64)):
    with open(os.path.join(sys.argv[1], prefix + "-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + os.urandom(n * 784))
    with open(os.path.join(sys.argv[1], prefix + "-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(b % 10 for b in os.urandom(n)))
EOF
ACK_LINE='^castor: SIGINT: stopping as soon as it safely can; Ctrl-C again quits at once, writing nothing more$'
acked() { grep -q "$ACK_LINE" "$T/err"; }
: >"$T/err"
signals_default "$BIN" train --data "$ACK" --layers 2048:relu,2048:relu,10 --devices cpu:2 \
    --batch 2048 --epochs 100000 --verbose --json >"$T/out" 2>"$T/err" &
BGPID=$!
wait_for "$BGPID" grep -q '^castor: model ' "$T/err"
sleep 0.5 # into the first step
kill -INT "$BGPID" 2>/dev/null
before_stop=0
wait_for "$BGPID" acked && ! grep -q 'interrupted' "$T/err" && before_stop=1
kill -INT "$BGPID" 2>/dev/null
wait_at_most "$BGPID" 60
BGPID=""
if [[ $rc -eq 130 && $before_stop -eq 1 && $(grep -c "$ACK_LINE" "$T/err") -eq 1 && ! -s "$T/out" ]]
then
    ok "the first SIGINT is acknowledged at once, the second quits: 130, one line"
else
    bad "the first SIGINT acknowledged: status $rc, before the stop $before_stop, lines \
$(grep -c "$ACK_LINE" "$T/err")" "$(grep -v '^castor: \(info\|model\|data\|OpenBLAS\)' "$T/err")"
fi
: >"$T/err"
signals_default "$BIN" train --data "$ACK" --layers 2048:relu,2048:relu,10 --devices cpu:2 \
    --batch 2048 --epochs 100000 --quiet >"$T/out" 2>"$T/err" &
BGPID=$!
wait_for "$BGPID" catches_sigint "$BGPID"
kill -INT "$BGPID" 2>/dev/null
wait_at_most "$BGPID" 60
BGPID=""
if [[ $rc -eq 130 ]] && ! grep -q 'stopping' "$T/err"; then
    ok "--quiet: a SIGINT is not acknowledged"
else
    bad "--quiet and SIGINT: status $rc" "$(cat "$T/err")"
fi
rm -rf "$ACK"


# ---- names in any case, as --optimizer already took them; a seed past 2^53 as digits --------
run train --data "$DATA" --layers 16:ReLU,10 --optimizer ADAM --strategy Mirrored --loss XENT \
    --devices cpu:2 --epochs 1 --batch 64 --seed 18446744073709551615 --json --quiet
if [[ $rc -eq 0 ]] && tail -n 1 "$T/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["strategy"] == "mirrored" and d["loss"] == "xent" and d["optimizer"] == "adam", d
assert d["layers"] == "16:relu,10:linear", d["layers"]
assert d["seed"] == "18446744073709551615", d["seed"]
' 2>"$T/py"; then
    ok "--strategy Mirrored --loss XENT --layers 16:ReLU: names in any case"
else
    bad "names in any case: status $rc" "$(cat "$T/py" "$T/err"; tail -n 1 "$T/out")"
fi

# Seeds up to 2^53 are numbers with every digit (cJSON wrote 15 significant
# digits: 9.00719925474099e+15 and 8e+15, other seeds than the run's).
for seed in 9007199254740992 8000000000000001; do
    run train --data "$DATA" --layers 10 --devices cpu --epochs 1 --batch 64 --seed "$seed" \
        --json --quiet
    if [[ $rc -eq 0 ]] && tail -n 1 "$T/out" | grep -q "\"seed\":$seed,"; then
        ok "--seed $seed: --json says it to the digit"
    else
        bad "--seed $seed in --json: status $rc" "$(cat "$T/err"; tail -n 1 "$T/out")"
    fi
done

# ---- --json stays valid UTF-8 whatever bytes a path holds ----------------------------------
# (\xc0\xaf: an overlong '/'; \xed\xa0\x80: a UTF-16 surrogate; neither is UTF-8)
ODD="$T/data-"$'\xff\xfe\xc0\xaf\xed\xa0\x80'"-é"
cp -r "$DATA" "$ODD"
run train --data "$ODD" --layers 10 --devices cpu --epochs 1 --batch 64 --json --quiet
if [[ $rc -eq 0 ]] && tail -n 1 "$T/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.buffer.read().decode("utf-8"))  # strict: invalid UTF-8 raises
assert d["data"].endswith("data-" + "\ufffd" * 7 + "-\u00e9"), d["data"]
' 2>"$T/py"; then
    ok "--json with a non-UTF-8 --data path: valid UTF-8, the bad bytes as U+FFFD"
else
    bad "--json with a non-UTF-8 path: status $rc" "$(cat "$T/py"; tail -c 300 "$T/out"; cat "$T/err")"
fi
rm -rf "$ODD"

# ---- --save, then eval and predict from the file ------------------------------------------
# One epoch at a small learning rate: an accuracy well short of 1, so that
# agreeing on it means something.
SAVED="$T/model.safetensors"
run "${TRAIN[@]}" --devices cpu:2 --epochs 1 --batch 64 --lr 0.001 --save "$SAVED" --json --quiet
if [[ $rc -eq 0 && -s "$SAVED" ]]; then
    cp "$T/out" "$T/train.json"
    if tail -n 1 "$T/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["saved"] == sys.argv[1] and d["resumed_from"] is None and d["checkpoints"] == 0, d
assert 0.1 < d["test_accuracy"] < 0.9, "want a partly trained model: %r" % d["test_accuracy"]
assert d["learning_rate"] == 0.001, "the float as given, not its double: %r" % d["learning_rate"]
' "$SAVED" 2>"$T/py"; then
        ok "train --save: the summary says where"
    else
        bad "train --save: the summary" "$(cat "$T/py"; tail -n 1 "$T/out")"
    fi
else
    bad "train --save: status $rc, file $(ls -l "$SAVED" 2>&1)" "$(cat "$T/err")"
fi

run eval --model "$SAVED" --data "$DATA" --devices cpu:2 --batch 64 --json
if [[ $rc -eq 0 ]] && tail -n 1 "$T/out" | python3 -c '
import json, sys
e = json.loads(sys.stdin.read())
t = json.loads(open(sys.argv[1]).read().splitlines()[-1])
assert e["test_accuracy"] == t["test_accuracy"], (e["test_accuracy"], t["test_accuracy"])
assert abs(e["test_loss"] - t["test_loss"]) <= 1e-9 * abs(t["test_loss"]), (e, t)
assert e["samples"] == 128 and e["model"] == sys.argv[2] and e["step"] == 8, e
assert e["epoch"] == 1 and e["layers"] == "32:relu,10:linear", e
print(t["test_accuracy"])
' "$T/train.json" "$SAVED" >"$T/py" 2>&1; then
    ok "eval --model reproduces the test_accuracy train printed: $(cat "$T/py")"
else
    bad "eval --model --json: status $rc" "$(cat "$T/py" "$T/out" "$T/err")"
fi

run eval --model "$SAVED" --data "$DATA"
if [[ $rc -eq 0 ]] && grep -Eq '^test: +loss [0-9.]+ +accuracy [0-9.]+' "$T/out"; then
    ok "eval without --json prints a text summary"
else
    bad "eval text summary: status $rc" "$(cat "$T/out" "$T/err")"
fi

run predict --model "$SAVED" --data "$DATA"
if [[ $rc -eq 0 && $(lines "$T/out") -eq 11 ]] && head -n 1 "$T/out" | grep -q 'predicted'; then
    ok "predict: a header and the default 10 samples"
else
    bad "predict: status $rc, want 11 lines" "$(cat "$T/out" "$T/err")"
fi

run predict --model "$SAVED" --data "$DATA" --limit 1000 --json
if [[ $rc -eq 0 ]] && tail -n 1 "$T/out" | python3 -c '
import json, sys
p = json.loads(sys.stdin.read())
t = json.loads(open(sys.argv[1]).read().splitlines()[-1])
assert isinstance(p, list) and len(p) == 128, "want all 128 test samples, got %d" % len(p)
assert [r["index"] for r in p] == list(range(128))
assert all(0.1 <= r["probability"] <= 1.0 for r in p), "the top softmax of 10 classes is in [0.1, 1]"
assert all(0 <= r["predicted"] < 10 and 0 <= r["label"] < 10 for r in p)
acc = sum(r["predicted"] == r["label"] for r in p) / len(p)
assert acc == t["test_accuracy"], (acc, t["test_accuracy"])
' "$T/train.json" 2>"$T/py"; then
    ok "predict --json --limit 1000: every test sample; the argmax agrees with eval's accuracy"
else
    bad "predict --json: status $rc" "$(cat "$T/py"; tail -c 300 "$T/out"; cat "$T/err")"
fi
# The softmax sums over every unit: a last layer of zeros gives ten equal
# logits, unit 0 the predicted one, at a probability of exactly 1/10.
python3 - "$SAVED" "$T/flat.safetensors" <<'EOF'
import sys
import ckpt_file
h, data = ckpt_file.read(sys.argv[1])
for name, t in h.items():
    if name.startswith("dense_1."):
        s, e = t["data_offsets"]
        data[s:e] = bytes(e - s)
ckpt_file.write(sys.argv[2], h, data)
EOF
run predict --model "$T/flat.safetensors" --data "$DATA" --limit 3 --json
if [[ $rc -eq 0 ]] && tail -n 1 "$T/out" | python3 -c '
import json, sys
p = json.loads(sys.stdin.read())
assert len(p) == 3, p
assert all(r["predicted"] == 0 and r["output"] == 0 for r in p), p
assert all(abs(r["probability"] - 0.1) < 1e-6 for r in p), p' 2>"$T/py"; then
    ok "predict: ten equal logits, each at probability 1/10"
else
    bad "predict of a zero last layer: status $rc" "$(cat "$T/py"; tail -c 300 "$T/out"; cat "$T/err")"
fi

for how in "eval --help" "help eval" "predict --help" "help predict"; do
    # shellcheck disable=SC2086
    run $how
    if [[ $rc -eq 0 ]] && grep -q -- '--model' "$T/out" && grep -q -- '--data' "$T/out" &&
        grep -q '(default:' "$T/out"; then
        ok "castor $how"
    else
        bad "castor $how: status $rc" "$(cat "$T/out" "$T/err")"
    fi
done
run --help
if grep -q '^  eval ' "$T/out" && grep -q '^  predict ' "$T/out"; then
    ok "castor --help lists eval and predict"
else
    bad "castor --help lacks eval or predict" "$(cat "$T/out")"
fi

# Every key of a command's --json object (predict: of each array element) is
# named where its --help describes the object, and every key named there is
# in the object. keys_in_help NAME JSON-FILE HELP-PART-FILE
keys_in_help() {
    if python3 - "$2" "$3" >"$T/py" 2>&1 <<'EOF'; then
import json, re, sys
d = json.loads(open(sys.argv[1]).read().splitlines()[-1])
keys = set(d[0] if isinstance(d, list) else d)
part = open(sys.argv[2]).read()
assert part.strip(), "no description of the JSON object in the help"
missing = sorted(k for k in keys if not re.search(r"\b%s\b" % k, part))
assert not missing, "in the JSON, not in the help: %s" % missing
extra = sorted(set(re.findall(r"\b[a-z]+(?:_[a-z]+)+\b", part)) - keys)
assert not extra, "in the help, not in the JSON: %s" % extra
EOF
        ok "$1"
    else
        bad "$1" "$(cat "$T/py")"
    fi
}
run help train
sed -n '/^With --json/,/^$/p' "$T/out" >"$T/help-json"
keys_in_help "train --json: its help names every key" "$T/train.json" "$T/help-json"
for cmd in eval predict; do
    run "$cmd" --model "$SAVED" --data "$DATA" --json
    cp "$T/out" "$T/$cmd.json"
    run help "$cmd"
    sed -n '/^  --json/,/(default:/p' "$T/out" >"$T/help-json"
    keys_in_help "$cmd --json: its help names every key" "$T/$cmd.json" "$T/help-json"
done

# ---- eval and predict: bad arguments ------------------------------------------------------------
head -c 1000 "$SAVED" >"$T/truncated.safetensors"
expect_error 2 "eval without --model" eval --data "$DATA"
expect_error 2 "predict without --model" predict --data "$DATA"
expect_error 2 "eval: unknown flag --limit" eval --model "$SAVED" --data "$DATA" --limit 3
expect_error 2 "eval: positional argument" eval --model "$SAVED" extra
expect_error 2 "eval --batch 0" eval --model "$SAVED" --data "$DATA" --batch 0
# eval and predict take --device-memory like train (a model train could
# hold with it could not be opened without it).
expect_error 1 "eval --device-memory 1K: the budget applies" eval --model "$SAVED" --data "$DATA" \
    --device-memory 1K
grep -q 'budget is 1024 bytes' "$T/err" || bad "eval --device-memory: not the budget's message" "$(cat "$T/err")"
for cmd in eval predict; do
    run "$cmd" --model "$SAVED" --data "$DATA" --device-memory 64M --quiet
    if [[ $rc -eq 0 ]]; then ok "$cmd --device-memory 64M"; else bad "$cmd --device-memory 64M: status $rc" "$(cat "$T/err")"; fi
done
# eval and predict need device room for the variables and a batch's activations, not for
# the gradients, which open reserved too: 'castor eval --device-memory 30M' of a
# 256 -> 2048 -> 2048 -> 10 model was refused for "variables 18972712, gradients 18972712"
# (found by a user review). A 256 -> 2048 -> 10 model has 2,187,304 bytes of variables:
# 4M holds them and a batch of 128 samples' activations (3.4 MB), not them and their
# gradients (4.4 MB). Both commands give there what they give unconstrained, and train on
# the budget is refused before its first step, the message naming the gradients.
WIDE="$T/wide.safetensors"
run train --data "$DATA" --layers 2048:relu,10 --epochs 1 --batch 64 --seed 3 --save "$WIDE" \
    --quiet
[[ $rc -eq 0 ]] || bad "train --layers 2048:relu,10 --save: status $rc" "$(cat "$T/err")"
for cmd in eval predict; do
    every=()
    [[ $cmd == predict ]] && every=(--limit 128)
    run "$cmd" --model "$WIDE" --data "$DATA" "${every[@]}" --json
    cp "$T/out" "$T/wide-$cmd.json"
    run "$cmd" --model "$WIDE" --data "$DATA" "${every[@]}" --json --device-memory 4M
    if [[ $rc -eq 0 && -s "$T/out" ]] && cmp -s "$T/out" "$T/wide-$cmd.json"; then
        ok "$cmd --device-memory 4M: the variables fit, the gradients need not"
    else
        bad "$cmd --device-memory 4M of 2.2 MB of variables: status $rc" \
            "$(cat "$T/err"; diff "$T/out" "$T/wide-$cmd.json" | head -5)"
    fi
done
expect_error 1 "train --device-memory 4M, 2.2 MB of variables: no room for the gradients" \
    train --data "$DATA" --layers 2048:relu,10 --epochs 1 --batch 64 --device-memory 4M --quiet
grep -q 'to train (variables 2187304, gradients 2187304, activations for 64 rows' "$T/err" ||
    bad "train --device-memory 4M: the message does not name the gradients" "$(cat "$T/err")"
expect_error 2 "eval --strategy sideways" eval --model "$SAVED" --data "$DATA" --strategy sideways
expect_error 2 "eval: batch smaller than the replicas" eval --model "$SAVED" --data "$DATA" --devices cpu:4 --batch 2
expect_error 2 "predict --limit 0" predict --model "$SAVED" --data "$DATA" --limit 0
expect_error 2 "predict --limit abc" predict --model "$SAVED" --data "$DATA" --limit abc
expect_error 2 "predict --limit -3" predict --model "$SAVED" --data "$DATA" --limit -3
expect_error 1 "eval: no such model file" eval --model "$T/no-such.safetensors" --data "$DATA"
expect_error 1 "eval: a directory as the model" eval --model "$T" --data "$DATA"
expect_error 1 "eval: a truncated model" eval --model "$T/truncated.safetensors" --data "$DATA"
expect_error 1 "predict: a truncated model" predict --model "$T/truncated.safetensors" --data "$DATA"
expect_error 1 "eval: not a model" eval --model "$DATA/train-images-idx3-ubyte.gz" --data "$DATA"
expect_error 1 "eval: missing data directory" eval --model "$SAVED" --data "$T/no-such-dir"
# A test set with classes past the model's last layer: eval said only "eval: evaluate: labels
# go up to 11 but the last layer has 10 units", naming neither the data nor the sample, and
# predict printed such samples as "(wrong)", status 0. Both refuse it now (2), naming the
# directory, the first sample and the largest class.
LAB12="$T/data-lab12"
mkdir -p "$LAB12"
python3 - "$LAB12" <<'EOF2'
import gzip, os, struct, sys
n = 32
with gzip.open(os.path.join(sys.argv[1], "t10k-images-idx3-ubyte.gz"), "wb") as f:
    f.write(struct.pack(">IIII", 0x803, n, 16, 16) + bytes((5 * i) % 256 for i in range(n * 256)))
with gzip.open(os.path.join(sys.argv[1], "t10k-labels-idx1-ubyte.gz"), "wb") as f:
    f.write(struct.pack(">II", 0x801, n) + bytes(i % 12 for i in range(n)))
EOF2
for cmd in eval predict; do
    expect_error 2 "$cmd: test labels past the model's 10 units" "$cmd" --model "$SAVED" \
        --data "$LAB12"
    grep -q "^castor: --model $SAVED: the test set in $LAB12 has class 10 (sample 10, classes up to 11) but the last layer has 10 units" \
        "$T/err" || bad "$cmd: the message does not name the data, the sample and the classes" \
        "$(cat "$T/err")"
    [[ ! -s "$T/out" ]] || bad "$cmd: printed results for data it refused" "$(head -3 "$T/out")"
done

# A test set of another shape for the same features, or scaled otherwise, than the model
# was trained on (16x16 unsigned bytes): eval and predict took 8x32 images and float32
# values of 0..255 as they were. The checkpoint now keeps input_shape and input_type, and
# both commands refuse such a set (2); a file without the keys (older) loads unchecked.
python3 - "$T" <<'EOF2'
import gzip, os, struct, sys
def write(d, name, magic, dims, payload):
    os.makedirs(d, exist_ok=True)
    with gzip.open(os.path.join(d, name), "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", x) for x in dims) + payload)
n = 32
labels = bytes(i % 10 for i in range(n))
write(sys.argv[1] + "/data-8x32", "t10k-images-idx3-ubyte.gz", 0x803, (n, 8, 32),
      bytes((5 * i) % 256 for i in range(n * 256)))
write(sys.argv[1] + "/data-8x32", "t10k-labels-idx1-ubyte.gz", 0x801, (n,), labels)
write(sys.argv[1] + "/data-f32", "t10k-images-idx3-ubyte.gz", 0xD03, (n, 16, 16),
      b"".join(struct.pack(">f", float((5 * i) % 256)) for i in range(n * 256)))
write(sys.argv[1] + "/data-f32", "t10k-labels-idx1-ubyte.gz", 0x801, (n,), labels)
EOF2
for cmd in eval predict; do
    expect_error 2 "$cmd: 8x32 test images for a model trained on 16x16" "$cmd" --model "$SAVED" \
        --data "$T/data-8x32"
    grep -q "the test set in $T/data-8x32 has samples of 8x32 where --model $SAVED was trained on 16x16" \
        "$T/err" || bad "$cmd: 8x32: the message does not say the shapes" "$(cat "$T/err")"
    expect_error 2 "$cmd: float32 test pixels for a model trained on unsigned bytes" "$cmd" \
        --model "$SAVED" --data "$T/data-f32"
    grep -q "the test set in $T/data-f32 holds float32 values, taken as they are, where --model $SAVED was trained on unsigned bytes, scaled to \\[0,1\\]" \
        "$T/err" || bad "$cmd: float32: the message does not say the types" "$(cat "$T/err")"
done
# ... and train --resume on training images of that shape (the test set too)
mkdir -p "$T/data-8x32-train"
for f in images-idx3 labels-idx1; do
    for set in train t10k; do
        cp "$T/data-8x32/t10k-$f-ubyte.gz" "$T/data-8x32-train/$set-$f-ubyte.gz"
    done
done
expect_error 2 "train --resume: 8x32 training images for a model trained on 16x16" train \
    --resume "$SAVED" --data "$T/data-8x32-train" --epochs 3
grep -q "has samples of 8x32 where --resume $SAVED was trained on 16x16" "$T/err" ||
    bad "train --resume: 8x32: the message does not say the shapes" "$(cat "$T/err")"
if python3 - "$SAVED" "$T/old-keys.safetensors" <<'EOF2'
import sys
import ckpt_file
header, data = ckpt_file.read(sys.argv[1])
meta = header["__metadata__"]
assert meta["input_shape"] == "16x16" and meta["input_type"] == "ubyte", meta
del meta["input_shape"], meta["input_type"]
ckpt_file.write(sys.argv[2], header, data)
EOF2
then
    run eval --model "$T/old-keys.safetensors" --data "$T/data-8x32"
    if [[ $rc -eq 0 ]]; then
        ok "eval: a checkpoint without input_shape/input_type loads, unchecked"
    else
        bad "eval: a checkpoint without input_shape/input_type: status $rc" "$(cat "$T/err")"
    fi
else
    bad "the saved model has no input_shape 16x16 / input_type ubyte"
fi

# A data directory castor may not look inside (no x permission) is named as such; it
# named DIR/t10k-images-idx3-ubyte, a file that does not exist (the data is .gz), as the
# one it could not open. Root passes permissions: run as nobody then, if setpriv can.
as_user=()
if [[ $(id -u) -eq 0 ]] && command -v setpriv >/dev/null 2>&1 &&
    setpriv --reuid=65534 --regid=65534 --clear-groups true 2>/dev/null; then
    as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
fi
if [[ $(id -u) -ne 0 || ${#as_user[@]} -gt 0 ]]; then
    LOCKED=$(mktemp -d "${TMPDIR:-/tmp}/castor-cli-locked.XXXXXX")
    chmod 711 "$LOCKED"
    mkdir "$LOCKED/data"
    cp "$DATA"/t10k-* "$LOCKED/data/"
    cp "$SAVED" "$LOCKED/model.safetensors"
    chmod 644 "$LOCKED/model.safetensors"
    chmod 644 "$LOCKED/data"  # read, but no search, for the owner and for nobody
    if "${as_user[@]}" test -r "$LOCKED/model.safetensors" -a -x "$BIN"; then
        timeout 60 "${as_user[@]}" "$BIN" eval --model "$LOCKED/model.safetensors" \
            --data "$LOCKED/data" >"$T/out" 2>"$T/err"
        rc=$?
    else
        rc=skip  # $TMPDIR or the binary out of the user's reach
    fi
    chmod 755 "$LOCKED/data"
    rm -rf "$LOCKED"
    if [[ $rc == skip ]]; then
        ok "eval: a data directory without search permission: skipped (the user cannot reach \
the model or the binary)"
    elif [[ $rc -eq 1 ]] && grep -q "data: cannot look inside the directory: Permission denied" \
        "$T/err" && ! grep -q 'idx3-ubyte' "$T/err"; then
        ok "eval: a data directory without search permission -> 1: $(head -c 100 "$T/err")"
    else
        bad "eval: a data directory without search permission: want status 1, 'cannot look inside the directory'; got $rc" \
            "$(cat "$T/err")"
    fi
else
    ok "eval: a data directory without search permission: skipped (root without setpriv)"
fi

# ---- checkpoints: every N steps, the newest K kept, other files left alone -----------------
names() { find "$1" -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | LC_ALL=C sort | tr '\n' ' '; }
# snapshot DIR...: the names and checksums of everything under the DIRs
snapshot() { find "$@" -type f -exec md5sum {} + 2>/dev/null | sort; find "$@" 2>/dev/null | sort; }
CK="$T/ck-every"
mkdir -p "$CK"
echo keep >"$CK/notes.txt"
echo keep >"$CK/ckpt-old.safetensors"
run "${TRAIN[@]}" --devices cpu:2 --epochs 2 --batch 64 --quiet --json \
    --checkpoint-dir "$CK/sub/dir" --checkpoint-every 4 --keep 2
if [[ $rc -eq 0 ]] &&
    [[ "$(names "$CK/sub/dir")" == "ckpt-000000000012.safetensors ckpt-000000000016.safetensors " ]] &&
    tail -n 1 "$T/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["checkpoints"] == 4 and d["saved"] is None and d["resumed_from"] is None, d'; then
    ok "--checkpoint-every 4 --keep 2: 4 written into a new nested directory, the newest 2 kept"
else
    bad "--checkpoint-every 4 --keep 2: status $rc" "$(ls -la "$CK/sub/dir" 2>&1; tail -n 1 "$T/out"; cat "$T/err")"
fi
run "${TRAIN[@]}" --devices cpu:2 --epochs 3 --batch 64 --quiet --json --checkpoint-dir "$CK" --keep 1
if [[ $rc -eq 0 ]] &&
    [[ "$(names "$CK")" == "ckpt-000000000024.safetensors ckpt-old.safetensors notes.txt sub " ]] &&
    tail -n 1 "$T/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["checkpoints"] == 3, d'; then
    ok "--checkpoint-every epoch (the default) --keep 1: other files untouched"
else
    bad "--checkpoint-dir with other files: status $rc" "$(ls -la "$CK"; tail -n 1 "$T/out"; cat "$T/err")"
fi
# --keep 3 of 4 (steps 2, 4, 6, 8) deletes the oldest one only (--keep 2 and
# 1 above cannot tell deleting one too many from sparing the newest).
KD="$T/ck-keep3"
run "${TRAIN[@]}" --devices cpu:2 --epochs 1 --batch 64 --quiet --checkpoint-dir "$KD" \
    --checkpoint-every 2 --keep 3
want="ckpt-000000000004.safetensors ckpt-000000000006.safetensors"
want="$want ckpt-000000000008.safetensors "
if [[ $rc -eq 0 && "$(names "$KD")" == "$want" ]]; then
    ok "--checkpoint-every 2 --keep 3: the newest 3 of 4 kept"
else
    bad "--keep 3 of 4: status $rc" "$(names "$KD"; cat "$T/err")"
fi

# Checkpoint writes are disk time, not training time: with every fsync made
# 100 ms slow (6 checkpoints, at steps 3, 6, ..., 15 and the last, 16; two
# fsyncs each: 1.2 s), seconds and samples_per_second still measure the 16
# small steps (seconds took the writes in, and samples/s fell with them),
# and checkpoint_seconds counts every write, the last one after fit too.
cat >"$T/slowsync.c" <<'EOF2'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <time.h>
int fsync(int fd)
{
    static int (*real)(int);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "fsync");
    struct timespec pause = {0, 100000000};
    nanosleep(&pause, NULL);
    return real(fd);
}
EOF2
if ${CC:-cc} -shared -fPIC -o "$T/slowsync.so" "$T/slowsync.c" -ldl 2>"$T/cc.err"; then
    LD_PRELOAD="$T/slowsync.so" run "${TRAIN[@]}" --devices cpu:2 --epochs 2 --batch 64 --quiet \
        --json --checkpoint-dir "$T/ck-slow" --checkpoint-every 3
    if [[ $rc -eq 0 ]] && tail -n 1 "$T/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["checkpoints"] == 6, d
assert d["checkpoint_seconds"] >= 1.2, d
assert d["seconds"] < 1.0, d
assert abs(d["samples_per_second"] * d["seconds"] - 2 * d["train_samples"]) < 1, d'; then
        ok "checkpoint writes are checkpoint_seconds, not training seconds"
    else
        bad "checkpoint time: status $rc" "$(tail -n 1 "$T/out"; cat "$T/err")"
    fi
else
    bad "cc could not build the fsync shim" "$(cat "$T/cc.err")"
fi

# Checkpoints of another run in --checkpoint-dir: a fresh run would have
# overwritten and pruned them as its own, and --resume DIR would then have
# picked the other run's newest. Refused before training; nothing changes.
before=$(snapshot "$CK")
expect_error 2 "a fresh run into a --checkpoint-dir holding checkpoints" "${TRAIN[@]}" \
    --layers 16:relu,10 --devices cpu:2 --epochs 1 --batch 64 --checkpoint-dir "$CK" \
    --checkpoint-every 4 --keep 2
grep -q -- "--resume $CK" "$T/err" || bad "the error does not suggest --resume $CK" "$(cat "$T/err")"
expect_error 2 "resuming ckpt 12 into a --checkpoint-dir holding ckpt 16" "${TRAIN[@]}" \
    --devices cpu:2 --epochs 2 --batch 64 --checkpoint-every 4 --keep 2 \
    --resume "$CK/sub/dir/ckpt-000000000012.safetensors" --checkpoint-dir "$CK/sub/dir"
# Older checkpoints of another run (seed 7, step 8): resuming step 16 of
# seed 1 into their directory pruned them as its own.
run "${TRAIN[@]}" --seed 7 --epochs 1 --batch 64 --quiet --checkpoint-dir "$T/ck-other"
other=$(snapshot "$T/ck-other")
expect_error 2 "resuming into a --checkpoint-dir holding another run's older checkpoint" \
    "${TRAIN[@]}" --devices cpu:2 --epochs 3 --batch 64 --keep 1 \
    --resume "$CK/sub/dir/ckpt-000000000016.safetensors" --checkpoint-dir "$T/ck-other"
grep -q -- "ckpt-000000000008.safetensors, from another run than .* (another seed)" "$T/err" ||
    bad "the error does not say which file and why" "$(cat "$T/err")"
[[ "$other" == "$(snapshot "$T/ck-other")" && -n "$other" ]] ||
    bad "the refused run changed the other run's checkpoints" "$(names "$T/ck-other")"
# ... and one that differs in --lr alone (each setting the run keeps counts)
run train --data "$DATA" --layers "32:relu,10" --optimizer adam --lr 0.02 --seed 1 --epochs 1 \
    --batch 64 --quiet --checkpoint-dir "$T/ck-other-lr"
expect_error 2 "resuming into a --checkpoint-dir holding an older checkpoint of another --lr" \
    "${TRAIN[@]}" --devices cpu:2 --epochs 3 --batch 64 --keep 1 \
    --resume "$CK/sub/dir/ckpt-000000000016.safetensors" --checkpoint-dir "$T/ck-other-lr"
grep -q -- "ckpt-000000000008.safetensors, from another run than .* (another optimizer)" \
    "$T/err" || bad "another --lr: the error does not say which file and why" "$(cat "$T/err")"
if [[ "$before" == "$(snapshot "$CK")" ]]; then
    ok "the refused runs left the checkpoint directories as they were"
else
    bad "a refused run changed the checkpoint directory" "$(diff <(echo "$before") <(snapshot "$CK"))"
fi
# An older checkpoint of the run whose header is damaged is not "from another
# run" (it said so): refused all the same, pruning would delete it unread.
DM="$T/ck-damaged"
run "${TRAIN[@]}" --devices cpu:2 --epochs 2 --batch 64 --quiet --checkpoint-dir "$DM"
head -c 100 "$DM/ckpt-000000000008.safetensors" >"$T/head"
mv "$T/head" "$DM/ckpt-000000000008.safetensors"
expect_error 2 "resuming into a --checkpoint-dir holding a damaged older checkpoint" \
    "${TRAIN[@]}" --devices cpu:2 --epochs 3 --resume "$DM" --checkpoint-dir "$DM"
grep -q "holds $DM/ckpt-000000000008.safetensors, which cannot be read as a checkpoint (bad \
safetensors header length [0-9]*): .* move it out of $DM, or give another directory\$" "$T/err" ||
    bad "the error does not say the file cannot be read" "$(cat "$T/err")"
run "${TRAIN[@]}" --devices cpu:2 --epochs 3 --batch 64 --checkpoint-every 4 --keep 2 --quiet \
    --resume "$CK/sub/dir" --checkpoint-dir "$CK/sub/dir"
if [[ $rc -eq 0 && "$(names "$CK/sub/dir")" == "ckpt-000000000020.safetensors ckpt-000000000024.safetensors " ]]; then
    ok "resuming a directory's newest checkpoint into it continues it"
else
    bad "resume into its own --checkpoint-dir: status $rc" "$(names "$CK/sub/dir"; cat "$T/err")"
fi
# The temporary file of a write cut short (kill -9 or a power cut mid-checkpoint)
# is removed by the next run into the directory, which holds it (it stayed for
# good: a checkpoint's size at each such kill); names merely like it stay.
SD2="$T/ck-stale"
run "${TRAIN[@]}" --devices cpu:2 --epochs 1 --batch 64 --quiet --checkpoint-dir "$SD2"
head -c 5000 "$SD2/ckpt-000000000008.safetensors" >"$SD2/ckpt-000000000012.safetensors.tmp.Ab3xYz"
for other in ckpt-000000000012.safetensors.tmp.notes ckpt-000000000012.safetensors.tmp.Ab-xYz \
    ckpt-12.safetensors.tmp.Ab3xYz notes.tmp.Ab3xYz ckpt-5.safetensors
do
    echo keep >"$SD2/$other"
done
run "${TRAIN[@]}" --devices cpu:2 --epochs 2 --quiet --resume "$SD2" --checkpoint-dir "$SD2"
want="ckpt-000000000008.safetensors ckpt-000000000012.safetensors.tmp.Ab-xYz"
want="$want ckpt-000000000012.safetensors.tmp.notes ckpt-000000000016.safetensors"
want="$want ckpt-12.safetensors.tmp.Ab3xYz ckpt-5.safetensors notes.tmp.Ab3xYz "
if [[ $rc -eq 0 && "$(names "$SD2")" == "$want" ]]; then
    ok "a resumed run removes the temporary file a killed write left, and no other file"
    # (ckpt-5.safetensors, not a name castor writes, is neither read as one
    # of its checkpoints nor pruned; a suffix of other than letters and
    # digits is not one atomic_file.c picks)
else
    bad "a killed write's temporary file: status $rc" "$(names "$SD2"; cat "$T/err")"
fi

# Two runs into one --checkpoint-dir at once: the second is refused while the
# first runs (both saw it empty, and wrote the same names over each other: the
# first's summary named as its newest checkpoint a file of the second's).
LD="$T/ck-locked"
: >"$T/lock.err"
"$BIN" "${TRAIN[@]}" --devices cpu --batch 8 --epochs 100000 --checkpoint-dir "$LD" \
    --checkpoint-every 1000000 >/dev/null 2>"$T/lock.err" &
BGPID=$!
wait_for "$BGPID" grep -q '^epoch 1/' "$T/lock.err"
expect_error 1 "a second run into a --checkpoint-dir in use" "${TRAIN[@]}" --seed 2 --epochs 1 \
    --batch 64 --checkpoint-dir "$LD"
grep -q -- "--checkpoint-dir $LD is in use by another castor train" "$T/err" ||
    bad "the error does not say the directory is in use" "$(cat "$T/err")"
kill -TERM "$BGPID" 2>/dev/null
wait "$BGPID"
rc=$?
BGPID=""
if [[ $rc -eq 143 && "$(names "$LD")" =~ ^ckpt-[0-9]{12}\.safetensors\ $ ]]; then
    ok "the first run went on alone: its checkpoint $(names "$LD")alone in the directory"
else
    bad "the first run into a --checkpoint-dir in use: status $rc" "$(names "$LD"; cat "$T/lock.err")"
fi
# A refused run does not take away the directory it made if the run that
# holds it is another (both started at once: A made DIR, B locked it first; A
# removed the empty DIR from under B, whose checkpoints then failed). Here A's
# flock waits until the file $FLOCK_AFTER exists: until B trains in the DIR A made.
cat >"$T/lateflock.c" <<'EOF2'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
int flock(int fd, int op)
{
    static int (*real)(int, int);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "flock");
    const char *after = getenv("FLOCK_AFTER");
    struct timespec pause = {0, 10000000};
    for (int i = 0; after && i < 2000 && access(after, F_OK) != 0; i++)
        nanosleep(&pause, NULL);
    return real(fd, op);
}
EOF2
if ${CC:-cc} -shared -fPIC -o "$T/lateflock.so" "$T/lateflock.c" -ldl 2>"$T/cc.err"; then
    LD="$T/ck-race/made"
    : >"$T/lock.err"
    FLOCK_AFTER="$T/b-trains" LD_PRELOAD="$T/lateflock.so" "$BIN" "${TRAIN[@]}" --epochs 1 \
        --checkpoint-dir "$LD" >/dev/null 2>"$T/lock-a.err" &
    apid=$!
    wait_for "$apid" test -d "$LD"
    "$BIN" "${TRAIN[@]}" --devices cpu --batch 8 --epochs 100000 --checkpoint-dir "$LD" \
        --checkpoint-every 1000000 >/dev/null 2>"$T/lock.err" &
    BGPID=$!
    wait_for "$BGPID" grep -q '^epoch 1/' "$T/lock.err"
    touch "$T/b-trains"
    wait "$apid"
    arc=$?
    kill -TERM "$BGPID" 2>/dev/null
    wait "$BGPID"
    rc=$?
    BGPID=""
    if [[ $arc -eq 1 && $rc -eq 143 && "$(names "$LD")" =~ ^ckpt-[0-9]{12}\.safetensors\ $ ]]
    then
        ok "a run refused a --checkpoint-dir in use leaves it to the run that holds it"
    else
        bad "a run refused a --checkpoint-dir it made: status $arc, the other $rc" \
            "$(cat "$T/lock-a.err"; grep -v '^epoch' "$T/lock.err"; names "$LD")"
    fi
else
    bad "cc could not build the flock shim" "$(cat "$T/cc.err")"
fi

# ---- kill -9 part-way, resume, and compare with a run never interrupted ---------------------------
# same_tensors A B: the two safetensors files hold the same tensors, byte for
# byte, at the same step (read by the documented layout: 8-byte little-endian
# header length, JSON header, data section; struct and json only).
same_tensors() {
    python3 - "$1" "$2" <<'EOF'
import sys
import ckpt_file

def load(path):
    header, data = ckpt_file.read(path)
    meta = header.pop("__metadata__", {})
    return meta, {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
                  for k, v in header.items()}

ma, ta = load(sys.argv[1])
mb, tb = load(sys.argv[2])
assert sorted(ta) == sorted(tb), "different tensors: %s vs %s" % (sorted(ta), sorted(tb))
for k in sorted(ta):
    if ta[k] != tb[k]:
        a, b = ta[k][2], tb[k][2]
        i = next((i for i in range(0, min(len(a), len(b)), 4) if a[i:i + 4] != b[i:i + 4]), None)
        sys.exit("%s differs (dtype/shape %s %s / %s %s), first at float %s" %
                 (k, ta[k][0], ta[k][1], tb[k][0], tb[k][1], None if i is None else i // 4))
assert ma["step"] == mb["step"], (ma["step"], mb["step"])
print("%d tensors, %d bytes, step %s" % (len(ta), sum(len(v[2]) for v in ta.values()), ma["step"]))
EOF
}
newest_step() { # the largest step among DIR's ckpt-*.safetensors; 0 if none
    local s
    s=$(names "$1" | tr ' ' '\n' | sed -n 's/^ckpt-0*\([0-9][0-9]*\)\.safetensors$/\1/p' | sort -n | tail -n 1)
    echo "${s:-0}"
}

# 512 samples, batch 8: 64 steps an epoch, 1920 in 30 epochs. A checkpoint
# every 3 steps (each one fsync'd) makes the run last over a second, long
# enough to kill it with certainty once the second epoch has begun.
KILLRUN=("${TRAIN[@]}" --devices cpu:2 --batch 8 --epochs 30 --quiet)
TOTAL=1920
KD="$T/ck-kill"
"$BIN" "${KILLRUN[@]}" --checkpoint-dir "$KD" --checkpoint-every 3 >"$T/kill.out" 2>"$T/kill.err" &
BGPID=$!
waited=0
while [[ $(newest_step "$KD") -lt 66 ]]; do
    if ! kill -0 "$BGPID" 2>/dev/null || [[ $waited -ge 1500 ]]; then break; fi
    sleep 0.02
    waited=$((waited + 1))
done
kill -KILL "$BGPID" 2>/dev/null
wait "$BGPID" 2>/dev/null # (bash would report the job "Killed")
krc=$?
BGPID=""
KSTEP=$(newest_step "$KD")
nk=$(names "$KD" | tr ' ' '\n' | grep -c '^ckpt-')
# --keep 3, and a 4th when the kill fell between writing a new one and
# deleting the oldest (which waits until the new one is safely written).
if [[ $krc -eq 137 && $KSTEP -ge 66 && $KSTEP -lt $TOTAL && $nk -ge 3 && $nk -le 4 ]]; then
    ok "kill -9 part-way: the newest checkpoint at step $KSTEP of $TOTAL, $nk on disk (--keep 3)"
    run "${KILLRUN[@]}" --resume "$KD" --save "$T/resumed.safetensors" --json
    RPATH="$KD/$(printf 'ckpt-%012d.safetensors' "$KSTEP")"
    if [[ $rc -eq 0 ]] && tail -n 1 "$T/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["resumed_from"] == sys.argv[1], (d["resumed_from"], sys.argv[1])
assert d["saved"] == sys.argv[2], d["saved"]
assert d["global_step"] == int(sys.argv[3]) and d["steps"] == int(sys.argv[3]) - int(sys.argv[4]), d
assert d["epochs"] == 30 and d["checkpoints"] == 0, d
' "$RPATH" "$T/resumed.safetensors" "$TOTAL" "$KSTEP" 2>"$T/py"; then
        ok "--resume DIR continues from the newest checkpoint to step $TOTAL"
    else
        bad "--resume DIR: status $rc" "$(cat "$T/py"; tail -n 1 "$T/out"; cat "$T/err")"
    fi
    run "${KILLRUN[@]}" --save "$T/full.safetensors"
    if [[ $rc -eq 0 ]] && same_tensors "$T/resumed.safetensors" "$T/full.safetensors" >"$T/py" 2>&1; then
        ok "killed and resumed == never interrupted, bitwise: $(cat "$T/py")"
    else
        bad "killed and resumed != never interrupted (status $rc)" "$(cat "$T/py" "$T/err")"
    fi
else
    bad "kill -9 part-way: status $krc (want 137), newest step $KSTEP (want 66..$((TOTAL - 1))), $nk checkpoints (want 3 or 4)" \
        "$(ls "$KD" 2>&1; cat "$T/kill.err")"
fi

# A checkpoint that has done every epoch asked for: evaluated only.
if [[ -s "$T/full.safetensors" ]]; then
    run "${TRAIN[@]}" --devices cpu:2 --batch 8 --epochs 30 --resume "$T/full.safetensors" --json
    if [[ $rc -eq 0 ]] && grep -q 'nothing left to train' "$T/err" && tail -n 1 "$T/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["steps"] == 0 and d["global_step"] == 1920 and d["test_accuracy"] is not None, d'; then
        ok "--resume FILE with every epoch done: says so and only evaluates"
    else
        bad "--resume a finished run: status $rc" "$(tail -n 1 "$T/out"; cat "$T/err")"
    fi
    # ... on other replicas: no warning that "training continues but not bit
    # for bit" (it warned so, of a run that trains nothing)
    run "${TRAIN[@]}" --devices cpu:3 --batch 8 --epochs 1 --resume "$T/full.safetensors"
    if [[ $rc -eq 0 && $(lines "$T/err") -eq 1 ]] &&
        grep -q 'has done 30 epochs of --epochs 1: nothing left to train; evaluating$' "$T/err"; then
        ok "--resume FILE with every epoch done, on other replicas: only says so"
    else
        bad "--resume a finished run on other replicas: status $rc" "$(cat "$T/err")"
    fi
fi

# ---- --resume without --epochs goes on to the run's own --epochs ---------------------------
# (it trained to the default 10, whatever the run had asked for: 80 steps
# for a run of --epochs 3 whose end was step 24). The checkpoint records
# the run's --epochs (target_epochs); one written before that key goes on
# to the default 10, and says so.
ED3="$T/ck-epochs"
run "${TRAIN[@]}" --devices cpu --epochs 3 --batch 64 --quiet --checkpoint-dir "$ED3" \
    --checkpoint-every 4 --keep 100
MID="$ED3/ckpt-000000000012.safetensors"
target=$(python3 -c 'import sys, ckpt_file; print(ckpt_file.meta(sys.argv[1]).get("target_epochs"))' \
    "$MID" 2>&1)
run "${TRAIN[@]}" --devices cpu --resume "$MID" --json --quiet
if [[ $rc -eq 0 && $target == 3 && ! -s "$T/err" ]] && tail -n 1 "$T/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["epochs"] == 3 and d["global_step"] == 24 and d["steps"] == 12, d' 2>"$T/py"; then
    ok "--resume without --epochs: the run's --epochs 3 (target_epochs), to step 24"
else
    bad "--resume without --epochs: status $rc, target_epochs '$target'" \
        "$(cat "$T/py"; tail -n 1 "$T/out"; cat "$T/err")"
fi
run "${TRAIN[@]}" --devices cpu --resume "$MID" --epochs 2 --json --quiet
if [[ $rc -eq 0 ]] && tail -n 1 "$T/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["epochs"] == 2 and d["global_step"] == 16, d' 2>"$T/py"; then
    ok "--resume with --epochs 2: the flag, not the file's 3"
else
    bad "--resume with --epochs 2: status $rc" "$(cat "$T/py"; tail -n 1 "$T/out"; cat "$T/err")"
fi
python3 - "$MID" "$T/no-target.safetensors" <<'EOF'
import sys
import ckpt_file
h, data = ckpt_file.read(sys.argv[1])
h["__metadata__"].pop("target_epochs", None)  # (the old castor wrote none)
ckpt_file.write(sys.argv[2], h, data)
EOF
run "${TRAIN[@]}" --devices cpu --resume "$T/no-target.safetensors" --json
if [[ $rc -eq 0 ]] && grep -qx "castor: warning: --resume $T/no-target.safetensors: it does not \
say how many its run was to train (an older castor, or a model never trained, wrote it); \
training to --epochs 10, the default" "$T/err" && tail -n 1 "$T/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["epochs"] == 10 and d["global_step"] == 80, d' 2>"$T/py"; then
    ok "--resume of a file without target_epochs: the default 10, with a warning"
else
    bad "--resume of a file without target_epochs: status $rc" \
        "$(cat "$T/py"; tail -n 1 "$T/out"; grep -v '^epoch' "$T/err")"
fi

# The summary counts in words that agree with the number ("1 steps" before).
run "${TRAIN[@]}" --devices cpu --batch 512 --epochs 1
if [[ $rc -eq 0 ]] && grep -q '^training: *1 epoch, batch 512, 1 step in ' "$T/out"; then
    ok "summary of a one-step run: '1 epoch, ..., 1 step'"
else
    bad "summary of a one-step run: status $rc" "$(grep training: "$T/out"; cat "$T/err")"
fi

# ---- standard descriptors closed by the caller ---------------------------------------------
# A closed stderr (2>&-) would be the next file castor opens, a checkpoint,
# and any message meant for stderr would land in it: castor puts /dev/null
# there (it left descriptor 2 to the checkpoint's temporary file). A closed
# stdout is still a failure to write the results.
"$BIN" "${TRAIN[@]}" --devices cpu --batch 8 --epochs 100000 --quiet \
    --checkpoint-dir "$T/ck-closed" --checkpoint-every 1 >/dev/null 2>&- &
BGPID=$!
if wait_for "$BGPID" tmp_file_in "$T/ck-closed" || wait_for "$BGPID" test -d "$T/ck-closed"; then
    fd2=$(readlink "/proc/$BGPID/fd/2")
else
    fd2="(castor ended or made no checkpoint)"
fi
kill -KILL "$BGPID" 2>/dev/null
wait "$BGPID" 2>/dev/null
BGPID=""
if [[ $fd2 == /dev/null ]]; then
    ok "train with stderr closed: descriptor 2 is /dev/null, not a checkpoint"
else
    bad "train with stderr closed: descriptor 2 is '$fd2'"
fi
"$BIN" info >&- 2>"$T/err"
rc=$?
if [[ $rc -eq 1 ]] && grep -q "cannot write to stdout: it is closed" "$T/err"; then
    ok "info with stdout closed -> 1, 'cannot write to stdout: it is closed'"
else
    bad "info with stdout closed: status $rc" "$(cat "$T/err")"
fi

# ---- a checkpoint from another OpenBLAS thread count: goes on, and says not bit for bit -------
# OpenBLAS splits a GEMM's sums by thread, so another count rounds otherwise;
# the file records the count (blas_threads) and a resume with another warns.
BD="$T/ck-blas"
BPATH="$BD/ckpt-000000000008.safetensors"
# OpenBLAS takes no more threads than the cores it may use: with one core
# both runs would have 1 (and rightly no warning).
if [[ $(nproc) -lt 2 ]]; then
    ok "resume with another OpenBLAS thread count: skipped (one usable core)"
elif OPENBLAS_NUM_THREADS=1 run "${TRAIN[@]}" --devices cpu --batch 64 --epochs 1 \
    --checkpoint-dir "$BD" && [[ $rc -eq 0 ]] && python3 - "$BPATH" <<'EOF' 2>"$T/py"; then
import sys
import ckpt_file
meta = ckpt_file.meta(sys.argv[1])
assert meta.get("blas_threads") == "1", meta
EOF
    OPENBLAS_NUM_THREADS=2 run "${TRAIN[@]}" --devices cpu --epochs 2 --resume "$BPATH"
    warned=$(grep -c 'trained with 1 OpenBLAS thread per GEMM; going on with 2, .*not bit for bit' \
        "$T/err")
    OPENBLAS_NUM_THREADS=1 run "${TRAIN[@]}" --devices cpu --epochs 2 --resume "$BPATH"
    if [[ $warned -eq 1 && $rc -eq 0 ]] && ! grep -q 'OpenBLAS thread' "$T/err"; then
        ok "resume with another OpenBLAS thread count: a warning (none with the file's)"
    else
        bad "resume with another OpenBLAS thread count: warned $warned, status $rc" \
            "$(cat "$T/err")"
    fi
else
    bad "a checkpoint's blas_threads: status $rc" "$(cat "$T/py" "$T/err")"
fi

# ---- SIGTERM with --checkpoint-dir: a checkpoint of the step reached, then resume it ----------
TD="$T/ck-term"
: >"$T/err" # as in interrupt_test: no stale "epoch 2/" line
start_with_stop_signals_blocked "$BIN" "${TRAIN[@]}" --devices cpu:2 --batch 8 --epochs 100000 \
    --checkpoint-dir "$TD" >"$T/out" 2>"$T/err" &
BGPID=$!
waited=0
while ! grep -q '^epoch 2/' "$T/err" 2>/dev/null; do
    if ! kill -0 "$BGPID" 2>/dev/null || [[ $waited -ge 600 ]]; then break; fi
    sleep 0.05
    waited=$((waited + 1))
done
kill -TERM "$BGPID" 2>/dev/null
wait "$BGPID"
rc=$?
BGPID=""
msg=$(grep -E '^castor: interrupted after step [0-9]+; checkpoint saved to ' "$T/err")
TSTEP=$(printf '%s' "$msg" | sed -n 's/^castor: interrupted after step \([0-9]*\);.*/\1/p')
TPATH=${msg#*checkpoint saved to }
if [[ $rc -eq 143 && -n "$TSTEP" && -s "$TPATH" &&
    "$TPATH" == "$TD/$(printf 'ckpt-%012d.safetensors' "$TSTEP")" &&
    "$(newest_step "$TD")" == "$TSTEP" ]]; then
    ok "SIGTERM with --checkpoint-dir -> 143, '${msg#castor: }'"
    # Finish the epoch in progress (or one more if it stopped at an epoch's end).
    E=$((TSTEP / 64 + 1))
    run "${TRAIN[@]}" --devices cpu:2 --epochs "$E" --resume "$TD" --json --quiet
    if [[ $rc -eq 0 ]] && tail -n 1 "$T/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
want = int(sys.argv[2]) * 64
assert d["resumed_from"] == sys.argv[1], d["resumed_from"]
assert d["global_step"] == want and d["steps"] == want - int(sys.argv[3]), d
assert d["batch"] == 8, "the batch comes from the checkpoint: %r" % d["batch"]
# train_loss covers the part of the last epoch this run trained, and says so
assert d["train_metric_samples"] == (want - int(sys.argv[3])) * 8, d
' "$TPATH" "$E" "$TSTEP" 2>"$T/py"; then
        ok "resume after SIGTERM: --epochs $E finishes at step $((E * 64)), --batch from the file"
    else
        bad "resume after SIGTERM: status $rc" "$(cat "$T/py"; tail -n 1 "$T/out"; cat "$T/err")"
    fi
else
    bad "SIGTERM with --checkpoint-dir: status $rc (want 143), step '$TSTEP', path '$TPATH'" \
        "$(ls "$TD" 2>&1; tail -n 3 "$T/err")"
fi

# ---- a second SIGINT while the interrupt checkpoint is written waits for it -----------------
# (it killed castor mid-write: no checkpoint, a temporary file left for ever).
# No periodic checkpoint: the only file written is the interrupt's.
ID="$T/ck-insist"
: >"$T/err"
signals_default "$BIN" train --data "$DATA" --layers 2048:relu,2048:relu,10 --devices cpu:2 \
    --batch 64 --epochs 100000 --seed 1 --checkpoint-dir "$ID" --checkpoint-every 1000000 \
    >"$T/out" 2>"$T/err" &
BGPID=$!
waited=0
while ! grep -q '^epoch 1/' "$T/err" 2>/dev/null; do
    if ! kill -0 "$BGPID" 2>/dev/null || [[ $waited -ge 1200 ]]; then break; fi
    sleep 0.05
    waited=$((waited + 1))
done
kill -INT "$BGPID" 2>/dev/null
# The second one as soon as the checkpoint's temporary file appears.
seen_tmp=0
wait_for "$BGPID" tmp_file_in "$ID" && seen_tmp=1
kill -INT "$BGPID" 2>/dev/null
wait_at_most "$BGPID" 60
BGPID=""
left=$(find "$ID" -name '*.tmp.*' 2>/dev/null)
saved=$(sed -n 's/^castor: interrupted after step [0-9]*; checkpoint saved to //p' "$T/err")
if [[ $seen_tmp -eq 1 && $rc -eq 130 && -z "$left" && -s "$saved" ]] &&
    "$BIN" eval --model "$saved" --data "$DATA" --quiet >/dev/null 2>&1; then
    ok "a second SIGINT during the interrupt checkpoint -> 130, the checkpoint whole"
else
    bad "second SIGINT during the checkpoint: status $rc, temporary file seen $seen_tmp, left '$left', saved '$saved'" \
        "$(tail -n 3 "$T/err"; ls -la "$ID" 2>&1)"
fi

# ---- the interrupt checkpoint cannot be written: the newest one kept is named -------------
# (it said "interrupted after step N; cannot write the checkpoint ...: No
# space left on device" and left the user to find the one before). A shim
# fails every regular file's fsync with ENOSPC, as a full disk can; the run
# resumed from ckpt-64 in its --checkpoint-dir and writes no periodic one.
cat >"$T/enospc.c" <<'EOF2'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/stat.h>
int fsync(int fd)
{
    static int (*real)(int);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "fsync");
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        errno = ENOSPC;
        return -1;
    }
    return real(fd);
}
EOF2
if ${CC:-cc} -shared -fPIC -o "$T/enospc.so" "$T/enospc.c" -ldl 2>"$T/cc.err"; then
    ND="$T/ck-nospace"
    run "${TRAIN[@]}" --devices cpu:2 --epochs 1 --batch 8 --quiet --checkpoint-dir "$ND"
    : >"$T/err"
    LD_PRELOAD="$T/enospc.so" "$BIN" "${TRAIN[@]}" --devices cpu:2 --epochs 100000 \
        --resume "$ND" --checkpoint-dir "$ND" --checkpoint-every 1000000 >"$T/out" 2>"$T/err" &
    BGPID=$!
    wait_for "$BGPID" grep -q '^epoch 2/' "$T/err"
    kill -TERM "$BGPID" 2>/dev/null
    wait_at_most "$BGPID" 60
    BGPID=""
    want="; the newest checkpoint is $ND/ckpt-000000000064.safetensors (step 64), which this run \
resumed from"
    if [[ $rc -eq 143 && "$(names "$ND")" == "ckpt-000000000064.safetensors " ]] &&
        grep -q "^castor: interrupted after step [0-9]*; cannot write the checkpoint .*: No space \
left on device (the temporary file [^)]*)$want\$" "$T/err"; then
        ok "the interrupt checkpoint cannot be written -> 143, the one resumed from named"
    else
        bad "the interrupt checkpoint cannot be written: status $rc" "$(tail -n 2 "$T/err"; names "$ND")"
    fi
else
    bad "cc could not build the ENOSPC shim" "$(cat "$T/cc.err")"
fi

# ---- a file size limit or a log pipe that goes away does not kill a run ----------------------
# default_signals [--broken-stderr] CMD...: exec CMD with SIGPIPE and SIGXFSZ
# at their default action, as a shell or a job system starts it (whatever
# runs this script may have them ignored, and ignored they stay across exec,
# hiding what they do); with --broken-stderr, stderr is a pipe whose reader
# is gone. Run it in a subshell or in the background: it execs.
default_signals() {
    exec python3 -c '
import os, signal, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
args = sys.argv[1:]
if args[0] == "--broken-stderr":
    r, w = os.pipe()
    os.close(r)
    os.dup2(w, 2)
    os.close(w)
    args = args[1:]
os.execv(args[0], args)' "$@"
}
# A checkpoint over the file size limit (RLIMIT_FSIZE, ulimit -f: 64 KiB here,
# a checkpoint 100 KB) fails to write and the run says so (SIGXFSZ killed it
# mid-write: status 153, no message, the temporary file left behind).
(ulimit -f 64 && default_signals "$BIN" "${TRAIN[@]}" --devices cpu:2 --epochs 2 --batch 64 \
    --checkpoint-dir "$T/ck-fsize" --quiet) >"$T/out" 2>"$T/err"
rc=$?
if [[ $rc -eq 1 && $(lines "$T/err") -eq 1 ]] &&
    grep -q '^castor: cannot write the checkpoint .*-000000000008.safetensors: .*File too large' \
        "$T/err" && grep -q '; there is no earlier checkpoint$' "$T/err" &&
    [[ -z "$(find "$T/ck-fsize" -name '*.tmp.*' 2>/dev/null)" ]]; then
    ok "a checkpoint over the file size limit -> 1, no temporary file: $(head -c 80 "$T/err")"
else
    bad "a checkpoint over the file size limit: status $rc" \
        "$(cat "$T/err"; ls -la "$T/ck-fsize" 2>&1)"
fi
# --save over the file size limit (a full disk, as far as the run can tell):
# the test evaluation and the report still come, then where the model is,
# and status 1 (the whole run's results were thrown away with the model).
(ulimit -f 64 && default_signals "$BIN" "${TRAIN[@]}" --devices cpu:2 --epochs 1 --batch 64 \
    --save "$T/fsize.safetensors") >"$T/out" 2>"$T/err"
rc=$?
if [[ $rc -eq 1 ]] && grep -q '^test: ' "$T/out" &&
    grep -q '^castor: --save .*File too large' "$T/err" &&
    tail -n 1 "$T/err" | grep -qx 'castor: --save failed (above); the trained model was not saved anywhere'; then
    ok "a --save over the file size limit -> the results, where the model is not, 1"
else
    bad "a --save over the file size limit: status $rc" "$(cat "$T/out" "$T/err")"
fi
# ... and of a resumed run with nothing left to train, the model is the file
# it resumed from (it said "not saved anywhere").
run train --data "$DATA" --layers 32:relu,10 --devices cpu --epochs 1 --batch 64 --quiet \
    --save "$T/done.safetensors"
(ulimit -f 64 && default_signals "$BIN" train --data "$DATA" --resume "$T/done.safetensors" \
    --epochs 1 --save "$T/fsize-resumed.safetensors" --quiet) >"$T/out" 2>"$T/err"
rc=$?
if [[ $rc -eq 1 ]] && grep -q '^test: ' "$T/out" &&
    tail -n 1 "$T/err" | grep -qx "castor: --save failed (above); the model is the one resumed from, $T/done.safetensors"; then
    ok "a --save that fails after a resume with nothing to train: the resumed file named"
else
    bad "a --save that fails after a resume with nothing to train: status $rc" "$(cat "$T/err")"
fi
# stderr a pipe nobody reads any more (castor train ... 2>&1 | tee log, and tee
# gone, ended by the same Ctrl-C say): the run goes on to keep its checkpoints
# and --save, and a signal still ends it with 143 and a checkpoint (SIGPIPE
# killed it at the first epoch line: no checkpoint, no model, status 141).
(default_signals --broken-stderr "$BIN" "${TRAIN[@]}" --devices cpu:2 --epochs 2 --batch 64 \
    --checkpoint-dir "$T/ck-pipe" --save "$T/pipe.safetensors" --json) >"$T/out"
rc=$?
if [[ $rc -eq 0 && -s "$T/pipe.safetensors" && $(newest_step "$T/ck-pipe") -eq 16 ]] &&
    tail -n 1 "$T/out" | grep -q '"global_step":16,'; then
    ok "stderr a broken pipe: the run ends, its checkpoints and --save written"
else
    bad "stderr a broken pipe: status $rc" \
        "$(ls -la "$T/ck-pipe" "$T/pipe.safetensors" 2>&1)"
fi
default_signals --broken-stderr "$BIN" "${TRAIN[@]}" --devices cpu:2 --epochs 100000 --batch 8 \
    --checkpoint-dir "$T/ck-pipe-term" --checkpoint-every 64 >/dev/null &
BGPID=$!
reached() { [[ $(newest_step "$1") -ge $2 ]]; } # reached DIR STEP: a checkpoint that far
wait_for "$BGPID" reached "$T/ck-pipe-term" 64
kill -TERM "$BGPID" 2>/dev/null
wait "$BGPID"
rc=$?
BGPID=""
if [[ $rc -eq 143 && $(newest_step "$T/ck-pipe-term") -ge 64 ]]; then
    ok "stderr a broken pipe, SIGTERM -> 143, a checkpoint of step $(newest_step "$T/ck-pipe-term")"
else
    bad "stderr a broken pipe, SIGTERM: status $rc, newest step $(newest_step "$T/ck-pipe-term")" \
        "$(ls -la "$T/ck-pipe-term" 2>&1)"
fi

# ---- --resume that cannot work: one line, the right status, nothing on disk changed ----------
mkdir -p "$T/ck-empty" "$T/ck-bad"
cp "$SAVED" "$T/ck-bad/ckpt-000000000001.safetensors"
head -c 3000 "$SAVED" >"$T/ck-bad/ckpt-000000000002.safetensors"
before=$(snapshot "$T/ck-empty" "$T/ck-bad" "$SAVED")
expect_error 1 "--resume an empty directory" "${TRAIN[@]}" --resume "$T/ck-empty" --checkpoint-dir "$T/ck-new"
expect_error 1 "--resume a missing path" "${TRAIN[@]}" --resume "$T/no-such-dir"
expect_error 1 "--resume DIR whose newest checkpoint is truncated" "${TRAIN[@]}" --resume "$T/ck-bad" \
    --checkpoint-dir "$T/ck-new" --save "$T/never.safetensors"
# ... says how to go on from the one before (it gave the reason alone, and
# --resume of the older one into DIR is refused while a newer one is there)
grep -q "(to resume from the checkpoint before it, $T/ck-bad/ckpt-000000000001.safetensors, move \
this one out of $T/ck-bad)\$" "$T/err" || bad "the error does not say how to go on" "$(cat "$T/err")"
expect_error 1 "--resume a truncated FILE" "${TRAIN[@]}" --resume "$T/truncated.safetensors"
expect_error 1 "--resume an IDX file" "${TRAIN[@]}" --resume "$DATA/t10k-labels-idx1-ubyte.gz"
# (with the file's --lr: TRAIN's 0.01 was refused in its place, and the
# --layers check went untested)
expect_error 2 "--resume with conflicting --layers" "${TRAIN[@]}" --lr 0.001 --layers 64:relu,10 \
    --resume "$SAVED" --checkpoint-dir "$T/ck-new" --save "$T/never.safetensors"
grep -q -- "^castor: --layers '64:relu,10' differs from the checkpoint $SAVED, which has \
'32:relu,10:linear'" "$T/err" || bad "the error does not name --layers" "$(cat "$T/err")"
# $SAVED was trained with --lr 0.001 and otherwise TRAIN's flags.
for flag in "optimizer sgd" "lr 0.5" "seed 7" "loss mse"; do
    expect_error 2 "--resume with conflicting --$flag" "${TRAIN[@]}" --lr 0.001 --resume "$SAVED" \
        "--${flag/ /=}"
    if ! grep -q -- "--${flag%% *}" "$T/err"; then bad "the error does not name --${flag%% *}" "$(cat "$T/err")"; fi
done
# --optimizer with a flag of its own: the optimizer is what differs (it blamed
# --momentum, which "applies to --optimizer sgd only", where --optimizer sgd was given)
expect_error 2 "--resume an adam checkpoint with --optimizer sgd --momentum 0.9" "${TRAIN[@]}" \
    --resume "$SAVED" --optimizer sgd --momentum 0.9
grep -q -- "^castor: --optimizer sgd differs from the checkpoint .*, which has adam" "$T/err" ||
    bad "the error does not name --optimizer" "$(cat "$T/err")"
expect_error 2 "--resume with bad --layers" "${TRAIN[@]}" --layers 32:frob,10 --resume "$SAVED"
# Without --optimizer the file's (adam) decides which flags mean something.
for flag in "momentum 0" "nesterov" "weight-decay 0"; do
    # shellcheck disable=SC2086
    expect_error 2 "--resume an adam checkpoint with --$flag" train --data "$DATA" --resume "$SAVED" \
        --epochs 1 --${flag}
    grep -q -- "--${flag%% *} applies to --optimizer .* only, and the checkpoint .* is adam" "$T/err" ||
        bad "the error does not say why" "$(cat "$T/err")"
done
expect_error 2 "--checkpoint-every without --checkpoint-dir" "${TRAIN[@]}" --checkpoint-every 3
expect_error 2 "--keep without --checkpoint-dir" "${TRAIN[@]}" --keep 2
expect_error 2 "--checkpoint-every 0" "${TRAIN[@]}" --checkpoint-dir "$T/ck-new" --checkpoint-every 0
expect_error 2 "--checkpoint-every weekly" "${TRAIN[@]}" --checkpoint-dir "$T/ck-new" --checkpoint-every weekly
grep -q "give a number of steps or 'epoch'" "$T/err" || bad "the error does not say what is wanted" "$(cat "$T/err")"
run "${TRAIN[@]}" --epochs 1 --batch 64 --checkpoint-dir "$T/ck-EPOCH" --checkpoint-every EPOCH --quiet
if [[ $rc -eq 0 && -e "$T/ck-EPOCH/ckpt-000000000008.safetensors" ]]; then
    ok "--checkpoint-every EPOCH, in any case as the other names"
else
    bad "--checkpoint-every EPOCH: status $rc" "$(cat "$T/err")"
fi
expect_error 2 "--keep 0" "${TRAIN[@]}" --checkpoint-dir "$T/ck-new" --keep 0
expect_error 2 "--save a directory" "${TRAIN[@]}" --epochs 1 --save "$T"
# Refused before training, the path named once (it was after training, twice).
mkfifo "$T/fifo"
for target in /dev/null "$T/fifo"; do
    expect_error 2 "--save $target (not a regular file)" "${TRAIN[@]}" --epochs 1 --save "$target"
    if [[ $(grep -o -F -- "$target" "$T/err" | wc -l) -ne 1 ]] || grep -q 'epoch' "$T/err"; then
        bad "--save $target: the path more than once, or training ran" "$(cat "$T/err")"
    fi
done
rm -f "$T/fifo"
# A file name longer than the filesystem allows (NAME_MAX, 255 bytes): refused
# before training (the run trained, then failed at the rename, the model lost).
expect_error 2 "--save a name of 300 bytes" "${TRAIN[@]}" --epochs 1 \
    --save "$T/$(printf 'n%.0s' {1..300})"
if ! grep -q 'File name too long$' "$T/err" || grep -q 'epoch' "$T/err"; then
    bad "--save a name of 300 bytes: the reason missing, or training ran" "$(cat "$T/err")"
fi
expect_error 1 "--save into a missing directory" "${TRAIN[@]}" --epochs 1 --save "$T/no-such-dir/m.safetensors"
# --save to a symbolic link writes the file it leads to and keeps the link
# (it put a plain file in the link's place and left its target stale); a
# link into a missing directory is refused before training, as that
# directory is where the file goes.
mkdir -p "$T/store" "$T/links"
ln -s ../store/model.safetensors "$T/links/model.safetensors"
run "${TRAIN[@]}" --epochs 1 --batch 64 --quiet --save "$T/links/model.safetensors"
if [[ $rc -eq 0 && -L "$T/links/model.safetensors" && -f "$T/store/model.safetensors" ]] &&
    ! compgen -G "$T/store/*.tmp.*" >/dev/null; then
    ok "--save through a symbolic link: the link stays, its target is written"
else
    bad "--save through a symbolic link: status $rc" "$(ls -l "$T/links" "$T/store"; cat "$T/err")"
fi
ln -s ../no-such-dir/m.safetensors "$T/links/dangling.safetensors"
expect_error 1 "--save a link into a missing directory" "${TRAIN[@]}" --epochs 1 \
    --save "$T/links/dangling.safetensors"
if ! grep -q 'no-such-dir does not exist$' "$T/err" || grep -q 'epoch' "$T/err"; then
    bad "--save a link into a missing directory: not named, or training ran" "$(cat "$T/err")"
fi
rm -rf "$T/store" "$T/links"
# ... unless --checkpoint-dir makes it (it was refused: "the directory ... does
# not exist", of the directory the run was about to make); a --save that still
# cannot be written leaves no directory made for --checkpoint-dir behind.
run "${TRAIN[@]}" --epochs 1 --batch 64 --quiet --checkpoint-dir "$T/out-new/ck" \
    --save "$T/out-new/model.safetensors"
if [[ $rc -eq 0 && -s "$T/out-new/model.safetensors" && -d "$T/out-new/ck" ]]; then
    ok "--save into the directory that --checkpoint-dir makes"
else
    bad "--save into the directory that --checkpoint-dir makes: status $rc" "$(cat "$T/err")"
fi
expect_error 1 "--save into a missing directory, with --checkpoint-dir" "${TRAIN[@]}" --epochs 1 \
    --checkpoint-dir "$T/out-gone/ck" --save "$T/out-gone/none/m.safetensors"
[[ ! -e "$T/out-gone" ]] || bad "the directories made for --checkpoint-dir stayed" "$(ls -R "$T/out-gone")"
# A file where its directory should be is named as that, not as a directory missing
expect_error 1 "--save under a file" "${TRAIN[@]}" --epochs 1 --save "$SAVED/m.safetensors"
if ! grep -q "$SAVED is not a directory" "$T/err" || grep -q 'does not exist' "$T/err"; then
    bad "--save under a file: want '$SAVED is not a directory'" "$(cat "$T/err")"
fi
expect_error 1 "--checkpoint-dir that is a file" "${TRAIN[@]}" --epochs 1 --checkpoint-dir "$SAVED"
# A checkpoint that cannot be written stops training with an error (here a
# directory stands where the second checkpoint would go), which names the
# newest checkpoint, intact, to resume from (it was left unmentioned).
mkdir -p "$T/ck-fail/ckpt-000000000008.safetensors"
run "${TRAIN[@]}" --devices cpu:2 --epochs 2 --batch 64 --checkpoint-dir "$T/ck-fail" \
    --checkpoint-every 4 --save "$T/never.safetensors" --quiet
if [[ $rc -eq 1 && $(lines "$T/err") -eq 1 ]] &&
    grep -q '^castor: cannot write the checkpoint .*ckpt-000000000008.safetensors: .*step 8' "$T/err" &&
    grep -q "; the newest checkpoint is $T/ck-fail/ckpt-000000000004.safetensors (step 4)\$" \
        "$T/err" &&
    [[ "$(names "$T/ck-fail")" == "ckpt-000000000004.safetensors ckpt-000000000008.safetensors " ]]; then
    ok "a checkpoint that cannot be written -> 1: $(head -c 100 "$T/err")"
else
    bad "a checkpoint that cannot be written: status $rc" "$(cat "$T/err"; ls -la "$T/ck-fail")"
fi
# The checkpoint at the end of training failing (here a directory where it
# would go, as a full disk would) still leaves the trained model in --save,
# which may be on another disk (training was over, but the model was dropped):
# written after fit (--checkpoint-every 5) or as the last epoch's (epoch).
for every in 5 epoch; do
    rm -rf "$T/ck-lastfail" "$T/lastfail.safetensors"
    mkdir -p "$T/ck-lastfail/ckpt-000000000016.safetensors"
    run "${TRAIN[@]}" --devices cpu:2 --epochs 2 --batch 64 --checkpoint-dir "$T/ck-lastfail" \
        --checkpoint-every "$every" --save "$T/lastfail.safetensors" --quiet
    if [[ $rc -eq 1 && $(lines "$T/err") -eq 2 ]] &&
        grep -q '^castor: cannot write the checkpoint .*ckpt-000000000016.safetensors: ' "$T/err" &&
        grep -q "^castor: the trained model is saved in $T/lastfail.safetensors\$" "$T/err" &&
        ! grep -q 'training stopped' "$T/err" &&
        [[ "$(python3 - "$T/lastfail.safetensors" 2>&1 <<'EOF'
import sys
import ckpt_file
print(ckpt_file.meta(sys.argv[1])["step"])
EOF
)" == 16 ]]; then
        ok "the last checkpoint (--checkpoint-every $every) cannot be written -> 1, --save written"
    else
        bad "the last checkpoint (--checkpoint-every $every) cannot be written: status $rc" \
            "$(cat "$T/err"; ls -la "$T/lastfail.safetensors" 2>&1)"
    fi
done
# Step 4 of 8 in an epoch over 512 samples: finishing it over 448 (or
# unshuffled) would visit some samples twice and others never (it trained on).
expect_error 2 "--resume mid-epoch with another --validation-split" "${TRAIN[@]}" --devices cpu:2 \
    --epochs 2 --resume "$T/ck-fail/ckpt-000000000004.safetensors" --validation-split 64
grep -q -- "over 512 training samples.*has 448 (after --validation-split 64)" "$T/err" ||
    bad "the error does not give both sample counts and the split" "$(cat "$T/err")"
# Data of other features: that is what is said, not its sample count (the
# mid-epoch check came first and named only the 16000 samples).
expect_error 2 "--resume mid-epoch on data of other features" train --data "$BIG" \
    --devices cpu:2 --epochs 2 --resume "$T/ck-fail/ckpt-000000000004.safetensors"
grep -q -- "the model takes 256 features per sample but the data in $BIG has 784" "$T/err" ||
    bad "--resume mid-epoch on other features: not the features' message" "$(cat "$T/err")"
# Nor with another --batch: the epoch's permutation is cut in its batches
# (refused before anything runs, saying which flag to leave out).
expect_error 2 "--resume mid-epoch with another --batch" "${TRAIN[@]}" --devices cpu:2 \
    --epochs 2 --resume "$T/ck-fail/ckpt-000000000004.safetensors" --batch 32
grep -q -- "^castor: --batch 32 differs from the checkpoint .*, which is 4 steps into an epoch \
of batch 64 (finish the epoch with that batch: leave --batch out)\$" "$T/err" ||
    bad "--resume mid-epoch with another --batch: not the batch's message" "$(cat "$T/err")"
# At an epoch boundary, --validation-split left out of --resume defaults to
# the run's own (the file trained on 448 of the 512 samples): the result is
# the uninterrupted run's, and the held-out samples were never trained on.
run "${TRAIN[@]}" --epochs 2 --batch 64 --validation-split 64 --quiet --json
whole=$(tail -n 1 "$T/out")
run "${TRAIN[@]}" --epochs 1 --batch 64 --validation-split 64 --quiet --checkpoint-dir "$T/ck-vs"
run "${TRAIN[@]}" --epochs 2 --resume "$T/ck-vs" --json
if [[ $rc -eq 0 ]] && grep -q -- '^castor: --validation-split 64, as .* trained on 448 of the 512' "$T/err" &&
    tail -n 1 "$T/out" | python3 -c '
import json, sys
d, w = json.loads(sys.stdin.read()), json.loads(sys.argv[1])
assert d["validation_samples"] == 64 and d["train_samples"] == 448, d
for k in ("test_loss", "test_accuracy", "val_loss", "val_accuracy"):
    assert d[k] == w[k], (k, d[k], w[k])' "$whole"; then
    ok "--resume at an epoch boundary keeps the run's --validation-split: as if never stopped"
else
    bad "--resume left out --validation-split: status $rc" "$(tail -n 1 "$T/out"; cat "$T/err")"
fi
run "${TRAIN[@]}" --epochs 2 --resume "$T/ck-vs" --validation-split 0 --quiet --json
if [[ $rc -eq 0 ]] && grep -q 'warning: .* trained its epochs on 448 samples; this run trains on 512' "$T/err"; then
    ok "--resume with another --validation-split at an epoch boundary: a warning"
else
    bad "--resume with another --validation-split: status $rc" "$(cat "$T/err")"
fi
# Another --batch is refused only part-way through an epoch: at its boundary
# the next epoch may take any.
run "${TRAIN[@]}" --epochs 2 --resume "$T/ck-vs" --batch 32 --quiet --json
if [[ $rc -eq 0 ]] && tail -n 1 "$T/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["batch"] == 32 and d["steps"] == 14, d'; then
    ok "--resume at an epoch boundary with another --batch trains with it"
else
    bad "--resume at an epoch boundary with --batch 32: status $rc" "$(tail -n 1 "$T/out"; cat "$T/err")"
fi
after=$(snapshot "$T/ck-empty" "$T/ck-bad" "$SAVED")
if [[ "$before" == "$after" && ! -e "$T/ck-new" && ! -e "$T/never.safetensors" ]]; then
    ok "the failed resumes and outputs changed nothing on disk"
else
    bad "the failed resumes changed files" \
        "$(diff <(echo "$before") <(echo "$after"); ls -d "$T/ck-new" "$T/never.safetensors" 2>&1)"
fi

# ---- paths of thousands of bytes: the reason still ends the message ---------------------------
# (messages were cut at 512 bytes in the library and 1024 in the CLI)
LONG="$T/long"
for _ in 1 2 3 4 5; do LONG="$LONG/$(printf 'd%.0s' {1..200})"; done
mkdir -p "$LONG"
echo junk >"$LONG/bad.safetensors"
expect_error 1 "eval --model <1 KB path>, missing" eval --model "$LONG/none.safetensors" --data "$DATA"
grep -q 'none.safetensors: cannot open: No such file or directory$' "$T/err" ||
    bad "the reason was cut off" "$(tail -c 200 "$T/err")"
expect_error 1 "--resume <1 KB path>, not a checkpoint" "${TRAIN[@]}" --resume "$LONG/bad.safetensors"
grep -q 'bad.safetensors: truncated: .* bytes, too short .*safetensors file$' "$T/err" ||
    bad "the reason was cut off" "$(tail -c 200 "$T/err")"
expect_error 1 "--data <1 KB path> without the files" train --data "$LONG" --epochs 1
grep -q "$(printf 'd%.0s' {1..20}): missing train-images-idx3-ubyte" "$T/err" ||
    bad "the reason was cut off" "$(tail -c 200 "$T/err")"

# A --checkpoint-dir whose checkpoint names would be too long: refused (2)
# before any directory is made (it made the 17 of them, then refused).
TOOLONG="$T/toolong"
while [[ ${#TOOLONG} -lt 4060 ]]; do TOOLONG="$TOOLONG/$(printf 'e%.0s' {1..200})"; done
TOOLONG=${TOOLONG:0:4080}
expect_error 2 "--checkpoint-dir whose checkpoints' names are too long" "${TRAIN[@]}" --epochs 1 \
    --checkpoint-dir "$TOOLONG"
grep -q 'path too long$' "$T/err" || bad "the error does not say why" "$(tail -c 100 "$T/err")"
[[ ! -e "$T/toolong" ]] || bad "directories were made for it" "$(find "$T/toolong" | wc -l)"
# ... and one whose checkpoints' names fit but not their temporary files'
# (.tmp.XXXXXX more): refused too (it trained an epoch, then failed to write
# the first); as --save of such a name (it failed after the training).
NEARLY="$T/nearly"
while [[ ${#NEARLY} -lt 3860 ]]; do NEARLY="$NEARLY/$(printf 'e%.0s' {1..200})"; done
NEARLY="$NEARLY/$(printf 'f%.0s' {1..250})"
NEARLY=${NEARLY:0:4060}  # + /ckpt-<12 digits>.safetensors: 4090 bytes; + .tmp.XXXXXX: 4101
expect_error 2 "--checkpoint-dir whose checkpoints' temporary names are too long" "${TRAIN[@]}" \
    --epochs 1 --checkpoint-dir "$NEARLY"
if ! grep -q 'path too long$' "$T/err" || [[ -e "$T/nearly" ]]; then
    bad "... the error does not say why, or directories were made" "$(tail -c 100 "$T/err")"
fi
mkdir -p "${NEARLY:0:4050}"
expect_error 2 "--save a path of 4091 bytes" "${TRAIN[@]}" --epochs 1 \
    --save "${NEARLY:0:4050}/$(printf 'g%.0s' {1..40})"
grep -q 'path too long$' "$T/err" || bad "... the error does not say why" "$(tail -c 100 "$T/err")"
rm -rf "$T/nearly"

# ---- a --checkpoint-dir given with a trailing slash names files without "//" ---------------
run "${TRAIN[@]}" --epochs 1 --batch 64 --checkpoint-dir "$T/ck-slash/" --quiet
if [[ $rc -eq 0 ]] && ! grep -q '//' "$T/out" "$T/err" &&
    grep -q "the newest $T/ck-slash/ckpt-000000000008.safetensors\$" "$T/out"; then
    ok "--checkpoint-dir DIR/: paths without '//'"
else
    bad "--checkpoint-dir DIR/: status $rc" "$(cat "$T/out" "$T/err")"
fi

# ---- a diverged run stops, and writes no model that is not finite -------------------------
# (it trained on to the end, wrote checkpoints of NaN variables that pruned
# the good ones, and --save of them, with a warning and status 0).
DV="$T/ck-diverged"
run "${TRAIN[@]}" --loss mse --optimizer sgd --lr 1000 --epochs 2 --batch 8 --validation-split 64 \
    --save "$T/diverged.safetensors" --checkpoint-dir "$DV" --checkpoint-every 1 --keep 2
dstep=$(sed -n 's/^castor: training diverged at step \([0-9]*\): the training loss is .*/\1/p' \
    "$T/err")
kept=$(newest_step "$DV")
if [[ $rc -eq 1 && -n "$dstep" && ! -e "$T/diverged.safetensors" && "$kept" == $((dstep - 1)) ]] &&
    grep -q "stopped (no --save, no checkpoint of it); the newest checkpoint is $DV/" "$T/err" &&
    python3 - "$DV"/ckpt-*.safetensors <<'EOF'
import math, sys
import ckpt_file
for path in sys.argv[1:]:
    h, data = ckpt_file.read(path)
    for name in h:
        if name != "__metadata__":
            assert all(math.isfinite(v) for v in ckpt_file.floats(h, data, name)), (path, name)
EOF
then
    ok "a diverged run -> 1 at step $dstep, no --save, its checkpoints finite (newest step $kept)"
else
    bad "a diverged run: status $rc, step '$dstep', newest checkpoint '$kept'" \
        "$(cat "$T/err"; ls "$DV" "$T/diverged.safetensors" 2>&1)"
fi
# The variables of the last step's update overflow where its loss did not:
# a model resumed with a huge first-layer bias (1e18) and --lr 1000, one
# step of the whole set per epoch.
run train --data "$DATA" --layers 32:relu,10 --loss mse --optimizer sgd --lr 0.1 --epochs 1 \
    --batch 512 --seed 1 --quiet --save "$T/dv-base.safetensors"
poison() { # poison FROM TO VALUE: every dense_0.bias value set, --lr 1000, the CRC made right
    python3 - "$@" <<'EOF'
import sys
import ckpt_file
h, data = ckpt_file.read(sys.argv[1])
n = len(ckpt_file.floats(h, data, "dense_0.bias"))
ckpt_file.set_floats(h, data, "dense_0.bias", [float(sys.argv[3])] * n)
h["__metadata__"]["learning_rate"] = "1000"
ckpt_file.write(sys.argv[2], h, data)
EOF
}
poison "$T/dv-base.safetensors" "$T/dv-huge.safetensors" 1e18
for with in save checkpoint; do
    extra=(--save "$T/dv-out.safetensors")
    [[ $with == checkpoint ]] && extra+=(--checkpoint-dir "$T/ck-dv-huge")
    run train --data "$DATA" --resume "$T/dv-huge.safetensors" --epochs 2 --quiet "${extra[@]}"
    if [[ $rc -eq 1 && ! -e "$T/dv-out.safetensors" && ! -e "$T/ck-dv-huge" ]] &&
        grep -q '^castor: training diverged at step 2: its variables or optimizer state are' "$T/err"; then
        ok "the last step's variables not finite, with --$with: 1, nothing written"
    else
        bad "the last step's variables not finite, with --$with: status $rc" \
            "$(cat "$T/err"; ls "$T/dv-out.safetensors" "$T/ck-dv-huge" 2>&1)"
    fi
done
# eval and predict of a model with NaN variables print nan, not -nan
poison "$T/dv-base.safetensors" "$T/diverged.safetensors" nan
run eval --model "$T/diverged.safetensors" --data "$DATA"
if [[ $rc -eq 0 ]] && grep -q '^test: *loss nan ' "$T/out" && ! grep -q -- '-nan' "$T/out"; then
    ok "eval of a diverged model: 'loss nan'"
else
    bad "eval of a diverged model: status $rc" "$(cat "$T/out" "$T/err")"
fi
run predict --model "$T/diverged.safetensors" --data "$DATA" --limit 3
if [[ $rc -eq 0 ]] && [[ $(grep -c '^[0-9] .* nan ' "$T/out") -eq 3 ]] && ! grep -q -- '-nan' "$T/out"; then
    ok "predict of a diverged model: outputs 'nan'"
else
    bad "predict of a diverged model: status $rc" "$(cat "$T/out" "$T/err")"
fi

# A softmax model whose outputs are NaN is right about no sample: its
# accuracy was the share of label 0 (argmax stayed at unit 0), and predict
# said class 0 for every sample.
run train --data "$DATA" --layers 32:relu,10 --epochs 1 --batch 512 --seed 1 --quiet \
    --save "$T/dvx-base.safetensors"
poison "$T/dvx-base.safetensors" "$T/diverged-xent.safetensors" nan
run eval --model "$T/diverged-xent.safetensors" --data "$DATA"
if [[ $rc -eq 0 ]] && grep -q '^test: *loss nan  accuracy 0.0000 ' "$T/out"; then
    ok "eval of a softmax model with NaN outputs: accuracy 0"
else
    bad "eval of a softmax model with NaN outputs: status $rc" "$(cat "$T/out" "$T/err")"
fi
run predict --model "$T/diverged-xent.safetensors" --data "$DATA" --limit 3 --json
if [[ $rc -eq 0 ]] && python3 -c '
import json, sys
rows = json.load(open(sys.argv[1]))
assert len(rows) == 3 and all(r["predicted"] is None for r in rows), rows
' "$T/out" 2>"$T/py"; then
    ok "predict of a softmax model with NaN outputs: predicted null"
else
    bad "predict of a softmax model with NaN outputs: status $rc" "$(cat "$T/out" "$T/py")"
fi

# ... and one whose largest logit is +inf (a bias of inf): the library's
# loss is NaN there, so no hit, and predict says no class (it said one,
# marked right where it was the label).
python3 - "$T/dvx-base.safetensors" "$T/inf-logit.safetensors" <<'EOF'
import sys
import ckpt_file
h, data = ckpt_file.read(sys.argv[1])
bias = list(ckpt_file.floats(h, data, "dense_1.bias"))
bias[3] = float("inf")
ckpt_file.set_floats(h, data, "dense_1.bias", bias)
ckpt_file.write(sys.argv[2], h, data)
EOF
run eval --model "$T/inf-logit.safetensors" --data "$DATA"
eval_ok=$([[ $rc -eq 0 ]] && grep -q '^test: *loss nan  accuracy 0.0000 ' "$T/out" && echo 1)
run predict --model "$T/inf-logit.safetensors" --data "$DATA" --limit 5 --json
if [[ $eval_ok == 1 && $rc -eq 0 ]] && python3 -c '
import json, sys
rows = json.load(open(sys.argv[1]))
assert len(rows) == 5 and all(r["predicted"] is None for r in rows), rows
' "$T/out" 2>"$T/py"; then
    ok "a logit of +inf: eval counts no hit, predict says no class"
else
    bad "a logit of +inf: eval and predict disagree" "$(cat "$T/out" "$T/py" "$T/err")"
fi

# A file of the variables alone (the optimizer state dropped on export from
# Python) names the first tensor it lacks and why castor wants it (it said
# only "the tensors hold only 8554").
python3 - "$T/dvx-base.safetensors" "$T/weights-only.safetensors" <<'EOF'
import sys
import ckpt_file
h, data = ckpt_file.read(sys.argv[1])
out = bytearray()
for name in sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0]):
    s, e = h[name]["data_offsets"]
    if ".adam" in name:
        del h[name]
        continue
    h[name]["data_offsets"] = [len(out), len(out) + e - s]
    out += data[s:e]
ckpt_file.write(sys.argv[2], h, out)
EOF
run eval --model "$T/weights-only.safetensors" --data "$DATA"
if [[ $rc -ne 0 ]] && grep -q "tensor dense_0.kernel.adam_m is missing: a castor checkpoint carries the optimizer's state beside the variables" "$T/err"; then
    ok "a file of the variables alone: the missing optimizer tensor named"
else
    bad "a file of the variables alone: status $rc" "$(cat "$T/err")"
fi

# A checkpoint a program took 3 steps into an unshuffled epoch: castor train
# (which always shuffles) loaded everything, then said "finish it
# unshuffled", which none of its flags can do. Refused up front, in its own
# words.
run train --data "$DATA" --layers 16:relu,10 --epochs 1 --batch 64 --devices cpu \
    --checkpoint-dir "$T/ck-unshuf" --checkpoint-every 3 --keep 5 --quiet
python3 - "$T/ck-unshuf/ckpt-000000000003.safetensors" "$T/unshuffled.safetensors" <<'EOF'
import sys
import ckpt_file
h, data = ckpt_file.read(sys.argv[1])
assert h["__metadata__"]["epoch_shuffle"] == "1", h["__metadata__"]
h["__metadata__"]["epoch_shuffle"] = "0"
ckpt_file.write(sys.argv[2], h, data)
EOF
run train --data "$DATA" --resume "$T/unshuffled.safetensors" --epochs 2 --quiet
if [[ $rc -eq 2 ]] && grep -q "^castor: --resume $T/unshuffled.safetensors is 3 steps into an epoch that a program started unshuffled; castor train always shuffles" "$T/err"; then
    ok "--resume of an unshuffled epoch in progress -> 2, up front, in the CLI's words"
else
    bad "--resume of an unshuffled epoch in progress: status $rc" "$(cat "$T/err")"
fi

# ... and training from it is refused before it starts, in --resume's words (fit refuses a
# model loaded with variables that are not finite; it trained a step into 'diverged' before)
run train --data "$DATA" --resume "$T/diverged.safetensors" --epochs 2 --quiet \
    --save "$T/dv-out.safetensors"
if [[ $rc -eq 1 && $(lines "$T/err") -eq 1 && ! -e "$T/dv-out.safetensors" ]] &&
    grep -q "^castor: --resume $T/diverged.safetensors: its variables or optimizer state are not finite" "$T/err"; then
    ok "--resume of a diverged model -> 1, before training"
else
    bad "--resume of a diverged model: status $rc" "$(cat "$T/err")"
fi

# ---- a read-only --checkpoint-dir is refused before training -------------------------------
# (it trained up to the first checkpoint, an epoch, then failed). Root writes
# anywhere: the run is made as nobody then.
RO="$T/ro-ck"
mkdir -p "$RO" && chmod 555 "$RO" && chmod 711 "$T"
as_user=()
if [[ $(id -u) -eq 0 ]]; then as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups); fi
# nobody must reach the binary (not so in a checkout under a private home).
if [[ $(id -u) -ne 0 ]] || { command -v setpriv >/dev/null 2>&1 && "${as_user[@]}" test -x "$BIN"; }; then
    chmod -R a+rX "$DATA"
    timeout 300 "${as_user[@]}" "$BIN" "${TRAIN[@]}" --epochs 2 --checkpoint-dir "$RO" --quiet \
        >"$T/out" 2>"$T/err"
    rc=$?
    if [[ $rc -eq 1 && $(lines "$T/err") -eq 1 ]] &&
        grep -q "^castor: --checkpoint-dir $RO: cannot write in it: " "$T/err"; then
        ok "a read-only --checkpoint-dir -> 1 before training: $(head -c 100 "$T/err")"
    else
        bad "a read-only --checkpoint-dir: status $rc" "$(cat "$T/err")"
    fi
else
    ok "a read-only --checkpoint-dir: skipped (root, and nobody cannot run $BIN)"
fi
# ---- --save into a directory that may be written in but not read: saved --------------------
# (a drop box, mode -wx: the file was written and renamed into place, but the
# directory could not be opened to fsync the rename, and castor said "--save
# failed (above); the trained model was not saved anywhere", status 1, with
# "saved": null). Root reads anywhere: the run is made as nobody then.
WX="$T/wx-save"
mkdir -p "$WX" && chmod 733 "$WX" && chmod 711 "$T"
# The owner, when not root, is kept out of reading it too.
[[ $(id -u) -ne 0 ]] && chmod 333 "$WX"
if [[ $(id -u) -ne 0 ]] || { command -v setpriv >/dev/null 2>&1 && "${as_user[@]}" test -x "$BIN"; }; then
    chmod -R a+rX "$DATA"
    timeout 300 "${as_user[@]}" "$BIN" "${TRAIN[@]}" --epochs 1 --batch 64 --quiet --json \
        --save "$WX/m.safetensors" >"$T/out" 2>"$T/err"
    rc=$?
    if [[ $rc -eq 0 && ! -s "$T/err" && -s "$WX/m.safetensors" ]] &&
        tail -n 1 "$T/out" | python3 -c '
import json, sys
assert json.loads(sys.stdin.read())["saved"] == sys.argv[1]' "$WX/m.safetensors" &&
        "$BIN" eval --model "$WX/m.safetensors" --data "$DATA" --quiet >/dev/null 2>&1; then
        ok "--save into a directory it cannot read (mode -wx) -> 0, the model saved"
    else
        bad "--save into a directory it cannot read: status $rc" "$(cat "$T/err"; tail -c 150 "$T/out")"
    fi
else
    ok "--save into a directory it cannot read: skipped (root, and nobody cannot run $BIN)"
fi
chmod 700 "$WX"
chmod 700 "$T"

# ---- the directory's fsync fails after the rename: the file is there, and said so ----------
# (castor said "--save failed (above); the trained model was not saved
# anywhere" of a model in place, and a checkpoint in place "cannot write").
# A shim fails with EIO the directory fsyncs after the first $DIR_EIO_AFTER.
cat >"$T/direio.c" <<'EOF2'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
int fsync(int fd)
{
    static int (*real)(int);
    static int dirs;
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "fsync");
    struct stat st;
    const char *after = getenv("DIR_EIO_AFTER");
    if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode) && ++dirs > (after ? atoi(after) : 0)) {
        errno = EIO;
        return -1;
    }
    return real(fd);
}
EOF2
if ${CC:-cc} -shared -fPIC -o "$T/direio.so" "$T/direio.c" -ldl 2>"$T/cc.err"; then
    rm -f "$T/eio.safetensors"
    LD_PRELOAD="$T/direio.so" run "${TRAIN[@]}" --epochs 1 --batch 64 --quiet --json \
        --save "$T/eio.safetensors"
    if [[ $rc -eq 1 && $(lines "$T/err") -eq 1 ]] && grep -qx "castor: --save \
$T/eio.safetensors: written, but fsync of its directory $T failed: Input/output error (it may \
not survive a crash)" "$T/err" && tail -n 1 "$T/out" | python3 -c '
import json, sys
assert json.loads(sys.stdin.read())["saved"] == sys.argv[1]' "$T/eio.safetensors" &&
        "$BIN" eval --model "$T/eio.safetensors" --data "$DATA" --quiet >/dev/null 2>&1; then
        ok "--save whose directory fsync fails -> the results, 'saved', the file there, 1"
    else
        bad "--save whose directory fsync fails: status $rc" "$(cat "$T/err"; tail -n 1 "$T/out")"
    fi
    # The second checkpoint's: it is in place, training stops, the first stays.
    ED="$T/ck-eio"
    DIR_EIO_AFTER=1 LD_PRELOAD="$T/direio.so" run "${TRAIN[@]}" --devices cpu:2 --epochs 2 \
        --batch 64 --checkpoint-dir "$ED" --checkpoint-every 4 --quiet
    if [[ $rc -eq 1 && $(lines "$T/err") -eq 1 &&
        "$(names "$ED")" == "ckpt-000000000004.safetensors ckpt-000000000008.safetensors " ]] &&
        grep -qx "castor: checkpoint $ED/ckpt-000000000008.safetensors: written, but fsync of \
its directory $ED failed: Input/output error (it may not survive a crash) (training stopped at \
step 8); the checkpoint before it is $ED/ckpt-000000000004.safetensors (step 4)" "$T/err"; then
        ok "a checkpoint whose directory fsync fails -> 1, in place, the one before it named"
    else
        bad "a checkpoint whose directory fsync fails: status $rc" "$(cat "$T/err"; names "$ED")"
    fi
else
    bad "cc could not build the directory EIO shim" "$(cat "$T/cc.err")"
fi

# ---- a signal after --save has written the model says where it is ------------------------
# (it said "progress lost"). A test set large enough that the signal, sent
# when the epoch line appears, lands before the save (the last step's
# callback: --save is written all the same), during it or in the evaluation.
BIG="$T/data-big"
mkdir -p "$BIG"
python3 - "$BIG" <<'EOF'
import gzip, os, struct, sys
for prefix, n in (("train", 64), ("t10k", 4096)):
    with gzip.open(os.path.join(sys.argv[1], prefix + "-images-idx3-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 16, 16) + os.urandom(n * 256))
    with gzip.open(os.path.join(sys.argv[1], prefix + "-labels-idx1-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(b % 10 for b in os.urandom(n)))
EOF
rm -f "$T/late.safetensors"
: >"$T/err"
signals_default "$BIN" train --data "$BIG" --layers 2048:relu,2048:relu,10 --devices cpu:2 \
    --batch 64 --epochs 1 --save "$T/late.safetensors" 2>"$T/err" >/dev/null &
BGPID=$!
wait_for "$BGPID" grep -q '^epoch 1/1' "$T/err"
kill -INT "$BGPID" 2>/dev/null
wait_at_most "$BGPID" 60
BGPID=""
if [[ $rc -eq 0 ]]; then
    ok "a signal after --save: skipped (the run ended before the signal came)"
elif [[ $rc -eq 130 && -s "$T/late.safetensors" ]] &&
    grep -Eq "^castor: interrupted (during the test evaluation, )?after training to step 1; \
the model is saved in $T/late.safetensors\$" "$T/err"; then
    ok "a signal after --save -> 130, says the model is saved"
else
    bad "a signal after --save: status $rc" "$(tail -n 3 "$T/err"; ls -la "$T/late.safetensors" 2>&1)"
fi

# ---- a signal in the last epoch's validation: training is done, --save writes it ----------
# (the validation ran whole, then the trained model was dropped: "interrupted
# after step 1; no checkpoint directory set, progress lost", no --save). One
# step of 200 samples, then a validation of 20000 samples that takes seconds
# here (1.8 s with the step on 2 busy cores): the signal, sent 1 s after the
# model is built, lands in it or in the step before it where the
# acknowledgement comes before the epoch's line; on a machine fast enough
# to be past the epoch by then, or slow enough not to have begun, it is
# skipped.
VAL="$T/data-val"
mkdir -p "$VAL"
python3 - "$VAL" <<'EOF'
import random, struct, sys
rng = random.Random(7)
for prefix, n in (("train", 20200), ("t10k", 100)):
    with open(f"{sys.argv[1]}/{prefix}-images-idx3-ubyte", "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + rng.randbytes(n * 784))
    with open(f"{sys.argv[1]}/{prefix}-labels-idx1-ubyte", "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(rng.randrange(10) for _ in range(n)))
EOF
rm -f "$T/in-val.safetensors"
: >"$T/err"
"$BIN" train --data "$VAL" --layers 2048:relu,2048:relu,10 --devices cpu:2 --batch 200 \
    --epochs 1 --validation-split 20000 --verbose --save "$T/in-val.safetensors" \
    >"$T/out" 2>"$T/err" &
BGPID=$!
wait_for "$BGPID" grep -q '^castor: model ' "$T/err"
sleep 1
kill -TERM "$BGPID" 2>/dev/null
wait_at_most "$BGPID" 120
BGPID=""
ack_at=$(grep -n -m 1 '^castor: SIGTERM: stopping' "$T/err" | cut -d: -f1)
epoch_at=$(grep -n -m 1 '^epoch 1/1 ' "$T/err" | cut -d: -f1)
if [[ -z "$epoch_at" ]]; then
    ok "SIGTERM in the last epoch's validation: skipped (the signal came before training)"
elif [[ $rc -eq 0 || -z "$ack_at" || $ack_at -gt $epoch_at ]]; then
    ok "SIGTERM in the last epoch's validation: skipped (the signal came after the epoch)"
elif [[ $rc -eq 143 && -s "$T/in-val.safetensors" && ! -s "$T/out" ]] &&
    grep -qxF "castor: interrupted after training to step 1; the model is saved in \
$T/in-val.safetensors" "$T/err" &&
    "$BIN" eval --model "$T/in-val.safetensors" --data "$VAL" --quiet >/dev/null 2>&1; then
    ok "SIGTERM in the last epoch's validation -> 143, the trained model in --save"
else
    bad "SIGTERM in the last epoch's validation: status $rc, --save: $(ls "$T/in-val.safetensors" \
2>&1)" "$(grep -v '^castor: \(info\|model\|data\|OpenBLAS\|--val\)' "$T/err")"
fi
rm -rf "$VAL"

# ---- a signal during the test evaluation stops it at its next batch ------------------------
# sigterm_in_eval NAME TEST_SAMPLES BATCH: trains 2048:relu,2048:relu,10 for
# one epoch on 200 random samples with --save, and sends SIGTERM 0.3 s after
# the save, inside the evaluation of TEST_SAMPLES samples in batches of
# BATCH; sets rc, sent (0: the run had ended before) and took (ms from the
# signal to the end).
sigterm_in_eval() {
    local name=$1 samples=$2 batch=$3 dir=$T/$1
    mkdir -p "$dir"
    python3 - "$dir" "$samples" <<'EOF'
import random, struct, sys
rng = random.Random(7)
for prefix, n in (("train", 200), ("t10k", int(sys.argv[2]))):
    with open(f"{sys.argv[1]}/{prefix}-images-idx3-ubyte", "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + rng.randbytes(n * 784))
    with open(f"{sys.argv[1]}/{prefix}-labels-idx1-ubyte", "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(rng.randrange(10) for _ in range(n)))
EOF
    : >"$T/err"
    "$BIN" train --data "$dir" --layers 2048:relu,2048:relu,10 --epochs 1 --batch "$batch" \
        --verbose --save "$T/$name.safetensors" >"$T/out" 2>"$T/err" &
    BGPID=$!
    local waited=0 start
    while ! grep -q '^castor: saved ' "$T/err" 2>/dev/null; do
        if ! kill -0 "$BGPID" 2>/dev/null || [[ $waited -ge 600 ]]; then break; fi
        sleep 0.1
        waited=$((waited + 1))
    done
    sleep 0.3
    start=$(date +%s%N)
    sent=0
    kill -TERM "$BGPID" 2>/dev/null && sent=1
    wait_at_most "$BGPID" 60
    BGPID=""
    took=$((($(date +%s%N) - start) / 1000000))
    rm -rf "$dir"
}
# Training was over: the evaluation ran to its end (minutes on a big test
# set: a scheduler's whole SIGTERM grace period) and its results were then
# thrown away, with "interrupted after step 2" as if training had been cut.
# 80000 test samples take about 10 s on the 2-core dev box; stopped, castor
# is gone within a batch of 100 (~20 ms).
sigterm_in_eval long-eval 80000 100
want="castor: interrupted during the test evaluation, after training to step 2; the model is \
saved in $T/long-eval.safetensors"
if [[ $rc -eq 143 && $took -lt 3000 && ! -s "$T/out" ]] && grep -qxF "$want" "$T/err"; then
    ok "SIGTERM in the test evaluation -> 143 in $took ms, says training was done and where it is"
else
    bad "SIGTERM in the test evaluation: status $rc after $took ms (want 143 within 3 s)" \
        "$(tail -n 3 "$T/err")"
fi
# A signal after the evaluation's last stop check (any time in a one-batch
# evaluation: --batch at least the test set) stopped nothing: the results
# were printed and the run exited 0, as if no signal had come; a
# scheduler's SIGTERM read as a run that ended by itself.
sigterm_in_eval one-batch 20000 20000
if [[ $sent -eq 0 ]]; then
    ok "SIGTERM in a one-batch test evaluation: skipped (the run ended before the signal)"
elif [[ $rc -eq 143 ]] && grep -q '^test: ' "$T/out" &&
    grep -qx "castor: interrupted after the test evaluation's last batch; the results are whole" \
        "$T/err"; then
    ok "SIGTERM in a one-batch test evaluation -> the results, then 143"
else
    bad "SIGTERM in a one-batch test evaluation: status $rc (want 143 after the results)" \
        "$(cat "$T/out"; tail -n 3 "$T/err")"
fi

# ---- a signal before training writes no checkpoint ---------------------------------------
# (it wrote the untrained model as ckpt-000000000000, and a fresh run into the
# directory was then refused). The data takes a moment to load: the signal
# lands while it loads; if the machine is so fast that training began, a
# checkpoint of a trained step is right too.
SLOW="$T/data-slow"
mkdir -p "$SLOW"
python3 - "$SLOW" <<'EOF'
import gzip, os, struct, sys
for prefix, n in (("train", 60000), ("t10k", 100)):
    with gzip.open(os.path.join(sys.argv[1], prefix + "-images-idx3-ubyte.gz"), "wb", 1) as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + os.urandom(n * 784))
    with gzip.open(os.path.join(sys.argv[1], prefix + "-labels-idx1-ubyte.gz"), "wb", 1) as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(b % 10 for b in os.urandom(n)))
EOF
# The directories made for it are taken back: an interrupted or failed run
# leaves no empty --checkpoint-dir of its own behind.
SD="$T/ck-early/a/b"
signals_default "$BIN" train --data "$SLOW" --layers 32:relu,10 --epochs 1 \
    --checkpoint-dir "$SD" >/dev/null 2>"$T/err" &
BGPID=$!
wait_for "$BGPID" catches_sigint "$BGPID"
kill -INT "$BGPID" 2>/dev/null
wait_at_most "$BGPID" 60
BGPID=""
if [[ $rc -eq 130 ]] && grep -q '^castor: interrupted before training; nothing to save$' "$T/err" &&
    [[ ! -e "$T/ck-early" ]]; then
    ok "a signal while the data loads -> 130, no checkpoint, no directory left"
elif [[ $rc -eq 130 ]] && [[ "$(newest_step "$SD")" -ge 1 ]] 2>/dev/null; then
    ok "a signal while the data loads: skipped (training had begun: a checkpoint of step $(newest_step "$SD"))"
else
    bad "a signal before training: status $rc, left '$(find "$T/ck-early" 2>&1)'" "$(cat "$T/err")"
fi

# ---- a test set that does not fit the model is refused before training -------------------
# (it was found only after the last epoch, the run lost, with status 1)
if python3 - "$T" <<'EOF'
import gzip, os, struct, sys
root = sys.argv[1]
def write(d, name, magic, dims, payload):
    os.makedirs(d, exist_ok=True)
    with gzip.open(os.path.join(d, name), "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", x) for x in dims) + payload)
def idx_set(d, prefix, n, side, classes):
    pixels = bytes((7 * i) % 256 for i in range(n * side * side))
    write(d, prefix + "-images-idx3-ubyte.gz", 0x803, (n, side, side), pixels)
    write(d, prefix + "-labels-idx1-ubyte.gz", 0x801, (n,), bytes(i % classes for i in range(n)))
# test images of 4x4 pixels where training has 8x8
idx_set(root + "/data-feat", "train", 64, 8, 3); idx_set(root + "/data-feat", "t10k", 32, 4, 3)
# test classes 0..9 where training has 0..2
idx_set(root + "/data-tlab", "train", 64, 8, 3); idx_set(root + "/data-tlab", "t10k", 32, 8, 10)
# test images of 4x16 where training has 8x8: the same 64 features (they were taken)
idx_set(root + "/data-shape", "train", 64, 8, 3)
write(root + "/data-shape", "t10k-images-idx3-ubyte.gz", 0x803, (32, 4, 16),
      bytes((3 * i) % 256 for i in range(32 * 64)))
write(root + "/data-shape", "t10k-labels-idx1-ubyte.gz", 0x801, (32,), bytes(i % 3 for i in range(32)))
# float32 test pixels in [0,255] where training has unsigned bytes, scaled to [0,1] (taken)
idx_set(root + "/data-type", "train", 64, 8, 3)
write(root + "/data-type", "t10k-images-idx3-ubyte.gz", 0xD03, (32, 8, 8),
      b"".join(struct.pack(">f", float((7 * i) % 256)) for i in range(32 * 64)))
write(root + "/data-type", "t10k-labels-idx1-ubyte.gz", 0x801, (32,), bytes(i % 3 for i in range(32)))
EOF
then
    for d in feat tlab shape type; do
        start=$(date +%s%N)
        expect_error 2 "a test set that does not fit ($d)" train --data "$T/data-$d" --layers 8:relu,3 \
            --epochs 1000 --batch 8 --devices cpu --save "$T/never.safetensors"
        ms=$((($(date +%s%N) - start) / 1000000))
        want='test set'
        [[ $d == shape ]] && want="test set in $T/data-shape has samples of 4x16 where the training set has 8x8: the same 64 features in another layout"
        [[ $d == type ]] && want="test set in $T/data-type holds float32 values, taken as they are, where the training set has unsigned bytes, scaled to \\[0,1\\]"
        if grep -q "$want" "$T/err" && [[ ! -e "$T/never.safetensors" && $ms -lt 20000 ]]; then
            ok "refused before training (${ms} ms), nothing saved"
        else
            bad "a test set that does not fit ($d): not refused up front (${ms} ms)" "$(cat "$T/err")"
        fi
    done
else
    bad "python3 could not write the mismatched data sets"
fi

# Training samples of 1x8x8 (one channel, as PyTorch writes them) and test
# samples of 8x8 are the same data: they were refused as "another layout".
# So are 1x64 and 8x8, as 64 and 8x8 always were (a flat vector has no
# layout to differ in).
if python3 - "$T/data-chan" "$T/data-flat1" <<'EOF'
import gzip, os, struct, sys
def write(d, name, magic, dims, payload):
    os.makedirs(d, exist_ok=True)
    with gzip.open(os.path.join(d, name), "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", x) for x in dims) + payload)
for d, train_dims in ((sys.argv[1], (64, 1, 8, 8)), (sys.argv[2], (64, 1, 64))):
    write(d, "train-images-idx3-ubyte.gz", 0x800 + len(train_dims), train_dims,
          bytes((7 * i) % 256 for i in range(64 * 64)))
    write(d, "train-labels-idx1-ubyte.gz", 0x801, (64,), bytes(i % 3 for i in range(64)))
    write(d, "t10k-images-idx3-ubyte.gz", 0x803, (32, 8, 8), bytes((5 * i) % 256 for i in range(32 * 64)))
    write(d, "t10k-labels-idx1-ubyte.gz", 0x801, (32,), bytes(i % 3 for i in range(32)))
EOF
then
    for d in chan flat1; do
        run train --data "$T/data-$d" --layers 8:relu,3 --epochs 1 --batch 8 --devices cpu --quiet
        if [[ $rc -eq 0 ]] && grep -q '^test: ' "$T/out"; then
            ok "training samples of $([[ $d == chan ]] && echo 1x8x8 || echo 1x64) and test samples of 8x8: the same data"
        else
            bad "$d against 8x8: status $rc" "$(cat "$T/err")"
        fi
    done
else
    bad "python3 could not write the one-channel data set"
fi

# ---- a model whose layer spec is long still opens: castor reads back what it wrote ---------
LONG_LAYERS=$(python3 -c "print(','.join(['16:sigmoid'] * 60 + ['10']))")
LONG="$T/long.safetensors"
run train --data "$DATA" --layers "$LONG_LAYERS" --devices cpu --epochs 1 --batch 64 --seed 1 \
    --save "$LONG" --quiet
if [[ $rc -eq 0 ]]; then
    run eval --model "$LONG" --data "$DATA" --devices cpu --json
    if [[ $rc -eq 0 ]] && tail -n 1 "$T/out" | grep -q '"test_accuracy"'; then
        ok "eval a model of 61 layers (a ${#LONG_LAYERS}-character spec)"
    else
        bad "eval a model of 61 layers: status $rc" "$(cat "$T/err")"
    fi
    # --layers may be given on resume if it is the file's
    run train --data "$DATA" --layers "$LONG_LAYERS" --devices cpu --epochs 2 --batch 64 \
        --resume "$LONG" --quiet
    if [[ $rc -eq 0 ]]; then
        ok "resume a model of 61 layers with its --layers"
    else
        bad "resume a model of 61 layers with its --layers: status $rc" "$(cat "$T/err")"
    fi
else
    bad "train a model of 61 layers: status $rc" "$(cat "$T/err")"
fi

# ---- text from a checkpoint reaches the terminal only as printable characters -------------
EVIL="$T/evil.safetensors"
if python3 - "$SAVED" "$EVIL" <<'EOF'
import sys
import ckpt_file
header, data = ckpt_file.read(sys.argv[1])
header["__metadata__"]["strategy"] = "mirrored\x1b[31mRED\nsecond line"
ckpt_file.write(sys.argv[2], header, data)
EOF
then
    run train --data "$DATA" --devices cpu:2 --epochs 2 --batch 64 --resume "$EVIL"
    if [[ $rc -eq 0 ]] && ! grep -q $'\x1b' "$T/err" && ! grep -q '^second line' "$T/err" &&
        grep -q 'written by the mirrored?\[31mRED?second line strategy' "$T/err"; then
        ok "resume: the file's strategy text is shown printable, on one line"
    else
        bad "resume: the file's strategy text: status $rc" "$(cat -v "$T/err")"
    fi
else
    bad "python3 could not rewrite the checkpoint's metadata"
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
