#!/usr/bin/env bash
# Every GPU check in one run, for a machine with a CUDA device and a fresh checkout:
#
#   bash benchmarks/gpu_check.sh [RESULTS_DIR]        # default: gpu-results/
#   PYTHON=.venv/bin/python ...                      # a Python other than python3 (it must hold torch)
#   MINICOMPILE_GPU_DRY_RUN=1 bash benchmarks/gpu_check.sh   # here, without a GPU: the same
#       steps with the GPU-only work stubbed (CPU tensors through Triton's interpreter, tiny sizes)
#
# Steps, each under its own time limit (about 7 minutes in all on a 16-core GPU machine):
#   1. what the machine is (GPU, driver, Python, torch, triton);
#   2. install: minicompile from this checkout (no dependencies fetched: the GPU image's torch,
#      triton and networkx are used; a missing one is named and the run stops);
#   3. at once, on the GPU: the tests marked gpu (the op table as real Triton kernels, CUDA
#      graphs), the fuzzers natively on CUDA (inference, training, dynamic shapes; bounded by
#      count and time), and our front end's tests on this machine's Python (3.12 on the GPU
#      machines, where its opcodes run nowhere else);
#   4. alone on the machine, so timings are quiet: benchmarks/bench_gpu.py (eager, minicompile
#      and Inductor side by side; MINICOMPILE_GPU_BENCH_ARGS replaces its arguments, e.g.
#      "--only kernels").
# Writes RESULTS_DIR/gpu-results.md (the summary and every table) and RESULTS_DIR/logs.tar.gz
# (each step's whole log). Exits 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS="${1:-gpu-results}"
mkdir -p "$RESULTS/logs"
RESULTS="$(cd "$RESULTS" && pwd)"
LOGS="$RESULTS/logs"
SUMMARY="$RESULTS/gpu-results.md"
PY="${PYTHON:-python3}"
DRY="${MINICOMPILE_GPU_DRY_RUN:-0}"
export PYTHONUNBUFFERED=1
export MINICOMPILE_CACHE_DIR="${MINICOMPILE_CACHE_DIR:-$(mktemp -d)}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # this checkout's minicompile, installed or not
export HF_HUB_OFFLINE=1

if [ "$DRY" = 1 ]; then
    DEVICE=cpu; export MINICOMPILE_CPU_BACKEND=triton   # Triton's interpreter stands in for the GPU
    N_FUZZ=4; N_TRAIN=2; N_DYN=2; N_CLS=2; CLASS_JOIN=";"; BENCH_ARGS="--dry-run --only kernels"
    SLOW=2   # two cores shared by every step: twice the time limits
    # the GPU tests skip here; run one op-table case in the interpreter to exercise the step
    GPU_TESTS="tests/test_triton.py -k 'gpu or (test_matches_eager_triton and add)'"
else
    DEVICE=cuda
    N_FUZZ=400; N_TRAIN=150; N_DYN=48; N_CLS=32; CLASS_JOIN="&"; SLOW=1; BENCH_ARGS="${MINICOMPILE_GPU_BENCH_ARGS:---reps 30}"
    GPU_TESTS="-m gpu tests/test_triton.py tests/test_modes.py tests/test_gpu_classes.py"
fi

: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
# run NAME LIMIT_SECONDS COMMAND...: the command's output goes to logs/NAME.log; a row in the summary
declare -A RC SECS
run() {
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" bash -c "$*" > "$LOGS/$name.log" 2>&1
    RC[$name]=$?
    SECS[$name]=$((SECONDS - t0))
}
row() {
    local name=$1 what=$2 rc=${RC[$1]}
    local state=passed
    [ "$rc" = 0 ] || state="FAILED (exit $rc)"
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && state="STOPPED at its time limit"
    local last
    last=$(grep -E "passed|failed|failing|error|Error" "$LOGS/$name.log" | tail -1 | cut -c1-160 | tr '|' '/')
    say "| $name | $what | $state | ${SECS[$name]} s | ${last:-} |"
}

say "# minicompile GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
say ""
say '```'
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$PY" - <<'EOF'
import platform, sys
print("python", platform.python_version(), sys.executable)
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "device:",
          torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
except Exception as e:
    print("torch: missing:", e)
for name in ("triton", "networkx", "pytest", "transformers", "numpy"):
    try:
        print(name, __import__(name).__version__)
    except Exception as e:
        print(name, "missing:", type(e).__name__)
EOF
  git log -1 --format='commit %h %s' 2>/dev/null | cut -c1-120
} 2>&1 | tee -a "$SUMMARY"
say '```'
say ""

# before installing anything: a machine with no GPU (or this Python without torch) stops here
if [ "$DEVICE" = cuda ] && ! "$PY" -c "import torch, triton; assert torch.cuda.is_available()" 2>>"$LOGS/install.log"; then
    say "$PY: no torch with a visible CUDA device, or no triton: nothing to check on a GPU (PYTHON=... names"
    say "another Python; MINICOMPILE_GPU_DRY_RUN=1 dry-runs the steps without a GPU)"
    exit 2
fi

# 2. install: an editable install registers backend="minicompile" (the entry point); without the
# network nothing is fetched, and PYTHONPATH above already finds the package if this fails.
if [ "$DRY" = 1 ]; then
    run install 60 "echo 'dry run: minicompile from PYTHONPATH, nothing installed'"
