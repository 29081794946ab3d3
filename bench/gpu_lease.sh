#!/usr/bin/env bash
# A short GPU lease in one call: gpu_session.sh's checks in order of what they decide, each cut to
# the time left before a deadline, every log packed into one archive after each stage (so a call
# stopped at its limit still brings back what it measured).
#
#   DEADLINE_S=570 OUT=/some/dir bash bench/gpu_lease.sh          # the peers' wheels under .whl/
#   PART=1 ... then at once PART=2 ...                            # two calls of one warm machine
#
# Order (what the fourth lease left open: bench/results/gpu_h200_fourth_lease.md): env and build;
# then the checks whose results do not depend on timing, side by side: the cuda and triton tests
# (14 workers: Triton compiles dominate; the two that poison a process's CUDA context run alone
# after) beside, one after another, whether a C++ op's ValueError crashes the process
# (bench/exception_probe.py) and the four sanitizers. Then, alone on the GPU: K = 16384 at every
# precision, the fused backends at K = 1024 and 4096 and at the largest K (cells the table still
# lacks), the triton step's host side (bench/host_profile.py: the GPU idled 7-15 ms of its
# K = 16384 steps), Nsight Compute on the element kernels of both backends (stage_ncu_element: up
# to 2.7x the model's issue bound), kernel by kernel (bench/kernel_times.py), the memory peak at
# K = 65536 (bench/memory_peak.py), the eager reference and its torch.compile at K = 1024 and 4096,
# then the K = 65536 cells and the peers (bench/peer_bench.py) measured before.
# The stages are gpu_session.sh's (sourced); wheels under .whl/ are installed first (gpu_session.sh).
# Writes $OUT/lease.tgz (every log and table) and $OUT/summary.txt.
set -uo pipefail
FINAL_OUT="${OUT:-/tmp/gpu_lease}"
WORK=/tmp/gpu_lease_work
mkdir -p "$FINAL_OUT" "$WORK"
DEADLINE=$((SECONDS + ${DEADLINE_S:-570}))
export OUT="$WORK"
# shellcheck source=bench/gpu_session.sh
source "$(dirname "$0")/gpu_session.sh"

# Two stages may pack at once (the checks beside the tests): each writes its own part file, and the
# rename is atomic. tar's exit 1 is a file that changed while it was read (a log still growing).
pack() {
  local part="$FINAL_OUT/lease.tgz.$BASHPID.part"
  tar -czf "$part" -C "$WORK" . 2>/dev/null
  if (($? <= 1)); then mv "$part" "$FINAL_OUT/lease.tgz"; else rm -f "$part"; fi
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
  # The stage's shell may end at the watcher's SIGTERM while a child that ignores it lives on
  # (holding the GPU through later stages): the whole group is killed before the watcher is.
  kill -KILL -- "-$pid" 2>/dev/null
  kill -- "-$watcher" 2>/dev/null
  ((rc == 143 || rc == 137)) && rc=124
  note "$label: exit $rc in $((SECONDS - start)) s$( ((rc == 124)) && echo ' (timed out)')"
  pack
  return $rc
}

# The checks beside the tests: the exception probe, then each sanitizer under its own cap.
# The fourth lease's caps (60 s, 40 s each) cut the probe after 3 of its 6 cases (about 20 s a
# case beside 14 test workers) and memcheck and racecheck before their end: these fit in the
# tests' own time.
beside_the_tests() {
  run_for 130 exceptions stage_exceptions
  local tool cap
  for tool in memcheck racecheck synccheck initcheck; do
    cap=50
    [[ $tool == memcheck || $tool == racecheck ]] && cap=80
    run_for $cap "sanitize $tool" stage_sanitize "$tool"
  done
}

# PART=1: the build and the checks (tests, probe, sanitizers); PART=2: the timings, on the machine part 1 leaves warm
# (its build and logs kept: call it at once, before the machine is given back); unset: both.
PART="${PART:-all}"
if [[ $PART != 2 ]]; then
  run_for 30 env stage_env
  run_for 240 build stage_build || { pack; cat "$SUMMARY"; exit 1; }
  beside_the_tests &
  beside=$!
  # 420 s: the fourth lease's tests took 286 s with 14 workers beside the sanitizers, and the two
  # run alone took 114 s on the third (the fourth's cap of 320 s cut them).
  run_for 420 tests stage_test "$ROOT/python_tests/test_cuda_backend.py" "$ROOT/python_tests/test_fused_backends.py" \
    "$ROOT/python_tests/test_triton_backend.py" "$ROOT/python_tests/test_fused_infonce.py" -k "cuda or triton"
  wait "$beside"
fi
if [[ $PART != 1 ]]; then
  # What the table still lacks comes first (K = 1024 and 4096 of the fused backends; the largest K),
  # then the diagnostics, then the cells measured before.
  run_for 90 bench16k bench bench16k --sizes 16384 --precisions tf32 bf16 ieee --impls triton cuda floor --repeats 3
  run_for 45 "strips 256 MiB" stage_strips256
  run_for 60 "bench small" bench bench_small --sizes 1024 4096 --precisions ieee tf32 bf16 --impls triton cuda floor \
    --repeats 5
  # Beyond K = 65536 (the issue asks for the largest K each fused backend reaches; the K×K floor
  # would need 128 GiB at 262144): TCL, bf16, one timed step each.
  run_for 90 "bench largest K" bench bench_largest --sizes 131072 262144 --cases tcl --precisions bf16 \
    --impls cuda triton --repeats 1
  run_for 60 "host profile" stage_host_profile
  run_for 100 "ncu element" stage_ncu_element
  run_for 80 "kernel times" stage_kernel_times
  run_for 60 "memory peak" stage_memory_peak
  # the eager reference and its torch.compile (a compile per case and precision: ieee alone)
  run_for 150 "bench baselines" bench bench_baselines --sizes 1024 4096 --precisions ieee \
    --impls reference compiled --repeats 5
  run_for 120 bench64k bench bench64k --sizes 65536 --precisions bf16 ieee --impls triton cuda floor --repeats 3
  run_for 120 peers stage_peers
fi
pack
echo
echo "== summary"
cat "$SUMMARY"
tail -n 60 "$WORK"/cuda_*.md 2>/dev/null
grep -E "^(FAILED|ERROR)" "$WORK/tests.log" 2>/dev/null | head -n 30
