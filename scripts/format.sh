#!/usr/bin/env bash
# clang-format over every C++ and CUDA source git tracks, with the repository's .clang-format.
#
#   scripts/format.sh           check: lists the files that deviate and exits 1 (part of scripts/test.sh)
#   scripts/format.sh --fix     rewrite them in place
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
format=$(command -v clang-format || command -v clang-format-14 || true)
[[ -n $format ]] || { echo "format: clang-format is not installed (apt-get install clang-format)" >&2; exit 2; }
mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
if [[ ${1:-} == --fix ]]; then
  "$format" -i "${files[@]}"
  echo "format: formatted ${#files[@]} files"
  exit 0
fi
deviating=()
for file in "${files[@]}"; do
  "$format" --dry-run --Werror "$file" >/dev/null 2>&1 || deviating+=("$file")
done
if ((${#deviating[@]} > 0)); then
  printf 'format: %s deviates from .clang-format\n' "${deviating[@]}" >&2
  echo "format: ${#deviating[@]} of ${#files[@]} files deviate; scripts/format.sh --fix rewrites them" >&2
  exit 1
fi
echo "format: all ${#files[@]} files follow .clang-format"
