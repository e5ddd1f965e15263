#!/usr/bin/env bash
# Smoke test of castor bench: bash tests/bench_smoke.sh build/castor
#
# Runs `castor bench --quick` on emulated CPU devices into a temporary
# directory and checks what it leaves: the table on stdout, progress on
# stderr, bench.csv with rows for both strategies, bench.json (parsed with
# python3) with the measured limits and a lower bound for every run, and
# bench.png (PNG magic) when gnuplot is installed. Also --help, a usage
# error and BENCH_OUT. The last line is "N passed, M failed".
set -uo pipefail
# OpenBLAS reads a thread count from any of these, and castor then keeps it:
# from the caller (OMP_NUM_THREADS is common in CI), one made the
# oversubscription warning an extra stderr line and the CLI leave OpenBLAS
# alone where a test wants it to share the cores. Tests that want one set it.
unset OPENBLAS_NUM_THREADS GOTO_NUM_THREADS OMP_NUM_THREADS

if [[ $# -ne 1 ]]; then
    echo "usage: bash tests/bench_smoke.sh PATH/TO/castor" >&2
    exit 2
fi
BIN=$(realpath "$1")
if [[ ! -x "$BIN" ]]; then
    echo "bench_smoke: $1 is not an executable" >&2
    exit 2
fi

T=$(mktemp -d "${TMPDIR:-/tmp}/castor-bench-smoke.XXXXXX")
trap 'rm -rf "$T"' EXIT

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
check() { # check NAME COMMAND...: ok if the command succeeds
    local name=$1
    shift
    if "$@" >"$T/check.out" 2>&1; then ok "$name"; else bad "$name" "$(cat "$T/check.out")"; fi
}

# ---- help and usage errors ----
"$BIN" bench --help >"$T/help" 2>&1
rc=$?
if [[ $rc -eq 0 ]] && grep -q -- '--quick' "$T/help" && grep -q -- '--widths' "$T/help"; then
    ok "bench --help"
else
    bad "bench --help: status $rc" "$(cat "$T/help")"
fi
"$BIN" help bench >"$T/help2" 2>&1
rc=$?
if [[ $rc -eq 0 ]] && cmp -s "$T/help" "$T/help2"; then
    ok "help bench"
else
    bad "help bench: status $rc, or not the same text as bench --help"
fi
"$BIN" bench --widths 0 --out "$T/never" >"$T/out" 2>"$T/err"
rc=$?
if [[ $rc -eq 2 && $(wc -l <"$T/err") -eq 1 ]] && grep -q '^castor: ' "$T/err" && [[ ! -e "$T/never" ]]; then
    ok "bench --widths 0 -> 2: $(head -c 100 "$T/err")"
else
    bad "bench --widths 0: want status 2, one 'castor: ' line, nothing written; got $rc" "$(cat "$T/err")"
fi

# A list longer than the parser's buffer is refused, not cut short: cut at
# 255 characters, the 'bogus' at its end went unseen.
long=$(printf 'central,%.0s' {1..32})bogus
"$BIN" bench --strategies "$long" --widths 0 --out "$T/never" >"$T/out" 2>"$T/err"
rc=$?
if [[ $rc -eq 2 ]] && grep -q -- '--strategies' "$T/err" && [[ ! -e "$T/never" ]]; then
    ok "bench --strategies (${#long} characters) -> 2: $(head -c 100 "$T/err")"
else
    bad "bench --strategies (${#long} characters): want status 2 naming --strategies; got $rc" \
        "$(cat "$T/err")"
fi

# Empty entries and repeated values are mistakes, not values (they were
# dropped, or ran the same model twice).
for args in "--widths 64,,256" "--widths ,64" "--batches 8," "--widths 64,64" \
    "--strategies ,central" "--strategies central,mirrored,central"; do
    # shellcheck disable=SC2086
    "$BIN" bench $args --out "$T/never" >"$T/out" 2>"$T/err"
    rc=$?
    if [[ $rc -eq 2 && $(wc -l <"$T/err") -eq 1 && ! -e "$T/never" ]] &&
        grep -qE '^castor: bench: --[a-z]+: (empty entry|.* is given twice)' "$T/err"; then
        ok "bench $args -> 2: $(cat "$T/err")"
    else
        bad "bench $args: want status 2 and one line; got $rc" "$(cat "$T/err")"
    fi
done

# Each range's bottom: one below it is a usage error before anything is
# measured (--steps 0 ran and reported a step time; --classes 1 measured
# the limits, then failed every run).
for args in "--steps 0" "--warmup -1" "--input 0" "--classes 1" "--depths 0" "--batches 0" \
    "--host-threads -1"; do
    # shellcheck disable=SC2086
    timeout 120 "$BIN" bench --quick $args --out "$T/never" >"$T/out" 2>"$T/err"
    rc=$?
    if [[ $rc -eq 2 && $(wc -l <"$T/err") -eq 1 && ! -e "$T/never" ]] &&
        grep -q "^castor: .*${args%% *}" "$T/err"; then
        ok "bench $args -> 2"
    else
        bad "bench $args: want status 2 and one line naming the flag; got $rc" "$(cat "$T/err")"
    fi
done

# An output directory it cannot write in is refused before anything is
# measured (it ran the whole grid, printed "wrote ..." and, where gnuplot
# could not open bench.png, the PNG onto stdout). Root writes anywhere: the
# check runs as nobody then.
RO="$T/ro"
mkdir "$RO" && chmod 555 "$RO" && chmod 711 "$T"
as_user=()
if [[ $(id -u) -eq 0 ]]; then as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups); fi
# nobody must reach the binary (not so in a checkout under a private home).
if [[ $(id -u) -ne 0 ]] || { command -v setpriv >/dev/null 2>&1 && "${as_user[@]}" test -x "$BIN"; }; then
    "${as_user[@]}" "$BIN" bench --quick --widths 8 --batches 8 --steps 1 --warmup 0 --input 16 \
        --out "$RO" >"$T/out" 2>"$T/err"
    rc=$?
    if [[ $rc -eq 1 && ! -s "$T/out" && $(wc -l <"$T/err") -eq 1 ]] &&
        grep -q "^castor: bench: cannot write in the output directory $RO: " "$T/err"; then
        ok "bench --out a directory it cannot write in -> 1 before measuring"
    else
        bad "bench --out an unwritable directory: status $rc" "$(head -c 300 "$T/out"; cat "$T/err")"
    fi
else
    ok "bench --out an unwritable directory: skipped (root, and nobody cannot run $BIN)"
fi
chmod 700 "$T"

# Results that cannot be written whole (here a 1 KiB file size limit, with
# SIGXFSZ ignored so that the write fails with EFBIG) leave the last run's
# files as they were, not cut short, no temporary file, and no old plot
# beside new numbers (bench.json was left truncated and bench.png kept).
FULL="$T/full"
mkdir -p "$FULL"
python3 -c 'print("{\"old\": true}")' >"$FULL/bench.json"
echo old-plot >"$FULL/bench.png"
(trap '' XFSZ; ulimit -f 1; exec "$BIN" bench --quick --widths 8 --batches 8 --steps 1 --warmup 0 \
    --input 16 --out "$FULL") >"$T/out" 2>"$T/err"
rc=$?
if [[ $rc -eq 1 ]] && grep -q "^castor: bench: cannot write $FULL/bench.json: write failed: File too large" "$T/err" &&
    [[ "$(cat "$FULL/bench.json")" == '{"old": true}' && ! -e "$FULL/bench.png" ]] &&
    [[ $(find "$FULL" -name '*.tmp.*' | wc -l) -eq 0 ]]; then
    ok "results that cannot be written whole: the old file kept, no temporary file, no old plot"
else
    bad "results that cannot be written whole: status $rc" "$(cat "$T/err"; ls -la "$FULL"; head -c 200 "$FULL/bench.json")"
fi

# ---- a quick run ----
OUT="$T/out dir"  # a space in the path, for the gnuplot script's quoting
start=$(date +%s%N)
timeout 300 "$BIN" bench --quick --devices cpu:2 --out "$OUT" >"$T/stdout" 2>"$T/stderr"
rc=$?
ms=$((($(date +%s%N) - start) / 1000000))
if [[ $rc -eq 0 ]]; then
    ok "bench --quick exits 0 (${ms} ms)"
else
    bad "bench --quick: status $rc" "$(tail -n 20 "$T/stderr")"
fi
check "table on stdout" grep -q '^runs' "$T/stdout"
check "lower-bound table on stdout" grep -q '^against the limits' "$T/stdout"
check "limits on stdout" grep -q 'host memory' "$T/stdout"
check "progress on stderr" grep -q '^\[1/4\] central width 64 depth 1 batch 64' "$T/stderr"
# Like castor train, the bench shares the cores among the emulated replicas'
# OpenBLAS threads (the environment sets no count: unset above), rather than
# measuring an oversubscribed machine that training never runs on.
check "no OpenBLAS oversubscription" bash -c "! grep -i oversubscribe \"\$1\"" _ "$T/stderr"

CSV="$OUT/bench.csv"
if [[ -s "$CSV" ]]; then
    ok "bench.csv written"
else
    bad "bench.csv missing or empty"
fi
check "bench.csv header" bash -c "head -n 1 \"\$1\" | grep -q '^strategy,devices,replicas,.*step_median_s,.*lower_bound_s,bound_by,ratio'" _ "$CSV"
for s in central mirrored; do
    n=$(grep -c "^$s,.*,1,\"\"," "$CSV" 2>/dev/null)
    if [[ "$n" -eq 2 ]]; then
        ok "bench.csv: 2 successful $s rows"
    else
        bad "bench.csv: want 2 successful $s rows, got ${n:-0}" "$(cat "$CSV" 2>/dev/null)"
    fi
done

JSON="$OUT/bench.json"
if python3 - "$JSON" >"$T/json.out" 2>&1 <<'EOF'
import json, math, sys
d = json.load(open(sys.argv[1]))
L = d["limits"]
for k in ("h2d_bytes_per_s", "d2h_bytes_per_s", "both_directions_bytes_per_s",
          "h2d_one_replica_bytes_per_s", "d2h_one_replica_bytes_per_s",
          "host_memory_bytes_per_s", "host_optimizer_params_per_s"):
    v = L[k]
    assert isinstance(v, (int, float)) and v > 0 and math.isfinite(v), (k, v)
assert L["backend"] == "cpu" and L["replicas"] == 2, L
assert "overlaps" in d["lower_bound_method"] and "serial_seconds" in d["lower_bound_method"]
g = L["gemm"]
assert len(g) >= 5 and all(x["flops_per_s"] > 0 and x["seconds"] > 0 for x in g), g
runs = d["runs"]
assert len(runs) == 4, len(runs)
assert sorted(r["strategy"] for r in runs) == ["central"] * 2 + ["mirrored"] * 2
for r in runs:
    assert r["ok"], r
    for k in ("step_seconds", "samples_per_s", "h2d_bytes_per_step", "d2h_bytes_per_step",
              "bus_bytes_per_s", "host_update_params_per_s", "device_peak_bytes",
              "host_pinned_bytes", "host_rss_peak_bytes", "host_maxrss_process_bytes"):
        assert r[k] > 0, (k, r[k])
    b = r["lower_bound"]
    assert b["bound_by"] in ("transfer", "compute", "host"), b
    for k in ("seconds", "ratio", "transfer_seconds", "compute_seconds", "host_seconds",
              "step_flops", "gemm_flops_per_s"):
        assert b[k] > 0, (k, b[k])
    assert abs(b["seconds"] - max(b["transfer_seconds"], b["compute_seconds"],
                                  b["host_seconds"])) <= 1e-12 * b["seconds"], b
    assert abs(b["ratio"] - r["step_seconds"] / b["seconds"]) < 1e-6 * b["ratio"], b
    # Beside the largest term (a bound for an implementation that overlaps
    # everything), their sum: the bound for phases that run in turn.
    total = b["transfer_seconds"] + b["compute_seconds"] + b["host_seconds"]
    assert abs(b["serial_seconds"] - total) <= 1e-9 * total, b
    assert b["serial_seconds"] >= b["seconds"], b
    assert abs(b["serial_ratio"] - r["step_seconds"] / total) < 1e-6 * b["serial_ratio"], b
    # The transfer term is the bytes the step should move (a run that copied
    # more raised its own bound); here the counts are those bytes.
    assert r["bytes_as_expected"] is True, r
    h, dn = r["expected_h2d_bytes_per_step"], r["expected_d2h_bytes_per_step"]
    assert abs(r["h2d_bytes_per_step"] - h) <= 0.01 * h, r
    assert abs(r["d2h_bytes_per_step"] - dn) <= 0.01 * dn, r
    want = max(h / L["h2d_bytes_per_s"], dn / L["d2h_bytes_per_s"],
               (h + dn) / L["both_directions_bytes_per_s"])
    assert abs(b["transfer_seconds"] - want) <= 1e-9 * want, (b, want)
# Same model and data: both strategies move the same bytes per step here
# (mirrored all-reduces through host memory on CPU devices).
by = {(r["strategy"], r["width"]): r for r in runs}
for w in (64, 256):
    c, m = by[("central", w)], by[("mirrored", w)]
    assert c["params"] == m["params"]
    assert c["h2d_bytes_per_step"] == m["h2d_bytes_per_step"], (c, m)
    # central holds no optimizer state on the device
    assert c["device_peak_bytes"] < m["device_peak_bytes"], (c, m)
print("ok")
EOF
then
    ok "bench.json parses, with the limits and a lower bound for every run"
else
    bad "bench.json" "$(cat "$T/json.out")"
fi

# On emulated devices a copy is a memcpy in host memory, so its rate cannot
# beat the host's memory bandwidth by much (a memcpy moves each byte twice:
# it should come under the triad). Copies repeated between the same small
# buffers ran from L1/L2 at 50-130 GB/s beside a triad of 18 GB/s, and the
# transfer term of every CPU bound came out ten times too small.
if python3 - "$JSON" >"$T/json.out" 2>&1 <<'EOF'
import json, sys
L = json.load(open(sys.argv[1]))["limits"]
triad = L["host_memory_bytes_per_s"]
for k in ("h2d_bytes_per_s", "d2h_bytes_per_s", "both_directions_bytes_per_s",
          "h2d_one_replica_bytes_per_s", "d2h_one_replica_bytes_per_s"):
    assert L[k] <= 2 * triad, f"{k} {L[k] / 1e9:.2f} GB/s > 2 x triad {triad / 1e9:.2f} GB/s"
span, llc = L["copy_cpu_span_bytes"], L["last_level_cache_bytes"]
assert span >= L["copy_bytes"] and span % L["copy_bytes"] == 0, L
assert llc == 0 or span >= 2 * llc or "cache-hot" in L["note"], L
assert "cpu (emulated devices" in L["copy_method"] and "cuda:" in L["copy_method"], L
print("ok")
EOF
then
    ok "emulated copies: not cache-hot (each rate at most 2 x the triad's)"
else
    bad "emulated copies against the host memory bandwidth" "$(cat "$T/json.out")"
fi

# Each bench.csv row says what its run's bench.json object says, column by
# column (a column printing another field's value, d2h as h2d's bytes or
# t_host as t_compute, passed every check above).
if python3 - "$JSON" "$CSV" >"$T/json.out" 2>&1 <<'EOF'
import csv, json, math, sys
runs = json.load(open(sys.argv[1]))["runs"]
rows = list(csv.DictReader(open(sys.argv[2])))
assert len(rows) == len(runs) == 4, (len(rows), len(runs))
# New columns go at the end: a script that reads the columns by place keeps working.
OLD = ("strategy,devices,replicas,optimizer,width,depth,batch,params,ok,error,steps,"
       "step_median_s,step_min_s,step_max_s,samples_per_s,h2d_bytes_per_step,"
       "d2h_bytes_per_step,bus_bytes_per_s,seconds_replicas,seconds_reduce,"
       "seconds_update,seconds_total,host_update_params_per_s,device_peak_bytes,"
       "host_pinned_bytes,host_rss_peak_run_bytes,host_rss_peak_scope,"
       "host_maxrss_process_bytes,step_flops,gemm_flops_per_s,host_memory_bytes_per_step,"
       "t_transfer_s,t_compute_s,t_host_s,lower_bound_s,bound_by,ratio,loss").split(",")
header = next(csv.reader(open(sys.argv[2])))
assert header[:len(OLD)] == OLD, header
cols = {"step_median_s": "step_seconds", "step_min_s": "step_seconds_min",
        "step_max_s": "step_seconds_max", "samples_per_s": "samples_per_s",
        "h2d_bytes_per_step": "h2d_bytes_per_step", "d2h_bytes_per_step": "d2h_bytes_per_step",
        "bus_bytes_per_s": "bus_bytes_per_s", "seconds_replicas": "seconds_replicas",
        "seconds_reduce": "seconds_reduce", "seconds_update": "seconds_update",
        "seconds_total": "seconds_total", "host_update_params_per_s": "host_update_params_per_s",
        "device_peak_bytes": "device_peak_bytes", "host_pinned_bytes": "host_pinned_bytes",
        "host_rss_peak_run_bytes": "host_rss_peak_bytes",
        "host_maxrss_process_bytes": "host_maxrss_process_bytes", "loss": "loss",
        "step_flops": "lb.step_flops", "gemm_flops_per_s": "lb.gemm_flops_per_s",
        "host_memory_bytes_per_step": "lb.host_memory_bytes_per_step",
        "t_transfer_s": "lb.transfer_seconds", "t_compute_s": "lb.compute_seconds",
        "t_host_s": "lb.host_seconds", "lower_bound_s": "lb.seconds", "ratio": "lb.ratio",
        "expected_h2d_bytes_per_step": "expected_h2d_bytes_per_step",
        "expected_d2h_bytes_per_step": "expected_d2h_bytes_per_step",
        "serial_bound_s": "lb.serial_seconds", "serial_ratio": "lb.serial_ratio"}
by = {(r["strategy"], r["width"], r["batch"]): r for r in runs}
for row in rows:
    r = by[(row["strategy"], int(row["width"]), int(row["batch"]))]
    assert int(row["params"]) == r["params"] and row["ok"] == "1", (row, r)
    assert row["bound_by"] == r["lower_bound"]["bound_by"], (row, r)
    assert row["bytes_as_expected"] == str(int(r["bytes_as_expected"])), (row, r)
    for col, key in cols.items():
        want = r["lower_bound"][key[3:]] if key.startswith("lb.") else r[key]
        got = row[col]
        if want is None:
            assert got == "", (col, got)
            continue
        # %.0f for bytes, %.4g for the ratio: the CSV rounds, by at most this
        tol = 0.5 if "bytes" in col else 0.0
        assert math.isclose(float(got), want, rel_tol=1e-3, abs_tol=tol), (col, got, key, want)
print("ok")
EOF
then
    ok "bench.csv: each row's values are its bench.json run's"
else
    bad "bench.csv against bench.json" "$(cat "$T/json.out")"
fi

PNG="$OUT/bench.png"
if command -v gnuplot >/dev/null 2>&1; then
    if [[ -s "$PNG" ]] && [[ "$(head -c 8 "$PNG" | od -An -tx1 | tr -d ' \n')" == "89504e470d0a1a0a" ]]; then
        ok "bench.png is a PNG"
    else
        bad "bench.png missing or not a PNG" "$(grep -i gnuplot "$T/stderr")"
    fi
else
    if grep -q 'gnuplot is not installed' "$T/stderr" && [[ ! -e "$PNG" ]]; then
        ok "no gnuplot: warned, no bench.png"
    else
        bad "no gnuplot: want a warning on stderr and no bench.png"
    fi
fi

# gnuplot's messages go to a temporary file in $TMPDIR (it was always in
# /tmp), named to the shell quoted (a quote in the directory's name), and
# removed after; its reason reaches the warning.
FAKE="$T/fake gnuplot"
GPTMP="$T/it's tmp"
mkdir -p "$FAKE" "$GPTMP"
cat >"$FAKE/gnuplot" <<'EOF'
#!/bin/sh
cat >/dev/null
readlink "/proc/$$/fd/2" >"$GNUPLOT_STDERR_AT"
echo 'line 3: all went wrong' >&2
exit 1
EOF
chmod +x "$FAKE/gnuplot"
GNUPLOT_STDERR_AT="$T/gp-stderr" TMPDIR="$GPTMP" PATH="$FAKE:$PATH" "$BIN" bench --quick \
    --widths 8 --batches 8 --steps 1 --warmup 0 --input 16 --out "$T/plot-fails" \
    >"$T/out" 2>"$T/err"
rc=$?
if grep -q "gnuplot failed (status 1: line 3: all went wrong)" "$T/err" &&
    [[ "$(cat "$T/gp-stderr")" == "$GPTMP/castor-gnuplot-"* ]] &&
    [[ -z "$(ls -A "$GPTMP")" ]]; then
    ok "gnuplot's messages in \$TMPDIR, and its reason in the warning (status $rc)"
else
    bad "gnuplot's messages in \$TMPDIR: status $rc" \
        "$(cat "$T/err" "$T/gp-stderr"; ls -A "$GPTMP")"
fi

# ---- a limit that cannot be measured leaves its runs without a bound ----
# An aligned_alloc that refuses more than 8 MB fails the copy buffers (16 MiB)
# and the host kernels' arrays at width 256, not the runs themselves.
cat >"$T/shim.c" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
void *aligned_alloc(size_t align, size_t size)
{
    static void *(*real)(size_t, size_t);
    if (size > 8000000) {
        errno = ENOMEM;
        return NULL;
    }
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "aligned_alloc");
    return real(align, size);
}
EOF
if ${CC:-cc} -shared -fPIC -o "$T/shim.so" "$T/shim.c" -ldl 2>"$T/cc.err"; then
    LD_PRELOAD="$T/shim.so" timeout 300 "$BIN" bench --quick --devices cpu:2 --out "$T/nan" \
        >"$T/stdout3" 2>"$T/stderr3"
    rc=$?
    if [[ $rc -eq 0 ]] && grep -q '^castor: warning: limits: .*copies: ' "$T/stderr3" &&
        python3 - "$T/nan/bench.json" "$T/nan/bench.csv" "$T/stdout3" >"$T/json.out" 2>&1 <<'EOF'
