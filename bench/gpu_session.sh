#!/usr/bin/env bash
# One lent GPU, few calls: build, test, sanitize, benchmark and demo in stages, logs under $OUT.
#
#   bash bench/gpu_session.sh env build test             # call 1 (each call well under 10 minutes)
#   bash bench/gpu_session.sh sanitize                   # call 2
#   bash bench/gpu_session.sh bench4k bench16k           # call 3
#   bash bench/gpu_session.sh bench64k autotune tiles16k # call 4
#   bash bench/gpu_session.sh ncu                        # call 4b
#   bash bench/gpu_session.sh demo distributed           # call 5
#   bash bench/gpu_session.sh ceilings model             # after the bench calls: calibrate the model
#
# Stages (each builds first if the installed package has no CUDA kernels):
#   env         GPU, driver, torch, triton, nvcc
#   build       pip install --no-build-isolation -e . (the extension beside the sources, which the
#               tests and bench scripts import from the checkout) against the machine's torch, nothing fetched
#               (TORCH_CUDA_ARCH_LIST=9.0 by default here: the lent GPUs are Hoppers)
#   test        the whole python_tests suite: CPU, cuda and triton. The two torch.compile tests that
#               feed a NaN (check_finite's device-side assert poisons the CUDA context for every later
#               test) run last, each in its own process
#   aot         Triton's registers and spills as the GPU's own toolchain sees them
#   sanitize    compute-sanitizer memcheck, racecheck, synccheck, initcheck on bench/sanitize_cuda.py
#   bench4k, bench16k, bench64k
#               bench/device_bench.py: TCL/UML/DUQ, D = 1024, every fused backend + eager reference,
#               torch.compile of it and the floor at the same precision (ieee, tf32, bf16); K = 65536
#               without the K×K baselines (they need ~200 GiB); merged into one table
#   autotune    the triton rows again with EO_TRITON_AUTOTUNE=1 (K = 16384)
#   tiles16k    the triton rows (K = 16384, every precision) with the tile kernels' own s instead
#               of cuBLAS strips (EO_TRITON_IEEE_STRIPS_ABOVE_D, EO_TRITON_STRIPS_ABOVE_D and
#               EO_TRITON_HALF_STRIPS_ABOVE_D beyond D): measures launch.similarity_strips' choice
#   strips256   the triton TCL rows (K = 16384, tf32 and bf16) with 256 MiB strips and blocks
#               (EO_TRITON_STRIP_MIB): fewer launches of a host-bound step, at more memory
#   ncu         Nsight Compute on one triton TCL step, K = 16384, D = 1024 (bench/ncu_step.py), bf16
#               and tf32 (both strip sweeps), its backward and its forward in separate runs:
#               tensor pipe beside issue activity, warp stalls
#   ncu_element Nsight Compute on the element kernels of both backends (TCL, TF32, K = 16384):
#               issue, pipes, occupancy, stalls, instruction mix, stalls per SASS instruction
#   exceptions  bench/exception_probe.py: does a C++ op's ValueError raise, or crash the process
#   kernel_times  bench/kernel_times.py: each kernel's device time in one step, GPU idle, host time
#   host_profile  bench/host_profile.py: cProfile of the triton step's host side (bf16, tf32)
#   memory_peak bench/memory_peak.py: what is live at a K = 65536 step's memory peak, by call site
#   peers       bench/peer_bench.py: Inf-CL, plain InfoNCE, our InfoNCE and TCL (wheels under .whl/)
#   demo        `python -m evidential_ops demo --method tcl --device cuda`, then on the CPU
#   distributed bench/distributed_check.py over NCCL (one process per GPU)
#   ceilings    this GPU's real ceilings for the performance model (bench/gpu_model.py
#               --measure-ceilings: a 4 GiB device copy, an L2-resident copy, the floor's three
#               torch GEMMs at K = 16384, D = 1024 per precision, an empty launch, a host read) into
#               ceilings.json
#   model       the model (predicted, from the code and its static SASS profile) with those
#               ceilings, printed beside what bench4k/bench16k/bench64k measured, row by row:
#               gpu_model_compare.md; the first lent GPU calibrates the model with it
# Results and logs land in $OUT (the device tool brings them back): copy the cuda_*.json/.md table
# to bench/results/ and commit it with the device named. The summary is printed last.
set -uo pipefail
# BASH_SOURCE, not $0: sourced from a command line ($0 "bash"), the script still finds the checkout.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
OUT="${OUT:-/tmp/gpu_session}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-16}" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
unset TRITON_INTERPRET
PY="${PYTHON:-python3}"
SUMMARY="$OUT/summary.txt"
touch "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
# Run from $OUT so that the installed package (with its CUDA kernels) is imported, not the checkout.
in_out() { (cd "$OUT" && "$@"); }
# Python packages the machine lacks travel as wheels under .whl/ (copied with the checkout): the
# peers' (inf-cl: pip download --no-deps -d .whl inf-cl==1.2.1).
if compgen -G "$ROOT/.whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$ROOT"/.whl/*.whl &&
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

stage_env() {
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
    "$PY" -c "import triton; print('triton', triton.__version__)" 2>&1
    nvcc --version | tail -n 1
  } | tee "$OUT/env.txt"
  note "env: $(head -n 1 "$OUT/env.txt")"
}

built() { in_out "$PY" -c "import evidential_ops as eo; assert 'cuda=on' in eo.build_info()" 2>/dev/null; }

stage_build() {
  local start=$SECONDS
  if ! "$PY" -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1; then
    tail -n 60 "$OUT/build.log"
    note "build: FAILED (see build.log)"
    return 1
  fi
  in_out "$PY" -c "import evidential_ops as eo; print(eo.build_info(), eo.available_backends())" | tee -a "$OUT/build.log"
  note "build: $((SECONDS - start)) s; $(tail -n 1 "$OUT/build.log")"
  # The machine's CXX once linked libstdc++ statically into the extension, and every C++ op's
  # ValueError then crashed its process (setup.py's _runtime_link_args): the test that asks the
  # loader, at once, whatever the test stage selects.
  in_out "$PY" -m pytest -q -p no:cacheprovider "$ROOT/python_tests/test_api.py::test_extension_throws_with_torchs_cpp_runtime" \
    >"$OUT/build_runtime.log" 2>&1
  note "build: one C++ runtime with torch: $(tail -n 1 "$OUT/build_runtime.log")"
}

need_build() { built || stage_build; }

POISONING=(
  "test_fused_backends.py::test_torch_compile_fullgraph_training_step_with_check_finite[cuda]"
  "test_fused_backends.py::test_torch_compile_fullgraph_training_step_with_check_finite[triton]"
)

# stage_test [pytest selection...]: the whole python_tests suite by default
stage_test() {
  need_build || return 1
  local start=$SECONDS deselect=() plugins=() selection=() item
  # pytest runs in $OUT: paths of the checkout are made absolute (the third lease's follow-up call
  # passed python_tests/... and ran no tests).
  for item in "$@"; do
    [[ $item == python_tests* || $item == bench/* ]] && item="$ROOT/$item"
    selection+=("$item")
  done
  [[ ${#selection[@]} -eq 0 ]] && selection=("$ROOT/python_tests")
  # --deselect matches test ids, which are relative to the rootdir (pyproject.toml's): an absolute
  # path deselects nothing.
  for t in "${POISONING[@]}"; do deselect+=(--deselect "python_tests/$t"); done
  # Parallel workers compile the Triton variants side by side; a hung kernel fails its test alone.
  in_out "$PY" -c "import xdist" 2>/dev/null && plugins+=(-n 14)
  in_out "$PY" -c "import pytest_timeout" 2>/dev/null && plugins+=(--timeout 150)
  in_out "$PY" -m pytest "${selection[@]}" "${plugins[@]}" -q -p no:cacheprovider -rfE --durations=15 \
    "${deselect[@]}" >"$OUT/tests.log" 2>&1
  note "test: $(tail -n 1 "$OUT/tests.log") ($((SECONDS - start)) s)"
  for t in "${POISONING[@]}"; do
    in_out "$PY" -m pytest "$ROOT/python_tests/$t" -q -p no:cacheprovider >>"$OUT/tests.log" 2>&1
    note "test (alone) $t: $(tail -n 1 "$OUT/tests.log")"
  done
}

stage_aot() {
  in_out "$PY" -m evidential_ops.triton_backend.aot_check --arch 90 >"$OUT/aot.log" 2>&1
  note "aot: $(tail -n 1 "$OUT/aot.log")"
}

# stage_sanitize [tools...]: all four by default
stage_sanitize() {
  need_build || return 1
  local tool flags tools=("$@")
  [[ ${#tools[@]} -eq 0 ]] && tools=(memcheck racecheck synccheck initcheck)
  for tool in "${tools[@]}"; do
    flags=(--tool "$tool" --error-exitcode 7)
    # Our kernels only, except for initcheck: a filtered initcheck does not see what cuBLAS and
    # torch's kernels write and takes every later read of it as uninitialised (the H200's second
    # lease: s from cuBLAS, a reduction's result). memcheck is filtered now too (it ran unfiltered
    # before): it checks our kernels' accesses, no longer cuBLAS's and torch's into our buffers.
    # memcheck, racecheck and initcheck take sanitize_cuda.py --quick: the whole run did not
    # finish under either of the first two in 40 s.
    [[ $tool != initcheck ]] && flags+=(--kernel-name kns=evidential_ops)
    local cases=()
    [[ $tool != synccheck ]] && cases=(--quick)
    if [[ $tool == memcheck || $tool == initcheck ]]; then
      # Without the caching allocator every tensor is its own allocation: out-of-bounds accesses
      # inside what would be one cached block become visible.
      in_out env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer "${flags[@]}" "$PY" "$ROOT/bench/sanitize_cuda.py" \
        "${cases[@]}" >"$OUT/sanitize_$tool.log" 2>&1
    else
      in_out compute-sanitizer "${flags[@]}" "$PY" "$ROOT/bench/sanitize_cuda.py" "${cases[@]}" \
        >"$OUT/sanitize_$tool.log" 2>&1
    fi
    note "sanitize $tool: exit $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|cases ran' "$OUT/sanitize_$tool.log" | tr '\n' ' '))"
  done
}

bench() {  # bench <label> <device_bench arguments...>
  need_build || return 1
  local label=$1 start=$SECONDS
  shift
  in_out "$PY" "$ROOT/bench/device_bench.py" --device cuda --d 1024 --append --out "$OUT" "$@" >>"$OUT/bench.log" 2>&1
  note "$label: exit $? in $((SECONDS - start)) s"
}
stage_bench4k() { bench bench4k --sizes 4096 --precisions ieee tf32 bf16 --repeats 5; }
stage_bench16k() { bench bench16k --sizes 16384 --precisions ieee tf32 bf16 --repeats 3; }
stage_bench64k() {
  bench bench64k --sizes 65536 --precisions ieee bf16 --repeats 3 --skip-baselines-above 16384
}
stage_autotune() {
  EO_TRITON_AUTOTUNE=1 bench autotune --sizes 16384 --precisions ieee bf16 --repeats 3 --impls triton \
    --name triton_autotuned
}

# stage_strips256: the triton TCL step at K = 16384 with 256 MiB strips and blocks instead of the
# default budget's ~55 MiB (EO_TRITON_STRIP_MIB): about 5x fewer strips, so 5x fewer launches of
# the host-bound steps (the fourth lease: 19.7 ms to enqueue at tf32, 29.5 at bf16, against 13.1
# and 12.6 ms of kernels). Whether the launches are what bounds it, at 4x the extra memory.
stage_strips256() {
  EO_TRITON_STRIP_MIB=256 bench strips256 --sizes 16384 --cases tcl --precisions tf32 bf16 --repeats 3 \
    --impls triton --name triton_strips256
}

stage_tiles16k() {
  EO_TRITON_STRIPS_ABOVE_D=1048576 EO_TRITON_IEEE_STRIPS_ABOVE_D=1048576 EO_TRITON_HALF_STRIPS_ABOVE_D=1048576 \
    bench tiles16k --sizes 16384 --precisions ieee tf32 bf16 --repeats 3 --impls triton floor \
    --name triton_tiles
}

stage_ncu() {
  need_build || return 1
  local prec part
  # Hardware counters at the clocks the card runs at (--clock-control none: ncu would otherwise lock
  # them to base), the profiled window the one part ncu_step.py brackets with cudaProfilerStart/Stop. 4 launches:
  # two strips' kernels (an eager exp-evidence backward launches one grad_block_kernel variant).
  for prec in bf16 tf32; do
    for part in backward forward; do
      in_out ncu --profile-from-start off --clock-control none --kernel-name regex:'stats_kernel|grad_block_kernel' \
        --launch-count 4 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
        "$PY" "$ROOT/bench/ncu_step.py" --case tcl --precision "$prec" --part "$part" >"$OUT/ncu_${prec}_$part.log" 2>&1
      note "ncu $prec $part: exit $? ($(grep -c 'grad_block_kernel\|stats_kernel' "$OUT/ncu_${prec}_$part.log") kernel lines)"
    done
  done
}

# stage_ncu_element: why the element kernels take up to 2.7x their static issue bound (the fourth lease:
# cuda forward_stats_kernel 2.99 ms and gradient_kernel 2.68 ms at TF32, K = 16384, against 1.14
# and 0.98 predicted, bench/results/gpu_model_vs_h200.md; triton's stats_kernel 2.90 ms): issue
# activity, pipe use, occupancy and what the warps stall on, one launch of each kernel, TF32 strips;
# and per SASS instruction where the stalls were sampled (SourceCounters, printed from the report
# as CSV: ncu_element_<backend>_<part>_sass.csv), to tell the float64 line sums, the warp staging
# and the element functions apart. The reports themselves stay out of $OUT (their size).
stage_ncu_element() {
  need_build || return 1
  local backend part kernels report status
  for backend in cuda triton; do
    kernels='forward_stats_kernel|gradient_kernel'
    [[ $backend == triton ]] && kernels='stats_kernel|grad_block_kernel'
    for part in forward backward; do
      report="/tmp/ncu_element_${backend}_$part"
      in_out ncu --profile-from-start off --clock-control none --kernel-name regex:"$kernels" --launch-count 2 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy \
        --section LaunchStats --section InstructionStats --section SourceCounters -f -o "$report" \
        "$PY" "$ROOT/bench/ncu_step.py" --backend "$backend" --case tcl --precision tf32 --part "$part" \
        >"$OUT/ncu_element_${backend}_$part.run.log" 2>&1
      status=$?
      ncu --import "$report.ncu-rep" >"$OUT/ncu_element_${backend}_$part.log" 2>&1
      note "ncu element $backend $part: exit $status ($(grep -cE "$kernels" "$OUT/ncu_element_${backend}_$part.log") kernel lines)"
      ncu --import "$report.ncu-rep" --page source --print-source sass --csv \
        >"$OUT/ncu_element_${backend}_${part}_sass.csv" 2>&1
      note "ncu element $backend $part, SASS page: exit $? ($(wc -l <"$OUT/ncu_element_${backend}_${part}_sass.csv") lines)"
    done
  done
}

# stage_demo [devices...]: cuda, then cpu, by default
stage_demo() {
  need_build || return 1
  local device devices=("$@")
  [[ ${#devices[@]} -eq 0 ]] && devices=(cuda cpu)
  for device in "${devices[@]}"; do
    in_out "$PY" -m evidential_ops demo --method tcl --device "$device" --out "$OUT/demo_$device" \
      >"$OUT/demo_$device.log" 2>&1
    note "demo $device: $(grep -m1 '^trained' "$OUT/demo_$device.log")"
  done
}

stage_distributed() {
  need_build || return 1
  local gpus
  gpus=$(nvidia-smi -L | wc -l)
  in_out torchrun --standalone --nproc-per-node "$gpus" "$ROOT/bench/distributed_check.py" --device cuda \
    --out "$OUT/nccl_check.json" >"$OUT/distributed.log" 2>&1
  note "distributed ($gpus GPU): exit $? ($(tail -n 1 "$OUT/distributed.log"))"
}

stage_exceptions() {
  need_build || return 1
  in_out "$PY" "$ROOT/bench/exception_probe.py" >"$OUT/exceptions.log" 2>&1
  local rc=$?
  note "exceptions: $(head -n 6 "$OUT/exceptions.log" | tr -s ' ' | tr '\n' ';')"
  return $rc
}

# stage_host_profile: what the triton step's host does while the GPU idles (bench/host_profile.py)
stage_host_profile() {
  need_build || return 1
  in_out "$PY" "$ROOT/bench/host_profile.py" --backend triton --precisions bf16 tf32 --k 16384 --d 1024 \
    >"$OUT/host_profile.log" 2>&1
  note "host profile: exit $? ($(grep '^== ' "$OUT/host_profile.log" | tr '\n' ';'))"
}

stage_kernel_times() {
  need_build || return 1
  in_out "$PY" "$ROOT/bench/kernel_times.py" --backends cuda triton --cases tcl uml --precisions tf32 bf16 ieee \
    --k 16384 --d 1024 --repeats 3 --out "$OUT/kernel_times.json" >"$OUT/kernel_times.log" 2>&1
  note "kernel times: exit $? ($(grep -c ' ms (events)' "$OUT/kernel_times.log") steps)"
}

stage_memory_peak() {
  need_build || return 1
  in_out "$PY" "$ROOT/bench/memory_peak.py" --backends triton cuda --precisions bf16 ieee --k 65536 --d 1024 \
    --out "$OUT/memory_peak.json" >"$OUT/memory_peak.log" 2>&1
  note "memory peak: exit $? ($(grep -c ' beyond the two gradients' "$OUT/memory_peak.log") steps)"
}

stage_peers() {
  need_build || return 1
  in_out "$PY" "$ROOT/bench/peer_bench.py" --sizes 65536 16384 --d 1024 --precisions bf16 tf32 \
    --out "$OUT/peers.json" >"$OUT/peers.log" 2>&1
  local rc=$?
  note "peers: $(grep -c ': ' "$OUT/peers.log") cells; $(grep 'K=65536' "$OUT/peers.log" | tr '\n' ';')"
  return $rc
}

stage_ceilings() {
  in_out "$PY" "$ROOT/bench/gpu_model.py" --measure-ceilings "$OUT/ceilings.json" >"$OUT/ceilings.log" 2>&1
  note "ceilings: exit $? ($(tail -n 1 "$OUT/ceilings.log"))"
}

stage_model() {
  local name device=h100-sxm ceilings=() bench=() profile=()
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
  case "$name" in
    *H200*) device=h200 ;;
    *A100*) device=a100-sxm ;;
  esac
  [[ -f $OUT/ceilings.json ]] && ceilings=(--ceilings "$OUT/ceilings.json")
  for f in "$OUT"/cuda_*.json; do [[ -f $f ]] && bench+=("$f"); done
  [[ ${#bench[@]} -gt 0 ]] && bench=(--compare "${bench[@]}")
  # The static profile of this checkout's kernels first (nvcc, triton): the model reads it.
  env -u TRITON_INTERPRET "$PY" "$ROOT/bench/static_profile.py" --out "$OUT/static_profile.md" >"$OUT/model.log" 2>&1
  [[ -f $OUT/static_profile.json ]] && profile=(--profile "$OUT/static_profile.json")
  "$PY" "$ROOT/bench/gpu_model.py" "${profile[@]}" --device "$device" --d 1024 --out "$OUT/gpu_model.md" \
    "${ceilings[@]}" "${bench[@]}" >"$OUT/gpu_model_compare.md" 2>>"$OUT/model.log"
  note "model ($device, ${ceilings[*]:-datasheet ceilings}): exit $? ($(grep -c '^| ' "$OUT/gpu_model_compare.md") table lines in gpu_model_compare.md)"
  cat "$OUT/gpu_model_compare.md"
}

# Sourced (bench/gpu_lease.sh), the stages are defined and nothing runs.
[[ "${BASH_SOURCE[0]}" != "$0" ]] && return 0
stages=("$@")
[[ ${#stages[@]} -eq 0 ]] && stages=(env build test)
for stage in "${stages[@]}"; do
  echo "== $stage"
  "stage_$stage"
done
echo
echo "== summary"
cat "$SUMMARY"
ls "$OUT"/*.md 2>/dev/null && tail -n 40 "$OUT"/cuda_*.md 2>/dev/null
