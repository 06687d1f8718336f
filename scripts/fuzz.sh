#!/usr/bin/env bash
# Bounded fuzz runs of every parser of user input: builds the asan preset (clang; libFuzzer with AddressSanitizer
# and UndefinedBehaviorSanitizer, tests/fuzz) and runs each fuzz target for a fixed number of inputs, starting
# from its seed corpus. Deterministic (-seed=1). Exits 0 when no target found anything, 1 after naming every
# target that did and where its input was saved, 3 if the build failed.
#
#   scripts/fuzz.sh                          every target, EMU_FUZZ_RUNS inputs each
#   scripts/fuzz.sh fuzz_safetensors ...     only the targets named
#   EMU_FUZZ_RUNS=2000000 EMU_FUZZ_TIME=900 scripts/fuzz.sh     a long local run
#
#   EMU_FUZZ_RUNS   inputs per target (default: the target's row in the table below)
#   EMU_FUZZ_TIME   seconds per target at most (default 60): a run that reaches it stops early and says so;
#                   a single input running longer than 25 s is itself a finding (a hang)
#
# Each target runs on a copy of tests/fuzz/corpus/<target>/ in build/asan/fuzz-runs/<target>/corpus (new inputs
# libFuzzer finds go there, never into the repository). A finding's input is saved beside it, e.g.
# build/asan/fuzz-runs/fuzz_safetensors/crash-<sha1>; reproduce it with build/asan/bin/fuzz_safetensors <file>, and
# once fixed, copy it into the seed corpus so it stays fixed.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
time_cap=${EMU_FUZZ_TIME:-60}

# Per target: -max_len, the largest input worth trying (a little above the largest seed), and the default number
# of runs, sized so that all targets together take a minute or two on a 2-core CI machine: fewer for the command
# line, which builds the whole CLI and resolves the model for each input, and for the parsers that read a file,
# whose fuzz targets write each input to a scratch file first. A new parser's target gets a row here (and in
# tests/fuzz/CMakeLists.txt).
declare -A max_len=(
  [fuzz_cap_spec]=64
  [fuzz_command_line]=512
  [fuzz_deepspeed_config]=4096
  [fuzz_hf_config]=2048
  [fuzz_safetensors]=4096
  [fuzz_token_file]=1024
)
declare -A default_runs=(
  [fuzz_cap_spec]=200000
  [fuzz_command_line]=20000
  [fuzz_deepspeed_config]=100000
  [fuzz_hf_config]=50000
  [fuzz_safetensors]=100000
  [fuzz_token_file]=50000
)
# Targets whose input is JSON also get the JSON syntax dictionary.
declare -A json_input=([fuzz_deepspeed_config]=1 [fuzz_hf_config]=1 [fuzz_safetensors]=1)

targets=("$@")
((${#targets[@]} > 0)) || targets=(fuzz_cap_spec fuzz_command_line fuzz_deepspeed_config fuzz_hf_config fuzz_safetensors
  fuzz_token_file)
for target in "${targets[@]}"; do
  [[ -n "${max_len[$target]:-}" ]] || { echo "emu fuzz: unknown target '$target'; known: ${!max_len[*]}" >&2; exit 2; }
done

EMU_PRESET=asan "$root/scripts/setup.sh" >/dev/null || exit 3  # the asan build holds the fuzzers

# Leaks are findings too (the fuzz targets do not start MPI, so nothing of OpenMPI's is reported); UBSan stops at
# the first report so that libFuzzer saves the input.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

fuzz_dir="$root/tests/fuzz"
runs_dir="$root/build/asan/fuzz-runs"
failed=()
for target in "${targets[@]}"; do
  work="$runs_dir/$target"
  rm -rf "$work"
  mkdir -p "$work/corpus"
  cp "$fuzz_dir/corpus/$target/"* "$work/corpus/"
  # libFuzzer takes one dictionary: the target's own plus, for JSON input, the JSON syntax.
  dict_option=()
  dicts=()
  [[ -z "${json_input[$target]:-}" ]] || dicts+=("$fuzz_dir/dict/json.dict")
  [[ ! -f "$fuzz_dir/dict/$target.dict" ]] || dicts+=("$fuzz_dir/dict/$target.dict")
  if ((${#dicts[@]} > 0)); then
    cat "${dicts[@]}" >"$work/dict"
    dict_option=(-dict="$work/dict")
  fi
  seeds=$(find "$work/corpus" -type f | wc -l)
  runs=${EMU_FUZZ_RUNS:-${default_runs[$target]}}

  start=$SECONDS
  status=0
  # The outer timeout only guards against libFuzzer itself not stopping; -max_total_time is the real cap. Input
  # comes from /dev/null: a fuzzed command line may name /dev/stdin as a config file.
  timeout --kill-after=10 $((time_cap + 120)) "$root/build/asan/bin/$target" \
    -seed=1 -runs="$runs" -max_total_time="$time_cap" -max_len="${max_len[$target]}" -timeout=25 \
    -rss_limit_mb=2048 "${dict_option[@]}" -artifact_prefix="$work/" -print_final_stats=1 \
    "$work/corpus" </dev/null >"$work/fuzz.log" 2>&1 || status=$?
  elapsed=$((SECONDS - start))

  done_line=$(grep -E '^Done [0-9]+ runs' "$work/fuzz.log" | tail -1 || true)
  corpus_size=$(find "$work/corpus" -type f | wc -l)
  artifacts=$(find "$work" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
    -o -name 'oom-*' -o -name 'slow-unit-*' \) | sort)
  if ((status == 0)) && [[ -z "$artifacts" ]]; then
    done_runs=$(sed -E 's/^Done ([0-9]+) runs.*/\1/' <<<"$done_line")
    note=""
    [[ -z "$done_runs" || "$done_runs" -ge "$runs" ]] || note=" (stopped at the ${time_cap} s cap before $runs runs)"
    echo "emu fuzz: $target ok: ${done_line:-no summary} ${elapsed} s, corpus $seeds -> $corpus_size inputs$note"
    continue
  fi

  failed+=("$target")
  echo "emu fuzz: $target FAILED (exit status $status after ${elapsed} s); libFuzzer's log: $work/fuzz.log" >&2
  # The report's key lines: what went wrong, and the stack frames in emu's own sources.
  grep -E "ERROR:|runtime error:|^emu fuzz:|emu: fatal:|^SUMMARY:|#[0-9]+ .* $root/[a-z]" "$work/fuzz.log" \
    | grep -v "$root/tests/fuzz/fuzz_support.h" | head -25 >&2 || true
  if [[ -n "$artifacts" ]]; then
    while read -r artifact; do
      echo "emu fuzz: $target: input saved as $artifact; reproduce: build/asan/bin/$target $artifact" >&2
    done <<<"$artifacts"
  else
    echo "emu fuzz: $target: no input was saved (a process that ends itself, e.g. a failed EMU_CHECK, is not" \
      "caught by libFuzzer); the last lines of the log:" >&2
    tail -20 "$work/fuzz.log" >&2
  fi
done

if ((${#failed[@]} > 0)); then
  echo "emu fuzz: findings in ${failed[*]}" >&2
  exit 1
fi
echo "emu fuzz: ${#targets[@]} targets, no findings"