import csv, json, sys
d = json.load(open(sys.argv[1]))
assert d["limits"]["h2d_bytes_per_s"] is None, d["limits"]
runs = d["runs"]
assert len(runs) == 4 and all(r["ok"] for r in runs), runs
for r in runs:
    b = r["lower_bound"]
    assert b["transfer_seconds"] is None and b["seconds"] is None, b
    assert b["ratio"] is None and b["bound_by"] == "-", b
    assert b["serial_seconds"] is None and b["serial_ratio"] is None, b
    assert b["compute_seconds"] > 0, b
    assert (b["host_seconds"] is None) == (r["width"] == 256), (r["width"], b)
rows = list(csv.DictReader(open(sys.argv[2])))
assert len(rows) == 4, rows
for row in rows:
    assert row["lower_bound_s"] == "" and row["ratio"] == "" and row["bound_by"] == "-", row
    assert row["serial_bound_s"] == "" and row["serial_ratio"] == "", row
    assert float(row["t_compute_s"]) > 0, row
table = [line for line in open(sys.argv[3]).read().split("against the limits")[1].splitlines()
         if line.split()[1:2] in (["central"], ["mirrored"])]
assert len(table) == 4, table
for line in table:
    f = line.split()
    # bound, bound by, ratio, sum, step/sum
    assert f[6] == "-" and f[10:] == ["-"] * 5, line
