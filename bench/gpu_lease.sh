#!/usr/bin/env bash
# A short GPU lease in one call: gpu_session.sh's checks in order of what they decide, each cut to
# the time left before a deadline, every log packed into one archive after each stage (so a call
# stopped at its limit still brings back what it measured).
#
#   DEADLINE_S=540 OUT=/some/dir bash bench/gpu_lease.sh          # carry: .whl (the peers' wheels)
#
# Order (what the first lease, an H200 on 2026-11-28, left open: bench/results/gpu_h200_first_lease.md):
# env, build, whether a C++ op's ValueError crashes the process (bench/exception_probe.py: every
# cuda test expecting one segfaulted its worker), the cuda and triton tests (14 workers: Triton compiles
# dominate), where each step's time goes kernel by kernel (bench/kernel_times.py), the ceilings
# (GEMMs of the floor's own shapes), the peers at
# K = 16384 and 65536 (bench/peer_bench.py: Inf-CL, plain InfoNCE, ours), the sanitizers, the
# K = 65536 cells the first lease did not reach, Nsight Compute on one triton step, the demo.
# Wheels under .whl/ (inf-cl: pip download --no-deps -d .whl inf-cl==1.2.1) are installed first.
# Writes $OUT/lease.tgz (every log and table) and $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
FINAL_OUT="${OUT:-/tmp/gpu_lease}"
WORK=/tmp/gpu_lease_work
mkdir -p "$FINAL_OUT" "$WORK"
DEADLINE=$((SECONDS + ${DEADLINE_S:-540}))
PY="${PYTHON:-python3}"
export OUT="$WORK" PYTHONUNBUFFERED=1
# shellcheck source=/dev/null
source <(sed -n '/^set -uo pipefail/,/^stages=(/p' bench/gpu_session.sh | sed '$d')
cd "$ROOT"

pack() {
  tar -czf "$FINAL_OUT/lease.tgz.part" -C "$WORK" . && mv "$FINAL_OUT/lease.tgz.part" "$FINAL_OUT/lease.tgz"
  cp "$SUMMARY" "$FINAL_OUT/summary.txt"
}

# run_for <cap seconds> <label> <command...>: the command under min(cap, time left - 15 s).
run_for() {
  local cap=$1 label=$2 left
  shift 2
  left=$((DEADLINE - SECONDS - 15))
  if ((left < 20)); then
    note "$label: skipped (deadline)"
    return 1
  fi
  ((cap > left)) && cap=$left
  echo "== $label (at most $cap s)"
  local start=$SECONDS
  # Functions cannot run under timeout(1): each stage runs as its own process group, killed whole
  # (pip's compilers, pytest's workers) when its time is up.
  set -m
  "$@" &
  local pid=$!
  (sleep "$cap" && kill -TERM -- "-$pid" 2>/dev/null && sleep 5 && kill -KILL -- "-$pid" 2>/dev/null) \
    </dev/null >/dev/null 2>&1 &
  local watcher=$!
  set +m
  wait "$pid"
  local rc=$?
  kill -- "-$watcher" 2>/dev/null
  ((rc == 143 || rc == 137)) && rc=124
  note "$label: exit $rc in $((SECONDS - start)) s$( ((rc == 124)) && echo ' (timed out)')"
  pack
  return $rc
}

lease_tests() {
  local deselect=() PLUGINS=()
  # Parallel workers compile the Triton variants side by side; a hung kernel fails its test alone.
  in_out "$PY" -c "import xdist" 2>/dev/null && PLUGINS+=(-n 14)
  in_out "$PY" -c "import pytest_timeout" 2>/dev/null && PLUGINS+=(--timeout 150)
  for t in "${POISONING[@]}"; do deselect+=(--deselect "$ROOT/python_tests/$t"); done
  in_out "$PY" -m pytest "$ROOT/python_tests/test_cuda_backend.py" "$ROOT/python_tests/test_fused_backends.py" \
    "$ROOT/python_tests/test_triton_backend.py" "$ROOT/python_tests/test_fused_infonce.py" \
    -k "cuda or triton" "${PLUGINS[@]}" -q -p no:cacheprovider -rfE --durations=15 "${deselect[@]}" \
    >"$WORK/tests.log" 2>&1
  local rc=$?
  note "tests (cuda, triton): $(tail -n 1 "$WORK/tests.log")"
  return $rc
}

lease_bench() {  # lease_bench <sizes> <precisions...>
  local sizes=$1
  shift
  in_out "$PY" "$ROOT/bench/device_bench.py" --device cuda --d 1024 --append --out "$WORK" --sizes "$sizes" \
    --precisions "$@" --impls triton cuda floor --repeats 3 >>"$WORK/bench.log" 2>&1
}

lease_sanitize() {  # lease_sanitize <tool>
  local flags=(--tool "$1" --error-exitcode 7)
  [[ $1 != memcheck ]] && flags+=(--kernel-name kns=evidential_ops)
  in_out env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer "${flags[@]}" "$PY" "$ROOT/bench/sanitize_cuda.py" \
    >"$WORK/sanitize_$1.log" 2>&1
  local rc=$?
  note "sanitize $1: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|cases ran' "$WORK/sanitize_$1.log" | tr '\n' ' ')"
  return $rc
}

lease_demo() {
  in_out "$PY" -m evidential_ops demo --method tcl --device cuda --out "$WORK/demo_cuda" >"$WORK/demo_cuda.log" 2>&1
}

lease_exceptions() {
  in_out "$PY" "$ROOT/bench/exception_probe.py" >"$WORK/exceptions.log" 2>&1
  local rc=$?
  note "exceptions: $(head -n 3 "$WORK/exceptions.log" | tr -s ' ' | tr '\n' ';')"
  return $rc
}

lease_kernel_times() {
  in_out "$PY" "$ROOT/bench/kernel_times.py" --backends cuda triton --cases tcl uml --precisions tf32 bf16 ieee \
    --k 16384 --d 1024 --repeats 3 --out "$WORK/kernel_times.json" >"$WORK/kernel_times.log" 2>&1
}

lease_peers() {
  in_out "$PY" "$ROOT/bench/peer_bench.py" --sizes 16384 65536 --d 1024 --precisions bf16 tf32 \
    --out "$WORK/peers.json" >"$WORK/peers.log" 2>&1
  local rc=$?
  note "peers: $(grep -c ': ' "$WORK/peers.log") cells; $(grep 'K=65536' "$WORK/peers.log" | tr '\n' ';')"
  return $rc
}

if compgen -G "$ROOT/.whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$ROOT"/.whl/*.whl &&
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
run_for 30 env stage_env
run_for 240 build stage_build || { pack; cat "$SUMMARY"; exit 1; }
run_for 60 exceptions lease_exceptions
run_for 200 tests lease_tests
run_for 80 "kernel times" lease_kernel_times
run_for 30 ceilings stage_ceilings
run_for 120 peers lease_peers
for tool in memcheck racecheck synccheck initcheck; do run_for 30 "sanitize $tool" lease_sanitize "$tool"; done
run_for 120 bench64k lease_bench 65536 tf32
run_for 60 ncu stage_ncu
run_for 60 demo lease_demo
pack
echo
echo "== summary"
cat "$SUMMARY"
tail -n 60 "$WORK"/cuda_*.md 2>/dev/null
grep -E "^(FAILED|ERROR)" "$WORK/tests.log" 2>/dev/null | head -n 30
