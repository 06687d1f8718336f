#!/usr/bin/env bash
# Runs emu's whole test suite, in four parts, stopping at the first that fails:
#   1. release  set up and build (scripts/setup.sh), then every unit, MPI and end-to-end test with ctest; MPI tests
#               run at 1, 2, 4 and 8 ranks, oversubscribed where the machine has fewer cores
#   2. asan     the same tests under AddressSanitizer + UndefinedBehaviorSanitizer (the asan preset, clang; the
#               same build holds the libFuzzer targets)
#   3. fuzz     scripts/fuzz.sh: a bounded libFuzzer run of every parser of user input
#   4. cuda     where the CUDA toolkit is installed: the -DEMU_CUDA=ON build (CUDA backend, NCCL link) must build
#               and link; its GPU tests run where a GPU is and report themselves skipped elsewhere
#
#   scripts/test.sh                   all four parts (what CI runs)
#   EMU_TEST_QUICK=1 scripts/test.sh  the release part only
#   scripts/test.sh -R cap_spec       extra arguments go to both ctest runs
#   EMU_PRESET=debug scripts/test.sh  another preset for part 1
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
preset=${EMU_PRESET:-release}
quick=${EMU_TEST_QUICK:-0}
cd "$root"

timings=()
current="set-up"
trap 'echo "emu test: FAILED in part $current" >&2' ERR
part() {
  echo "== emu test: $1 =="
  current=$1
  part_start=$SECONDS
}
part_done() {
  timings+=("$1 $((SECONDS - part_start)) s")
}

part "1/4 $preset build and tests"
scripts/setup.sh
ctest --preset "$preset" -j "$(nproc)" "$@"
part_done "$preset"

if [[ "$quick" != 1 ]]; then
  part "2/4 asan build and tests (AddressSanitizer + UndefinedBehaviorSanitizer)"
  EMU_PRESET=asan scripts/setup.sh
  ctest --preset asan -j "$(nproc)" "$@"
  part_done asan

  part "3/4 bounded fuzz runs"
  scripts/fuzz.sh
  part_done fuzz

  if [[ -x /usr/local/cuda/bin/nvcc ]] || command -v nvcc >/dev/null 2>&1; then
    part "4/4 cuda build (CUDA backend and NCCL must link; GPU tests skip without a GPU)"
    EMU_PRESET=cuda scripts/setup.sh
    ctest --preset cuda
    part_done cuda
  else
    echo "== emu test: 4/4 cuda: skipped, no CUDA toolkit on this machine =="
  fi
fi

summary=$(printf '%s, ' "${timings[@]}")
echo "emu test: passed (${summary%, })"