print("ok")
EOF
    then
        ok "a limit that fails to measure: a warning, '-' in the table, empty in CSV, null in JSON"
    else
        bad "a limit that fails to measure: status $rc" "$(cat "$T/json.out"; tail -n 3 "$T/stderr3")"
    fi
else
    bad "cannot build the aligned_alloc shim" "$(cat "$T/cc.err")"
fi

# ---- a run that fails: reported, and the others still done ----
# A 1 MiB device holds the width-8 model but not the width-256 one (1.6 MB
# of variables and gradients per replica): those two runs fail in fit, before
# its first step (compile reserves the variables alone, 0.8 MB).
# Their rows keep the parameter count they were refused at (it read 0).
"$BIN" bench --quick --devices cpu:2 --widths 8,256 --batches 4 --steps 1 --warmup 0 \
    --device-memory 1M --out "$T/fail" >"$T/stdout4" 2>"$T/stderr4"
rc=$?
refused='^castor: \[[34]/4\] .* width 256 .*: fit: out of device memory.* gradients 814120'
if [[ $rc -eq 1 ]] && grep -q '^castor: bench: 2 of 4 runs failed$' "$T/stderr4" &&
    [[ $(grep -c "$refused" "$T/stderr4") -eq 2 ]] &&
    python3 - "$T/fail/bench.json" "$T/fail/bench.csv" "$T/stdout4" >"$T/json.out" 2>&1 <<'EOF'
