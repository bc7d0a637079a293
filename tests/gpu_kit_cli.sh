#!/usr/bin/env bash
# tools/gpu-kit's unpacking, without a GPU or a CUDA build: a kit made by hand from a scratch
# tree (a CTest file and two small programs, one of which loads a library of its own) is
# unpacked as the GPU machine would: the tree checked against the kit's checksums, the build put
# where its paths point, the kit's libraries found, and every refusal naming what is wrong.
#
#   gpu_kit_cli.sh SOURCE_DIR
set -uo pipefail
source_dir=$1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failures=0
expect() {  # what, command's expected exit status, text its output must hold, command...
  local what=$1 status=$2 text=$3 out rc
  shift 3
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$status" ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL: $what (exit $rc, expected $status and '$text')"; echo "$out" | sed 's/^/  | /'
    failures=$((failures + 1))
  else
    echo "ok: $what"
  fi
}
for tool in zstd cc ldd sha256sum; do
  command -v "$tool" >/dev/null || { echo "skipped: $tool was not found"; exit 77; }
done

# The tree the kit was "built" from: gpu-kit itself and a source file.
tree="$scratch/tree"
mkdir -p "$tree/tools" "$tree/core"
cp "$source_dir/tools/gpu-kit" "$tree/tools/"
echo 'int answer() { return 42; }' >"$tree/core/answer.c"
echo '# prose, not checked' >"$tree/README.md"
export WEFT_KIT_HOME="$scratch/home"
build="$WEFT_KIT_HOME/build"

# A build: a library, a program that loads it, a program that loads nothing of ours, a CTest file.
staged="$scratch/staged"
mkdir -p "$staged/apps" "$scratch/kitlib"
cc -shared -fPIC -o "$scratch/kitlib/libanswer.so" "$tree/core/answer.c"
echo 'int answer(void); int main(void) { return answer() == 42 ? 0 : 1; }' >"$scratch/main.c"
cc -o "$staged/apps/needs-answer" "$scratch/main.c" -L"$scratch/kitlib" -lanswer
cc -o "$staged/apps/plain" -x c - <<<'int main(void) { return 0; }'
echo "add_test(plain \"$build/apps/plain\")" >"$staged/CTestTestfile.cmake"

kit="$scratch/kit"
make_kit() {  # the kit of the tree as it is now
  rm -rf "$kit" && mkdir -p "$kit/lib" "$kit/zstd/lib" "$kit/data"
  tar -cf - -C "$staged" . | zstd -q --long=31 -o "$kit/build.tar.zst"
  cp "$scratch/kitlib/libanswer.so" "$kit/lib/"
  (cd "$tree" && find . -type f ! -name '*.md' | sed 's|^\./||' | sort | tr '\n' '\0' | xargs -0 sha256sum) \
    >"$kit/sources.sha256"
  printf '%s\n' "KIT_ID=$1" KIT_COMMIT=abc1234 KIT_ARCH=90-real KIT_CREATED=2026-11-26T00:00:00Z \
    "KIT_TESTS='^plain'" KIT_NVCC=13.0 KIT_CUDNN=9.13.0 KIT_NCCL=2.28.3 >"$kit/kit.env"
}
make_kit first
expect "verify: the tree is the kit's" 0 "the working tree is the kit's" "$tree/tools/gpu-kit" verify --kit "$kit"

expect "unpack: the tree checked, the build in place, the libraries found" 0 "unpacked into $build (" \
  "$tree/tools/gpu-kit" unpack --kit "$kit"
[ "$(readlink "$WEFT_KIT_HOME/src")" = "$tree" ] && echo "ok: src links to the tree" ||
  { echo "FAIL: $WEFT_KIT_HOME/src does not link to $tree"; failures=$((failures + 1)); }
expect "the environment it writes runs the program that needs the kit's library" 0 "" \
  bash -c "source '$WEFT_KIT_HOME/env.sh' && '$build/apps/needs-answer' && echo \"\$WEFT_KIT_DATA\" | grep -qx '$kit/data'"
expect "ctest runs the kit's entries from the unpacked build" 0 "100% tests passed" \
  ctest --test-dir "$build"

# A second unpack of the same kit keeps what is there (gpu-check's logs); another kit replaces the
# build but not those logs.
mkdir -p "$build/gpu-check-logs" && touch "$build/gpu-check-logs/results.json" "$build/stale-file"
expect "the same kit again: nothing unpacked anew" 0 "unpacked into" "$tree/tools/gpu-kit" unpack --kit "$kit"
[ -f "$build/stale-file" ] && echo "ok: the same kit keeps the build" ||
  { echo "FAIL: the same kit unpacked again"; failures=$((failures + 1)); }
make_kit second
expect "another kit replaces the build" 0 "kit second" "$tree/tools/gpu-kit" unpack --kit "$kit"
[ ! -f "$build/stale-file" ] && [ -f "$build/gpu-check-logs/results.json" ] && echo "ok: ...and keeps the logs" ||
  { echo "FAIL: another kit's unpack left old files or lost the logs"; failures=$((failures + 1)); }

# Refusals, each naming what is wrong.
echo 'changed' >>"$tree/README.md"
expect "a Markdown change does not stale the kit" 0 "unpacked into" "$tree/tools/gpu-kit" unpack --kit "$kit"
echo 'int question() { return 6 * 9; }' >>"$tree/core/answer.c"
expect "a changed source is refused, named" 1 "core/answer.c: FAILED" "$tree/tools/gpu-kit" unpack --kit "$kit"
expect "verify names it too" 1 "core/answer.c: FAILED" "$tree/tools/gpu-kit" verify --kit "$kit"
make_kit third
rm "$kit/lib/libanswer.so"
expect "a library no one has is named, with the program" 1 "libanswer.so (apps/needs-answer)" \
  "$tree/tools/gpu-kit" unpack --kit "$kit"
expect "no kit: says how to make one" 1 "no kit in $scratch/nowhere" "$tree/tools/gpu-kit" unpack --kit "$scratch/nowhere"
make_kit fourth
rm "$WEFT_KIT_HOME/src" && mkdir "$WEFT_KIT_HOME/src"
expect "the packing machine's own copy is not replaced by a link" 1 "this machine packs kits" \
  "$tree/tools/gpu-kit" unpack --kit "$kit"
expect "an unknown option" 2 "unknown option '--fast'" "$tree/tools/gpu-kit" unpack --fast

[ $failures -eq 0 ] && echo "all gpu-kit checks passed"
exit $((failures > 0))
