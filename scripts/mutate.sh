#!/usr/bin/env bash
# The mutation check: plants each bug of scripts/mutants.txt, one at a time, and runs the tests that should catch
# it. A mutant no test catches SURVIVED: the tests have a hole there.
#
# Mutants are planted in a scratch copy of the source tree (build/mutate-src, refreshed from the working tree on
# every run), never in the working tree itself, and built in their own folder (build/mutate, Release, no
# benchmarks), so the normal builds are untouched. Only the test executables a mutant's ctest regex names are
# rebuilt, incrementally; each mutant's file is restored from a saved copy after its tests, and on exit whatever
# happens (a trap). Before any mutant, the same tests run on the unmutated copy and must pass.
#
#   scripts/mutate.sh               every mutant of the catalogue
#   scripts/mutate.sh --subset 3    3 mutants, a different 3 each day (chosen from the day of the year); CI runs it
#   scripts/mutate.sh --only ddp-sum,bf16-truncate
#   scripts/mutate.sh --list        the catalogue
#   scripts/mutate.sh --check       only that every entry still matches its file exactly once
#
# Prints a table: mutant, file, what it plants, the tests that caught it (or SURVIVED). Exit 0 when every mutant
# was caught, 1 when one survived, 2 when the catalogue or the build is broken. A mutant whose tests hang past
# EMU_MUTATE_TEST_SECONDS (240) is caught: the suite would fail it by its watchdog or ctest's timeout. The baseline
# (the chosen mutants' tests together, unmutated) has that limit once per chosen mutant.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
catalogue=$root/scripts/mutants.txt
src=$root/build/mutate-src
build=$root/build/mutate
jobs=${EMU_MUTATE_JOBS:-2}
limit=${EMU_MUTATE_TEST_SECONDS:-240}  # one mutant's tests; a mutant that hangs them counts as caught
cd "$root"

fail() {
  echo "emu mutate: $*" >&2
  exit 2
}