import csv, json, sys
params = {8: 784 * 8 + 8 + 8 * 10 + 10, 256: 784 * 256 + 256 + 256 * 10 + 10}
runs = json.load(open(sys.argv[1]))["runs"]
rows = list(csv.DictReader(open(sys.argv[2])))
assert len(runs) == 4 and len(rows) == 4, (runs, rows)
# A failed run's row has every column, empty.
widths = {len(f) for f in csv.reader(open(sys.argv[2]))}
assert len(widths) == 1, widths
for r, row in zip(runs, rows):
    w = r["width"]
    assert r["params"] == params[w] and int(row["params"]) == params[w], (r, row)
    assert r["ok"] == (w == 8) and row["ok"] == str(int(w == 8)), (r, row)
    if w == 8:
        assert r["lower_bound"]["ratio"] > 0 and float(row["ratio"]) > 0, (r, row)
    else:
        assert "out of device memory" in r["error"] and row["error"] == r["error"], (r, row)
        assert row["step_median_s"] == "" and row["ratio"] == "", row
table = open(sys.argv[3]).read()
for kind in ("central", "mirrored"):
    line = f" {kind:<8} {256:6} {1:5} {4:6} {params[256]:10}  failed: fit: out of device"
    assert line in table, (line, table)
print("ok")
EOF
then
    ok "a run that fails (--device-memory 1M): status 1, its size and why, the others done"
