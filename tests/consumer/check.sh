#!/usr/bin/env bash
# Installs the built weft into a scratch prefix, then configures, builds and runs
# tests/consumer against it: what a user of find_package(weft) does. The consumer is built
# with the build's own compiler and flags (a sanitizer build's consumer links the sanitizer
# runtimes too), and a failing step shows its output.
#   check.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 source=$2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
step() {  # step NAME COMMAND...: runs quietly, prints the output when it fails
  local name=$1; shift
  if ! "$@" > "$scratch/$name.log" 2>&1; then
    echo "install_and_find_package: $name failed:"; cat "$scratch/$name.log"; exit 1
  fi
}
cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
step install cmake --install "$build" --prefix "$scratch/prefix"
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
step configure cmake -S "$source/tests/consumer" -B "$scratch/build" "${generator[@]}" \
  -DCMAKE_PREFIX_PATH="$scratch/prefix" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$(cache CMAKE_CXX_COMPILER)" \
  -DCMAKE_CXX_FLAGS="$(cache CMAKE_CXX_FLAGS)" -DCMAKE_EXE_LINKER_FLAGS="$(cache CMAKE_EXE_LINKER_FLAGS)"
step build cmake --build "$scratch/build"
"$scratch/build/consumer"
