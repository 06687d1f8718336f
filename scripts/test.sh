#!/usr/bin/env bash
# Runs emu's whole test suite: sets up and builds (scripts/setup.sh), then every unit and MPI test with ctest.
# MPI tests run at 1, 2, 4 and 8 ranks, oversubscribed where the machine has fewer cores.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
preset=${EMU_PRESET:-release}
"$root/scripts/setup.sh"
cd "$root"
ctest --preset "$preset" -j "$(nproc)" "$@"
