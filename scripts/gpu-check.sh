#!/usr/bin/env bash
# The GPU check (issue #7), for a machine with an NVIDIA GPU, the CUDA toolkit, NCCL and emu's other
# dependencies (scripts/setup.sh): builds the cuda preset, runs the GPU parity tests (CUDA ops against the CPU
# kernels, the CUDA device, NCCL against MPI) and a short 2-rank emu run, then prints a summary. Under 8 minutes
# on one H100/H200 with 16 cores; every stage has its own time limit.
#
#   scripts/gpu-check.sh            # exit 0 only if every stage passed and no GPU test was skipped
#
# Environment: JOBS (build parallelism, default nproc), CUDA_ARCHS (CMAKE_CUDA_ARCHITECTURES, default: the
# preset's 80;90).
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
jobs=${JOBS:-$(nproc)}
declare -a summary
status=0

stage() {  # stage NAME SECONDS COMMAND...: runs one stage under a time limit, records PASS/FAIL and its time
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  echo "== ${name}"
  if timeout "${limit}" "$@"; then
    summary+=("PASS  ${name} ($(($(date +%s) - t0)) s)")
  else
    local rc=$?
    summary+=("FAIL  ${name} (exit ${rc}, $(($(date +%s) - t0)) s)")
    status=1
  fi
}

echo "== GPUs"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,memory.total,memory.used,compute_cap --format=csv
else
  echo "nvidia-smi not found: the GPU tests below will report themselves skipped"
fi

configure=(cmake --preset cuda)
[[ -n "${CUDA_ARCHS:-}" ]] && configure+=("-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS}")
stage "configure (cuda preset)" 120 "${configure[@]}"
stage "build (cuda preset, -j${jobs})" 300 cmake --build --preset cuda -j "${jobs}"

# The GPU tests; a skipped test (no GPU seen) is a failure of this script, since it exists to run them.
ctest_log=$(mktemp)
stage "GPU parity tests (ctest -L gpu)" 120 \
  bash -c "ctest --test-dir build/cuda -L gpu --output-on-failure --timeout 100 2>&1 | tee '${ctest_log}'; exit \${PIPESTATUS[0]}"
if grep -q "Not Run\|Skipped" "${ctest_log}"; then
  summary+=("FAIL  GPU tests were skipped (no GPU visible?): $(grep -c '(Skipped)' "${ctest_log}") of them")
  status=1
fi

# A short 2-rank training run of the CUDA build's emu. The app still makes CPU devices and MPI communicators
# (emu/app/run.cpp does not select through make_device / make_communicator yet), so this checks that the CUDA
# build runs every strategy end to end; the GPU itself is exercised by the tests above.
stage "2-rank emu run (gpt2, shrink 8, ddp+zero2+fsdp, 2 steps)" 120 \
  scripts/mpirun -np 2 build/cuda/bin/emu --model gpt2 --shrink 8 --steps 2 --strategies ddp,zero2,fsdp \
  --cap 80GB-scaled

echo
echo "== summary ($(($(date +%s) - start)) s)"
printf '%s\n' "${summary[@]}"
exit "${status}"
