#!/usr/bin/env bash
# Runs emu's whole test suite, in six parts, stopping at the first that fails:
#   1. release  set up and build (scripts/setup.sh), then every unit, MPI and end-to-end test with ctest; MPI tests
#               run at 1, 2, 4 and 8 ranks, oversubscribed where the machine has fewer cores; the layering check
#   2. hygiene  scripts/format.sh (every source follows .clang-format) and scripts/tidy.sh (clang-tidy on the files
#               changed by the last commit and the working tree: bugprone, performance, cognitive complexity ≤ 40)
#   3. mutate   scripts/mutate.sh --subset 3: three planted bugs of scripts/mutants.txt, a different three each day,
#               each of which the tests must catch (built in build/mutate, kept between runs; a few minutes)
#   4. cuda     where the CUDA toolkit is installed: the -DEMU_CUDA=ON build of emu and of the GPU tests (CUDA
#               backend, NCCL link) must build and link; the GPU tests run where a GPU is and report themselves
#               skipped elsewhere (the CPU tests, the same code as part 1's, are not built there again)
#   5. asan     the same tests as part 1 under AddressSanitizer + UndefinedBehaviorSanitizer (the asan preset,
#               clang; the same build holds the libFuzzer targets)
#   6. fuzz     scripts/fuzz.sh: a bounded libFuzzer run of every parser of user input
#
# The last line counts ctest's tests over every part (the mutation check's runs are not counted): total: N
# passed, N failed, N skipped.
#
#   scripts/test.sh                   all six parts (what CI runs)
#   EMU_TEST_QUICK=1 scripts/test.sh  the release part only
#   scripts/test.sh -R cap_spec       extra arguments go to the release and asan ctest runs
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
# ctest with a JUnit report, whose counts add up to the closing line: tests run, failed and skipped over all parts.
passed=0 failed=0 skipped=0
junit_count() {  # the testsuite's count attribute $1 in report $2 (0 when absent)
  local n
  n=$(grep -m1 -o "[[:space:]]$1=\"[0-9]*\"" "$2" | tr -dc 0-9) || true
  echo "${n:-0}"
}
run_ctest() {
  local preset=$1
  shift
  local report="$root/build/$preset/ctest-junit.xml"
  rm -f "$report"
  local rc=0
  ctest --preset "$preset" --output-junit "$report" "$@" || rc=$?
  if [[ -f "$report" ]]; then
    local tests fails skips disabled
    tests=$(junit_count tests "$report")
    fails=$(junit_count failures "$report")
    skips=$(junit_count skipped "$report")
    disabled=$(junit_count disabled "$report")
    passed=$((passed + tests - fails - skips - disabled))
    failed=$((failed + fails))
    skipped=$((skipped + skips + disabled))
  fi
  return "$rc"
}

part "1/6 $preset build and tests"
scripts/setup.sh
run_ctest "$preset" -j "$(nproc)" "$@"
part_done "$preset"

if [[ "$quick" != 1 ]]; then
  part "2/6 hygiene (format, clang-tidy on changed files)"
  scripts/format.sh
  scripts/tidy.sh
  part_done hygiene

  part "3/6 mutation check (rotating subset)"
  scripts/mutate.sh --subset 3
  part_done mutate

  if [[ -x /usr/local/cuda/bin/nvcc ]] || command -v nvcc >/dev/null 2>&1; then
    part "4/6 cuda build (CUDA backend and NCCL must link; GPU tests skip without a GPU)"
    EMU_PRESET=cuda scripts/setup.sh
    run_ctest cuda
    part_done cuda
  else
    echo "== emu test: 4/6 cuda: skipped, no CUDA toolkit on this machine =="
  fi

  part "5/6 asan build and tests (AddressSanitizer + UndefinedBehaviorSanitizer)"
  EMU_PRESET=asan scripts/setup.sh
  run_ctest asan -j "$(nproc)" "$@"
  part_done asan

  part "6/6 bounded fuzz runs"
  scripts/fuzz.sh
  part_done fuzz
fi

summary=$(printf '%s, ' "${timings[@]}")
echo "emu test: passed (${summary%, })"
# The closing line: ctest's counts over every part (fuzz targets are not tests and are not counted).
echo "total: $passed passed, $failed failed, $skipped skipped"
