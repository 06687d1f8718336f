#!/usr/bin/env bash
# The GPU check (issue #7), for a machine with an NVIDIA GPU, the CUDA toolkit, NCCL and emu's other
# dependencies (scripts/setup.sh): builds the cuda preset, runs the GPU parity tests (CUDA ops against the CPU
# kernels, the CUDA device, NCCL against MPI, a training step), emu training runs on the GPU compared with the same
# runs on the CPU (8 emulated GPUs sharing one card; a 2-rank GPT-2 run; NCCL where there are several GPUs), then
# prints a summary. Under 8 minutes on one H100/H200 with 16 cores; every stage has its own time limit.
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

# Training runs of emu itself on the GPU (--device cuda), each beside the same run on the CPU: the memory
# accounting must agree to the byte and the losses within 1e-3 relative (check-runs below, from the two JSON files).
out=$(mktemp -d)
emu_pair() {  # emu_pair NAME RANKS ARGS...: the run on cuda and on cpu, then the comparison
  local name=$1 ranks=$2
  shift 2
  scripts/mpirun -np "${ranks}" build/cuda/bin/emu --device cuda --json "${out}/${name}-cuda.json" "$@" &&
    scripts/mpirun -np "${ranks}" build/cuda/bin/emu --device cpu --json "${out}/${name}-cpu.json" "$@" >/dev/null &&
    python3 - "${out}/${name}-cuda.json" "${out}/${name}-cpu.json" <<'PY'
import json, sys
gpu, cpu = (json.load(open(path)) for path in sys.argv[1:3])
bad = 0
for g, c in zip(gpu["strategies"], cpu["strategies"]):
    for key in ("peak_bytes_per_rank", "verdict", "traffic_per_step"):
        if g.get(key) != c.get(key):
            print(f"{g['name']}: {key} cuda {g.get(key)} != cpu {c.get(key)}"); bad += 1
    for step, (lg, lc) in enumerate(zip(g["losses"], c["losses"]), 1):
        if abs(lg - lc) > 1e-3 * abs(lc):
            print(f"{g['name']}: step {step} loss cuda {lg} vs cpu {lc}"); bad += 1
print(f"cuda vs cpu: {len(gpu['strategies'])} strategies compared, {bad} differences")
sys.exit(1 if bad else 0)
PY
}
export -f emu_pair  # stage runs its command under timeout, in a new shell
export out
# Several emulated GPUs on one real GPU (collectives over MPI): 8 x A100-40GB on one card, the README's default job.
stage "8 ranks on one GPU, the default job (--device cuda vs cpu)" 150 \
  bash -c 'emu_pair "$@"' _ default8 8 --cap 40GB-scaled
# A GPT-2 run with eager attention (the score matrix saved) and fp32, 2 ranks.
stage "2 ranks, gpt2 fp32 eager attention (--device cuda vs cpu)" 90 \
  bash -c 'emu_pair "$@"' _ gpt2 2 --model gpt2 --shrink 8 --steps 2 --strategies ddp,zero2,fsdp --precision fp32 \
  --attention eager --cap 80GB-scaled
# One rank per GPU where the machine has several: NCCL, steered to its tree all-reduce.
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if ((gpus >= 2)); then
  stage "${gpus} ranks, one GPU each (NCCL, all_reduce=tree)" 90 \
    scripts/mpirun -np "${gpus}" build/cuda/bin/emu --device cuda --collectives all_reduce=tree --cap 80GB-scaled
fi

echo
echo "== summary ($(($(date +%s) - start)) s)"
printf '%s\n' "${summary[@]}"
exit "${status}"
