#!/usr/bin/env bash
# Tests of the castor command line: bash tests/cli_test.sh build/castor
#
# Help and version, strict flag checking (usage errors are one line starting
# "castor: " and exit 2), castor info, a tiny training run on a synthetic IDX
# data set with --json, the progress display, and SIGINT/SIGTERM stopping a
# run with status 130/143. The last line is "N passed, M failed".
set -uo pipefail

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
BGPID=""
cleanup() {
    if [[ -n "$BGPID" ]]; then kill -KILL "$BGPID" 2>/dev/null; fi
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

TRAIN_FLAGS=(--data --layers --optimizer --lr --momentum --nesterov --weight-decay --epochs
    --batch --strategy --devices --seed --loss --validation-split --device-memory
    --host-threads --tf32 --json --quiet --verbose --help)
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
expect_error 2 "--epochs 0" train --epochs 0
expect_error 2 "--epochs abc" train --epochs abc
expect_error 2 "--epochs 5x" train --epochs 5x
expect_error 2 "--epochs ' 5'" train --epochs " 5"
expect_error 2 "--epochs 99999999999" train --epochs 99999999999
expect_error 2 "--batch -5" train --batch -5
expect_error 2 "--batch 0" train --batch 0
expect_error 2 "--lr 0" train --lr 0
expect_error 2 "--lr nan" train --lr nan
expect_error 2 "--lr inf" train --lr inf
expect_error 2 "--lr -0.1" train --lr -0.1
expect_error 2 "--lr 1e999" train --lr 1e999
expect_error 2 "--momentum 1" train --optimizer sgd --momentum 1
expect_error 2 "--momentum with adam" train --optimizer adam --momentum 0.9
expect_error 2 "--nesterov with adamw" train --optimizer adamw --nesterov
expect_error 2 "--weight-decay with sgd" train --optimizer sgd --weight-decay 0.01
expect_error 2 "--seed -1" train --seed -1
expect_error 2 "--seed 18446744073709551616" train --seed 18446744073709551616
expect_error 2 "--validation-split -1" train --validation-split -1
expect_error 2 "--device-memory 12Q" train --device-memory 12Q
expect_error 2 "--device-memory 99999999T" train --device-memory 99999999T
expect_error 2 "--host-threads -1" train --host-threads -1
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
expect_error 1 "missing data directory" train --data "$T/no-such-dir" --epochs 1

# ---- info -------------------------------------------------------------------------------
run info
if [[ $rc -eq 0 ]] && grep -q '^castor ' "$T/out" && grep -q 'cores' "$T/out" &&
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
expect_error 2 "--loss mse with fewer units than classes" "${TRAIN[@]}" --layers 4 --loss mse --epochs 1

run "${TRAIN[@]}" --devices cpu --epochs 1 --batch 64
if [[ $rc -eq 0 ]] && grep -q '^test: ' "$T/out" && grep -q 'accuracy' "$T/out"; then
    ok "train without --json prints a text summary"
else
    bad "train text summary: status $rc" "$(cat "$T/out" "$T/err")"
fi

# The progress bar, when stderr is a terminal (needs script(1) for a pty).
if command -v script >/dev/null 2>&1 && script -qec true /dev/null </dev/null >/dev/null 2>&1; then
    script -qec "$(printf '%q ' "$BIN" "${TRAIN[@]}" --devices cpu:2 --epochs 2 --batch 64 --json)" \
        /dev/null </dev/null >"$T/tty" 2>&1
    rc=$?
    if [[ $rc -eq 0 ]] && grep -q $'\r' "$T/tty" && grep -q 'epoch 2/2' "$T/tty"; then
        ok "progress on a terminal: a line redrawn with \\r"
    else
        bad "progress on a terminal: status $rc" "$(tr '\r' '\n' <"$T/tty" | tail -n 5)"
    fi
else
    ok "progress on a terminal: skipped (no script(1) or no pty)"
fi

# ---- SIGINT / SIGTERM stop training after the current step ---------------------------------
interrupt_test() { # interrupt_test SIGNAL STATUS
    local sig=$1 want=$2
    "$BIN" "${TRAIN[@]}" --devices cpu:2 --epochs 100000 --batch 8 >"$T/out" 2>"$T/err" &
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
    if [[ $rc -eq $want ]] && grep -Eq 'interrupted after step [0-9]+' "$T/err"; then
        ok "SIG$sig during training -> status $rc, '$(grep -o 'interrupted after step [0-9]*' "$T/err")'"
    else
        bad "SIG$sig: want status $want and 'interrupted after step N'; got $rc" "$(tail -n 3 "$T/err")"
    fi
}
interrupt_test INT 130
interrupt_test TERM 143

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