else
    run install 120 "$PY -m pip install --no-deps --no-build-isolation -q -e . || echo 'pip install failed: using PYTHONPATH'"
fi
if ! "$PY" -c "import torch, networkx, minicompile" >> "$LOGS/install.log" 2>&1; then
    say "install: torch, networkx or minicompile do not import; see logs/install.log"
    tail -5 "$LOGS/install.log" | tee -a "$SUMMARY"
fi

# 3. correctness on the GPU, in parallel (each step its own cache directory: no two processes
# write one entry at once)
# pytest-xdist, where installed (the GPU image has it), spreads a test step over the machine's cores
XDIST=""
"$PY" -c "import xdist" 2>/dev/null && XDIST="-n 6"
par() {  # par NAME LIMIT COMMAND: run in the background with its own cache
    local name=$1; shift
    ( export MINICOMPILE_CACHE_DIR="$MINICOMPILE_CACHE_DIR/$name"; run "$name" "$@"
      echo "${RC[$name]} ${SECS[$name]}" > "$LOGS/$name.rc" ) &
}
par gpu-tests 150 "$PY -m pytest -q -p no:cacheprovider $XDIST $GPU_TESTS"
par fuzz 150 "$PY -m minicompile.testing.fuzz --device $DEVICE -n $N_FUZZ --repro-dir $LOGS/repros-fuzz"
par fuzz-train 150 "$PY -m minicompile.testing.fuzz_train --device $DEVICE -n $N_TRAIN --repro-dir $LOGS/repros-train"
par fuzz-dynamic 150 "$PY -m minicompile.testing.fuzz --dynamic --device $DEVICE -n $N_DYN --batch 4 --repro-dir $LOGS/repros-dynamic"
# the bug classes of testing/fuzz_classes.py (layouts, random ops, GQA attention, unbacked sizes,
# user text, concatenations), each with its own seeds and cache, the six at once on a GPU machine (one after
# another in a dry run: 2 cores); one failing class fails the step
par fuzz-classes $((200 * SLOW)) "for c in layout random attention unbacked text concat; do
    ( MINICOMPILE_CACHE_DIR=\$MINICOMPILE_CACHE_DIR/\$c $PY -m minicompile.testing.fuzz_classes --class \$c \
      --device $DEVICE --seed 500000 -n $N_CLS --batch 16 --repro-dir $LOGS/repros-classes > $LOGS/class-\$c.log 2>&1;
      echo \$? > $LOGS/class-\$c.rc ) $CLASS_JOIN
    done; wait; rc=0; for c in layout random attention unbacked text concat; do echo \"== class \$c\";
    cat $LOGS/class-\$c.log; [ \"\$(cat $LOGS/class-\$c.rc 2>/dev/null)\" = 0 ] || rc=1; done; exit \$rc"
par front-end $((150 * SLOW)) "MINICOMPILE_CPU_BACKEND=cpp $PY -m pytest -q -p no:cacheprovider $XDIST tests/capture tests/test_front_end.py"
wait
for name in gpu-tests fuzz fuzz-train fuzz-dynamic fuzz-classes front-end; do
    read -r RC[$name] SECS[$name] < "$LOGS/$name.rc" 2>/dev/null || { RC[$name]=1; SECS[$name]=0; }
done

# 4. speed, alone on the machine
run bench 210 "$PY benchmarks/bench_gpu.py $BENCH_ARGS --out $RESULTS/bench.md"

say "| step | what | result | time | last line of its log |"
say "|---|---|---|---|---|"
row install "minicompile from this checkout"
row gpu-tests "tests marked gpu: op table as real kernels, CUDA graphs"
row fuzz "$N_FUZZ random programs on $DEVICE"
row fuzz-train "$N_TRAIN random training programs on $DEVICE (grads vs eager)"
row fuzz-dynamic "$N_DYN random programs, symbolic sizes, on $DEVICE"
row fuzz-classes "$N_CLS programs of each bug class (layout, random, attention, unbacked, text, concat) on $DEVICE"
row front-end "our front end's tests on Python $("$PY" -c 'import platform; print(platform.python_version())')"
row bench "benchmarks/bench_gpu.py $BENCH_ARGS"
say ""
for name in gpu-tests fuzz fuzz-train fuzz-dynamic fuzz-classes front-end; do
    if [ "${RC[$name]}" != 0 ]; then
        say "### $name: the end of its log"
        say '```'
        grep -E "FAILED|Error|error|fails:|failing" "$LOGS/$name.log" | head -40 | cut -c1-400 | tee -a "$SUMMARY" > /dev/null
        tail -15 "$LOGS/$name.log" | cut -c1-400 >> "$SUMMARY"
        say '```'
    fi
done
say "## bench_gpu.py"
if [ -s "$RESULTS/bench.md" ]; then cat "$RESULTS/bench.md" >> "$SUMMARY"; else
    grep -E '^\||^device' "$LOGS/bench.log" >> "$SUMMARY"; fi
grep -E "Traceback|Error" "$LOGS/bench.log" | sort | uniq -c | head -20 >> "$SUMMARY"

tar -czf "$RESULTS/logs.tar.gz" -C "$RESULTS" logs && rm -rf "$LOGS"
echo "results: $SUMMARY, logs: $RESULTS/logs.tar.gz"
for name in install gpu-tests fuzz fuzz-train fuzz-dynamic fuzz-classes front-end bench; do
    [ "${RC[$name]}" = 0 ] || exit 1
done
exit 0
