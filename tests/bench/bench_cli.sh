#!/usr/bin/env bash
# A benchmark's command line: every bench executable takes --json FILE (tools/gpu-check passes it
# to each of them, and a bench that rejected it made the whole bench step fail).
#
#   bench_cli.sh EXE [ARGS...]
#
# First `EXE --json FILE --help` must exit 0 and name --json in its usage: --json is parsed
# before --help stops the parser. Then, when ARGS are given (a configuration small enough for
# a test), `EXE ARGS --json FILE` must exit 0 and leave a JSON file that parses; exit 77, the
# benchmarks' "no CUDA GPU", is passed on so that CTest shows the entry as skipped.
set -uo pipefail
exe=$1
shift
name=$(basename "$exe")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

help=$("$exe" --json "$scratch/help.json" --help 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
  echo "$name --json FILE --help exited $rc:"; echo "$help"; exit 1
fi
if ! grep -q -- "--json" <<<"$help"; then
  echo "$name --help does not name --json:"; echo "$help"; exit 1
fi
echo "$name: --json FILE --help accepted"
[ $# -eq 0 ] && exit 0

"$exe" "$@" --json "$scratch/out.json" >"$scratch/out.txt" 2>&1
rc=$?
if [ $rc -eq 77 ]; then
  echo "skipped: $name $* needs what this machine lacks:"; cat "$scratch/out.txt"; exit 77
fi
if [ $rc -ne 0 ]; then
  echo "$name $* --json FILE exited $rc:"; cat "$scratch/out.txt"; exit 1
fi
if [ ! -s "$scratch/out.json" ]; then
  echo "$name $* --json FILE exited 0 but wrote no JSON"; exit 1
fi
if command -v python3 >/dev/null && ! python3 -m json.tool "$scratch/out.json" >/dev/null; then
  echo "$name $* --json FILE wrote JSON that does not parse:"; cat "$scratch/out.json"; exit 1
fi
echo "$name $* --json FILE: wrote $(wc -c <"$scratch/out.json") bytes of JSON"
