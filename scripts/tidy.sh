#!/usr/bin/env bash
# clang-tidy over emu's changed C++ files, with the checks in .clang-tidy (bugprone, performance, cognitive
# complexity ≤ 40), as errors. Uses build/release/compile_commands.json (scripts/setup.sh builds it).
#
#   scripts/tidy.sh              the .cpp files changed against EMU_TIDY_BASE (default HEAD~1), committed or not,
#                                plus the .cpp beside each changed header
#   scripts/tidy.sh --all        every .cpp of the product and its tests (slow: about 20 minutes on 2 cores)
#   scripts/tidy.sh FILE...      those files
#
# Exits 1 on any finding, 0 when clean (or when nothing changed).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
database=build/${EMU_PRESET:-release}
if [[ ! -f $database/compile_commands.json ]]; then
  echo "tidy: $database/compile_commands.json is missing: run scripts/setup.sh first" >&2
  exit 2
fi

# The sources clang-tidy can check: those in the compile database (fuzz targets and CUDA sources are not there).
mapfile -t compiled < <(sed -nE 's|^[[:space:]]*"file": "'"$root"'/(.*)",?$|\1|p' "$database/compile_commands.json" | sort -u)
in_database() { printf '%s\n' "${compiled[@]}" | grep -qxF -- "$1"; }

files=()
if [[ ${1:-} == --all ]]; then
  files=("${compiled[@]}")
elif (($# > 0)); then
  files=("$@")
else
  base=${EMU_TIDY_BASE:-HEAD~1}
  git rev-parse -q --verify "$base^{commit}" >/dev/null || base=$(git rev-list --max-parents=0 HEAD | tail -n 1)
  while IFS= read -r changed; do
    case $changed in
      *.cpp) candidate=$changed ;;
      *.h) candidate=${changed%.h}.cpp ;;
      *) continue ;;
    esac
    [[ -f $candidate ]] && in_database "$candidate" && files+=("$candidate")
  done < <({ git diff --name-only "$base"; git ls-files --others --exclude-standard; } | sort -u)
fi

if ((${#files[@]} == 0)); then
  echo "tidy: no changed C++ file to check"
  exit 0
fi
echo "tidy: clang-tidy on ${#files[@]} file(s): ${files[*]}"
tidy=$(command -v clang-tidy || command -v clang-tidy-14 || true)
[[ -n $tidy ]] || { echo "tidy: clang-tidy is not installed (apt-get install clang-tidy)" >&2; exit 2; }
failed=0
for file in "${files[@]}"; do
  "$tidy" -p "$database" --quiet "$file" 2>/dev/null || failed=$((failed + 1))
done
if ((failed > 0)); then
  echo "tidy: findings in $failed of ${#files[@]} file(s)" >&2
  exit 1
fi
echo "tidy: clean"