# --- the catalogue ---------------------------------------------------------------------------------------------
ids=() files=() originals=() replacements=() regexes=() descriptions=()
load_catalogue() {
  local line number=0 sep=$'\x1f'
  while IFS= read -r line || [[ -n "$line" ]]; do
    number=$((number + 1))
    [[ -z "${line//[[:space:]]/}" || "$line" =~ ^[[:space:]]*# ]] && continue
    local fields=()
    IFS=$sep read -r -a fields <<<"${line// | /$sep}"
    ((${#fields[@]} == 6)) || fail "$catalogue:$number: expected 6 fields separated by ' | ', found ${#fields[@]}"
    ids+=("${fields[0]}")
    files+=("${fields[1]}")
    originals+=("${fields[2]}")
    replacements+=("${fields[3]}")
    regexes+=("${fields[4]}")
    descriptions+=("${fields[5]}")
  done <"$catalogue"
  ((${#ids[@]} > 0)) || fail "$catalogue holds no mutants"
  local dupes
  dupes=$(printf '%s\n' "${ids[@]}" | sort | uniq -d)
  [[ -z "$dupes" ]] || fail "mutant ids used twice: $dupes"
}

# How often `text` occurs in `file` (plain text, not a pattern).
occurrences() {
  python3 -c 'import sys; print(open(sys.argv[1], encoding="utf-8").read().count(sys.argv[2]))' "$1" "$2"
}

# Every entry's original text exactly once in its file of the working tree: the catalogue cannot rot silently.
check_catalogue() {
  local i n bad=0
  for i in "${!ids[@]}"; do
    if [[ ! -f "$root/${files[$i]}" ]]; then
      echo "emu mutate: ${ids[$i]}: no file ${files[$i]}" >&2
      bad=1
      continue
    fi
    n=$(occurrences "$root/${files[$i]}" "${originals[$i]}")
    if [[ "$n" != 1 ]]; then
      echo "emu mutate: ${ids[$i]}: the original text occurs $n times in ${files[$i]} (must be once): ${originals[$i]}" >&2
      bad=1
    fi
  done
  ((bad == 0)) || fail "the catalogue no longer matches the source; update scripts/mutants.txt"
}

# --- the options -----------------------------------------------------------------------------------------------
mode=all subset=0 only=""
while (($# > 0)); do
  case "$1" in
    --list) mode=list ;;
    --check) mode=check ;;
    --subset) subset=${2:?--subset needs a count}; shift ;;
    --only) only=${2:?--only needs mutant ids}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) fail "unknown argument '$1' (see --help)" ;;
  esac
  shift
done

load_catalogue
if [[ $mode == list ]]; then
  for i in "${!ids[@]}"; do printf '%-24s %-44s %s\n' "${ids[$i]}" "${files[$i]}" "${descriptions[$i]}"; done
  echo "${#ids[@]} mutants"
  exit 0
fi
check_catalogue
if [[ $mode == check ]]; then
  echo "emu mutate: all ${#ids[@]} catalogue entries match their files"
  exit 0
fi

# The mutants to run: all, the named ones, or `subset` consecutive ones starting at a place set by the day of
# the year (EMU_MUTATE_DAY overrides it), so successive days walk the whole catalogue.
chosen=()
if [[ -n "$only" ]]; then
  IFS=, read -r -a wanted <<<"$only"
  for id in "${wanted[@]}"; do
    found=""
    for i in "${!ids[@]}"; do [[ "${ids[$i]}" == "$id" ]] && found=$i; done
    [[ -n "$found" ]] || fail "no mutant '$id' (see --list)"
    chosen+=("$found")
  done
elif ((subset > 0)); then
  count=${#ids[@]}
  ((subset > count)) && subset=$count
  day=${EMU_MUTATE_DAY:-$((10#$(date +%j)))}
  start=$(((day * subset) % count))
  for ((j = 0; j < subset; ++j)); do chosen+=($(((start + j) % count))); done
else
  chosen=("${!ids[@]}")
fi

# --- the scratch tree and its build ----------------------------------------------------------------------------
# Copies every file git knows of (tracked, or untracked and not ignored) whose content differs; a copied file gets
# a fresh time stamp, so ninja rebuilds what it feeds.
sync_tree() {
  local f
  while IFS= read -r -d '' f; do
    [[ -f "$root/$f" ]] || continue
    if ! cmp -s "$root/$f" "$src/$f"; then
      mkdir -p "$src/$(dirname "$f")"
      cp "$root/$f" "$src/$f"
    fi
  done < <(git -C "$root" ls-files -co --exclude-standard -z)
}

saved=""  # the mutated file's original, while a mutant is planted
planted=""
restore() {
  if [[ -n "$planted" ]]; then
    cp "$saved" "$src/$planted"  # a fresh time stamp: the original is rebuilt next time
    planted=""
  fi
}
scratch=$(mktemp -d)
trap 'restore; rm -rf "$scratch"' EXIT
trap 'exit 130' INT TERM
saved=$scratch/original

echo "== emu mutate: ${#chosen[@]} of ${#ids[@]} mutants, built in build/mutate =="
start_time=$SECONDS
mkdir -p "$src"
sync_tree
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMU_BENCHMARKS=OFF >"$scratch/configure.log" ||
    { cat "$scratch/configure.log" >&2; fail "configure failed"; }
fi
cmake --build "$build" --target help >"$scratch/targets" 2>/dev/null || true

# The tests regex $1 selects, one name a line.
tests_for() {
  local listed
  listed=$(ctest --test-dir "$build" -N -R "$1")
  sed -n 's/^ *Test *#[0-9]*: *//p' <<<"$listed"
}

# One regex for several regexes' tests, by name: CMake's regular expressions take at most nine groups, too few to
# join the catalogue's regexes with |.
union_of() {
  local names
  names=$(for regex in "$@"; do tests_for "$regex"; done | sort -u | sed 's/\./\\./g' | paste -sd'|')
  echo "^(${names})\$"
}

# The build targets behind the tests a regex selects: the test name less its .npN suffix, where that is a target
# (the end-to-end tests depend on the emu executable themselves); the coll_teach_* tests run the coll-teach tool.
targets_for() {
  local name target
  local -A seen=()
  while read -r name; do
    target=${name%.np[0-9]*}
    [[ $name == coll_teach_* && $name != coll_teach_test* ]] && target=coll-teach
    [[ -n "${seen[$target]:-}" ]] && continue
    seen[$target]=1
    if grep -q "^$target:" "$scratch/targets"; then echo "$target"; fi
  done < <(tests_for "$1")
}

build_for() {  # builds what regex $1's tests need; the log in $2
  local targets
  mapfile -t targets < <(targets_for "$1")
  ((${#targets[@]} > 0)) || return 0
  nice cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$2" 2>&1
}

# Whether regex $1 selects at least one test (captured, not piped into grep -q: pipefail would see ctest's SIGPIPE).
any_tests() {
  local listed
  listed=$(ctest --test-dir "$build" -N -R "$1")
  [[ "$listed" =~ Total\ Tests:\ [1-9] ]]
}

# Runs regex $1's tests within $2 seconds (default: one mutant's limit); prints the names of those that failed.
# Returns 1 when no test matches.
failing_tests() {
  local log=$scratch/ctest.log seconds=${2:-$limit}
  any_tests "$1" || return 1
  local rc=0
  timeout -k 10 "$seconds" nice ctest --test-dir "$build" -R "$1" -j "$jobs" >"$log" 2>&1 || rc=$?
  if ((rc == 124 || rc == 137)); then  # a hang: ctest and its MPI jobs killed (timeout signals its process group)
    echo "hung: killed after $seconds s"
    return 0
  fi
  sed -n '/The following tests FAILED:/,$ s/^[[:space:]]*[0-9]* - \([^ ]*\) .*/\1/p' "$log"
}

# The baseline: every chosen mutant's tests pass on the unmutated tree.
chosen_regexes=()
for i in "${chosen[@]}"; do chosen_regexes+=("${regexes[$i]}"); done
union=$(union_of "${chosen_regexes[@]}")
build_for "$union" "$scratch/build.log" || { tail -30 "$scratch/build.log" >&2; fail "the unmutated tree does not build"; }
for i in "${chosen[@]}"; do
  any_tests "${regexes[$i]}" ||
    fail "${ids[$i]}: no test matches its regex ${regexes[$i]}"
done
# The union holds every chosen mutant's tests, so it has each one's limit (emu_run_test alone takes ~205 s on an
# idle 2-core machine, near the 240 s one mutant's tests have).
baseline=$(failing_tests "$union" $((limit * ${#chosen[@]}))) || fail "no test matches the chosen mutants' regexes"
[[ -z "$baseline" ]] || fail "tests fail before any mutant is planted: $(echo "$baseline" | paste -sd' ')"
echo "baseline: the chosen mutants' tests pass unmutated ($((SECONDS - start_time)) s)"

# --- the mutants -----------------------------------------------------------------------------------------------
rows=() survived=0 broken=0
for i in "${chosen[@]}"; do
  id=${ids[$i]} file=${files[$i]}
  t0=$SECONDS
  cp "$src/$file" "$saved"
  python3 - "$src/$file" "${originals[$i]}" "${replacements[$i]}" <<'EOF'
import sys
path, original, replacement = sys.argv[1:4]
text = open(path, encoding="utf-8").read()
assert text.count(original) == 1, f"{path}: the original text is not there exactly once"
open(path, "w", encoding="utf-8").write(text.replace(original, replacement))
EOF
  planted=$file
  if ! build_for "${regexes[$i]}" "$scratch/build.log"; then
    verdict="DOES NOT COMPILE"
    broken=1
    tail -20 "$scratch/build.log" >&2
  else
    caught=$(failing_tests "${regexes[$i]}" | paste -sd' ')
    if [[ -n "$caught" ]]; then
      verdict=$caught
    else
      verdict=SURVIVED
      survived=$((survived + 1))
    fi
  fi
  restore
  printf '%-24s %-8s %s\n' "$id" "$((SECONDS - t0)) s" "$verdict"
  rows+=("$(printf '%-24s | %-42s | %-70s | %s' "$id" "$file" "${descriptions[$i]}" "$verdict")")
done

echo
printf '%-24s | %-42s | %-70s | %s\n' "mutant" "file" "what it plants" "caught by"
for row in "${rows[@]}"; do echo "$row"; done
echo
caught_count=$((${#chosen[@]} - survived))
echo "emu mutate: $caught_count of ${#chosen[@]} mutants caught, $survived survived ($((SECONDS - start_time)) s)"
((broken == 0)) || fail "a mutant does not compile: fix its entry in scripts/mutants.txt"
((survived == 0)) || exit 1
