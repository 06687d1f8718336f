#!/usr/bin/env bash
# Checks that every #include in emu's sources runs downward through the layers (docs/architecture.md):
#
#   app  →  strategies  →  workloads | collectives  →  emu
#
# A folder may include itself and the layers below it; workloads and collectives never include each other. tests/
# may include anything. Prints each include that runs upward or sideways as file:line and exits 1; exits 0 when
# there is none. Run by ctest (test `layering`) and on its own: scripts/check-layers.sh [ROOT]
set -euo pipefail
root=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
cd "$root"

# layer → the top-level folders it may include
declare -A may_include=(
  [emu]="emu"
  [collectives]="collectives emu"
  [workloads]="workloads emu"
  [strategies]="strategies workloads collectives emu"
  [app]="app strategies workloads collectives emu"
)
layers=(emu collectives workloads strategies app)

violations=0
for layer in "${layers[@]}"; do
  if [[ ! -d $layer ]]; then
    echo "check-layers: the layer folder $layer/ is missing (docs/architecture.md lists the layers)" >&2
    violations=$((violations + 1))
    continue
  fi
  # file:line:#include "top/..."  for every quoted include of a path with a folder
  while IFS= read -r hit; do
    location=${hit%%:#include*}
    target=$(sed -E 's/.*#include[[:space:]]*"([^/"]+)\/.*/\1/' <<<"$hit")
    [[ -n ${may_include[$target]+x} ]] || continue  # not one of emu's layers (e.g. a path relative to the file)
    if [[ " ${may_include[$layer]} " != *" $target "* ]]; then
      echo "$location: $layer/ includes $target/ (allowed: ${may_include[$layer]// /, })"
      violations=$((violations + 1))
    fi
  done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^/"]+/' "$layer" \
             --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' | sed -E 's/:[[:space:]]*#[[:space:]]*include/:#include/' || true)
done

if ((violations > 0)); then
  echo "check-layers: $violations include(s) against the layering app → strategies → workloads | collectives → emu" >&2
  exit 1
fi
echo "check-layers: every include runs downward (${layers[*]})"
