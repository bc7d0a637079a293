#!/usr/bin/env bash
# Installs the built weft into a scratch prefix, then configures, builds and runs
# tests/consumer against it: what a user of find_package(weft) does.
#   check.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 source=$2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/prefix" > /dev/null
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
cmake -S "$source/tests/consumer" -B "$scratch/build" "${generator[@]}" -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$scratch/build" > /dev/null
"$scratch/build/consumer"
