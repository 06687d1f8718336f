#!/usr/bin/env bash
# Runs every command of the course (docs/course/*.md) and checks the lines marked "# expect: REGEX" beneath a
# command against what it printed, so the lessons cannot go stale. A command is a line of a ```sh block; `mpirun`
# becomes scripts/mpirun (oversubscription and root flags) and build/release/bin/ the build's own bin/.
#
#   tests/e2e/course.sh ROOT BIN [LESSON.md ...]
set -uo pipefail
root=$1
bin=$2
shift 2
lessons=("$@")
((${#lessons[@]})) || lessons=("$root"/docs/course/[0-9]*.md)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 2

failures=0 commands=0
run_command() {
  local lesson=$1 line=$2 command=$3
  command=${command//build\/release\/bin\//$bin/}
  [[ $command == mpirun\ * ]] && command="$root/scripts/mpirun ${command#mpirun }"
  commands=$((commands + 1))
  if ! timeout 300 bash -c "$command" </dev/null >"$work/out" 2>&1; then
    echo "FAIL $lesson:$line: exit $? from: $command"
    tail -20 "$work/out"
    failures=$((failures + 1))
    return 1
  fi
  echo "ok   $lesson:$line: ${command#"$root"/}"
}

for lesson in "${lessons[@]}"; do
  name=$(basename "$lesson")
  in_block=0 number=0 last_ok=0 last_line=0
  while IFS= read -r text || [[ -n "$text" ]]; do
    number=$((number + 1))
    if [[ $text == '```sh' ]]; then in_block=1; continue; fi
    if [[ $text == '```'* ]]; then in_block=0; continue; fi
    ((in_block)) || continue
    if [[ $text =~ ^#\ expect:\ (.*)$ ]]; then
      ((last_line)) || { echo "FAIL $name:$number: an expectation before any command"; failures=$((failures + 1)); continue; }
      ((last_ok)) || continue
      if ! grep -Eq -- "${BASH_REMATCH[1]}" "$work/out"; then
        echo "FAIL $name:$number: the output of line $last_line does not match: ${BASH_REMATCH[1]}"
        tail -20 "$work/out"
        failures=$((failures + 1))
      fi
      continue
    fi
    [[ -z ${text// /} || $text == '#'* ]] && continue
    last_line=$number
    if run_command "$name" "$number" "$text"; then last_ok=1; else last_ok=0; fi
  done <"$lesson"
done
echo "course: $commands commands, $failures failures"
((commands > 0 && failures == 0))
