#!/usr/bin/env bash
# Sets emu up on Debian 12: installs the Debian packages that are missing (and only those), then configures and
# builds the release preset into build/release. Safe to run again; it only does what is left to do.
#
#   scripts/setup.sh            packages + release build
#   EMU_PRESET=asan scripts/setup.sh    another preset (release, debug, asan, fuzz, cuda)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
preset=${EMU_PRESET:-release}

packages=(
  build-essential cmake ninja-build pkg-config
  ccache  # a fresh clone's or the mutation check's rebuild of unchanged files comes from its cache (CMakeLists.txt)
  openmpi-bin libopenmpi-dev libopenblas-dev libeigen3-dev libhwloc-dev libgtest-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev
  clang libclang-rt-14-dev clang-format clang-tidy
  python3  # scripts/mutate.sh plants mutants with it (part of scripts/test.sh)
  chromium-headless-shell  # the coll_teach_pictures test renders coll-teach's HTML page in it
)

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$package")
done

if ((${#missing[@]} > 0)); then
  echo "emu setup: installing missing Debian packages: ${missing[*]}"
  if [[ $(id -u) -eq 0 ]]; then
    sudo=()
  elif command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "emu setup: error: these packages are missing and there is no sudo to install them:" >&2
    echo "  apt-get install -y ${missing[*]}" >&2
    exit 2
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

cd "$root"
mkdir -p build
log="build/configure-$preset.log"
cmake --preset "$preset" >"$log" 2>&1 || { cat "$log" >&2; exit 3; }
sed -n '/configuration summary/,$p' "$log" | grep -F -- '--   '
cmake --build --preset "$preset" -j "$(nproc)"
echo "emu setup: built build/$preset"