else
    bad "a run that fails: status $rc" "$(cat "$T/json.out"; tail -n 5 "$T/stderr4")"
fi

# ---- other processes' share: over the CPUs this process may run on ----
# taskset -c A castor bench beside a busy loop pinned to CPU B said that
# other processes used 102% of the cores: /proc/stat's aggregate line (every
# CPU, B's busy loop too) over the one core the bench may use, uncapped.
read -r cpu_a cpu_b < <(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0))[:2])')
if command -v taskset >/dev/null 2>&1 && [[ -n "${cpu_b:-}" ]]; then
    taskset -c "$cpu_b" bash -c 'while :; do :; done' &
    loop=$!
    timeout 300 taskset -c "$cpu_a" "$BIN" bench --quick --devices cpu:1 --widths 64 --steps 2 \
        --warmup 0 --out "$T/pinned" >"$T/stdout5" 2>"$T/stderr5"
    rc=$?
    kill "$loop"
    wait "$loop" 2>/dev/null
    # The CPUs looked at are the mask's one; the share's arithmetic (the busy
    # loop's CPU left out) is the unit tests' (test_bench_bound.c,
    # bench_others): here the other CPU's load is not knowable enough to bound.
    if [[ $rc -eq 0 ]] && python3 - "$T/pinned/bench.json" >"$T/json.out" 2>&1 <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["other_processes_cpus"] == 1 and d["cpu_cores"] == 1, d
for k in ("other_processes_cpu_before", "other_processes_cpu_during"):
    assert 0 <= d[k] <= 1, (k, d[k])
assert "affinity mask" in d["other_processes_method"], d
print("ok")
EOF
    then
        ok "taskset -c $cpu_a beside a busy loop on CPU $cpu_b: others' share of CPU $cpu_a, <= 100%"
    else
        bad "others' share under taskset: status $rc" \
            "$(cat "$T/json.out"; head -n 3 "$T/stdout5"; tail -n 3 "$T/stderr5")"
    fi
else
    ok "others' share under taskset: skipped (no taskset, or one CPU)"
fi

# ---- BENCH_OUT ----
BENCH_OUT="$T/env" timeout 300 "$BIN" bench --quick --strategies central --widths 32 \
    --steps 1 --warmup 0 >"$T/stdout2" 2>"$T/stderr2"
rc=$?
if [[ $rc -eq 0 && -s "$T/env/bench.csv" && -s "$T/env/bench.json" ]]; then
    ok "BENCH_OUT names the output directory"
else
    bad "BENCH_OUT: status $rc" "$(tail -n 5 "$T/stderr2")"
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
