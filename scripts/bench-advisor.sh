#!/usr/bin/env bash
# The advisor's search time and the time of one full-scale plan it is made of, from a release
# build: each case run REPEAT times, the median of the seconds emu itself reports in its JSON (the plan's
# `seconds`, the search's `advice.seconds`; process start-up not counted), as a Markdown table for the README.
#
#   scripts/bench-advisor.sh                 # build/release/bin/emu, 3 repetitions
#   REPEAT=5 EMU=path/to/emu scripts/bench-advisor.sh
set -euo pipefail
cd "$(dirname "$0")/.."
emu=${EMU:-build/release/bin/emu}
repeat=${REPEAT:-3}
[[ -x $emu ]] || { echo "bench-advisor: $emu not built (cmake --build build/release --target emu)" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# plan CASE ARGS...: one full-scale plan of one strategy; prints its median seconds.
plan() {
  local name=$1; shift
  for ((i = 0; i < repeat; ++i)); do
    "$emu" "$@" --no-advise --json "$out/plan.json" > /dev/null
    jq '.seconds' "$out/plan.json"
  done | median | xargs printf '| plan: %s | 1 | %.3f | |\n' "$name"
}

# search CASE ARGS...: the advisor over every knob; prints configurations planned, skipped and the median seconds.
search() {
  local name=$1; shift
  local seconds=()
  for ((i = 0; i < repeat; ++i)); do
    "$emu" "$@" --advise --json "$out/advice.json" > /dev/null
    seconds+=("$(jq '.advice.seconds' "$out/advice.json")")
  done
  local planned skipped fits median_seconds
  planned=$(jq '.advice.searched' "$out/advice.json")
  skipped=$(jq '.advice.dominated' "$out/advice.json")
  fits=$(jq '.advice.fits' "$out/advice.json")
  median_seconds=$(printf '%s\n' "${seconds[@]}" | median)
  awk -v n="$name" -v p="$planned" -v f="$fits" -v k="$skipped" -v s="$median_seconds" 'BEGIN {
    printf "| advice: %s | %d planned (%d fit, %d skipped as dominated) | %.2f | %.1f ms |\n", n, p, f, k, s, 1000 * s / p }'
}

echo "emu advisor benchmark: $(date -u +%Y-%m-%d), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), median of $repeat"
echo
echo "| case | configurations | seconds | per plan |"
echo "|---|---:|---:|---:|"
plan "llama2-70b zero3, 32 ranks (fits)" --model llama2-70b --plan 32 --cap h100-80gb --strategies zero3
plan "llama2-70b zero3, 1,048,576 ranks (fits)" --model llama2-70b --plan 1048576 --cap h100-80gb --strategies zero3
plan "llama2-70b ddp, ddp-zero, zero1, zero2, zero3, fsdp, fsdp2, 1,048,576 ranks, no cap (every step whole)" --model llama2-70b --plan 1048576 \
  --strategies ddp,ddp-zero,zero1,zero2,zero3,fsdp,fsdp2
plan "llama2-70b pp, 16 ranks (16 roles, fits)" --model llama2-70b --plan 16 --cap h100-80gb --strategies pp
search "llama2-13b on 4 x a100-40gb, every knob" --model llama2-13b --plan 4 --cap a100-40gb
search "llama2-70b on 8 x a100-40gb, every knob and --advise-seq-len" --model llama2-70b --plan 8 --cap a100-40gb \
  --strategies fsdp --advise-seq-len
search "llama2-70b on 32 x h100-80gb, up to 256 GPUs" --model llama2-70b --plan 32 --cap h100-80gb --strategies ddp \
  --advise-max-gpus 256
