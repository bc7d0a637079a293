#!/usr/bin/env bash
# tools/gpu-kit's checks and unpacking, without a GPU or a CUDA build: a kit made by hand from a
# scratch tree (a CTest file and small programs that load a library of their own) is verified
# and unpacked as the GPU machine would: the tree checked against the kit, the build put where
# its paths point, its libraries found (the kit's, or a fake nvidia wheel's with the toolkit's
# folders missing) and bound, and every refusal naming what is wrong.
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
check() {  # what, test...
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
for tool in zstd cc ldd sha256sum git; do
  command -v "$tool" >/dev/null || { echo "skipped: $tool was not found"; exit 77; }
done

# The tree the kit was "built" from, a git work tree (verify asks git for its files): gpu-kit
# itself and a source file.
tree="$scratch/tree"
mkdir -p "$tree/tools" "$tree/core"
cp "$source_dir/tools/gpu-kit" "$tree/tools/"
echo 'int answer() { return 42; }' >"$tree/core/answer.c"
echo '# prose, not checked' >"$tree/README.md"
git -C "$tree" init -q
export WEFT_KIT_HOME="$scratch/home"
build="$WEFT_KIT_HOME/build"
export WEFT_KIT_TOOLKIT_LIBS="$scratch/no-toolkit/lib64"  # the GPU machine's toolkit folders may be missing

# A build: a program that loads a library of ours, one that loads nothing of ours, a CTest file.
# weft-train's place holds a program that binds the library only when it runs without arguments.
staged="$scratch/staged"
mkdir -p "$staged/apps" "$scratch/libs"
cc -shared -fPIC -o "$scratch/libs/libanswer.so" "$tree/core/answer.c"
cc -shared -fPIC -o "$scratch/libs/libanswer-without-answer.so" -x c - <<<'int question(void) { return 54; }'
echo 'int answer(void); int main(void) { return answer() == 42 ? 0 : 1; }' >"$scratch/main.c"
cc -o "$staged/apps/needs-answer" "$scratch/main.c" -L"$scratch/libs" -lanswer
cc -o "$staged/apps/weft-train" -x c - -L"$scratch/libs" -lanswer <<<'int answer(void);
int main(int argc, char **argv) { (void)argv; return argc > 1 ? 0 : answer() - 42; }'
cc -o "$staged/apps/plain" -x c - <<<'int main(void) { return 0; }'
echo "add_test(plain \"$build/apps/plain\")" >"$staged/CTestTestfile.cmake"

kit="$scratch/kit"
make_kit() {  # the kit of the tree as it is now, in pack's format
  rm -rf "$kit" && mkdir -p "$kit/lib" "$kit/zstd/lib" "$kit/data"
  tar -cf - -C "$staged" . | zstd -q --long=31 -o "$kit/build.tar.zst"
  printf '%s\n' apps/needs-answer apps/plain apps/weft-train >"$kit/executables.txt"
  cp "$scratch/libs/libanswer.so" "$kit/lib/"
  (cd "$tree" && find . -type f ! -path './.git/*' ! -name '*.md' -printf '%P\0' | sort -z | xargs -0 sha256sum) \
    >"$kit/sources.sha256"
  printf '%s\n' "KIT_ID=$1" KIT_COMMIT=abc1234 KIT_ARCH=90-real KIT_CREATED=2026-11-26T00:00:00Z \
    "KIT_TESTS='^plain'" KIT_NVCC=13.0 KIT_CUDNN=9.13.0 KIT_NCCL=2.28.3 >"$kit/kit.env"
}
make_kit first

expect "verify: the tree is the kit's" 0 "the working tree is the kit's" "$tree/tools/gpu-kit" verify --kit "$kit"
expect "unpack: the tree checked, the build in place, the libraries found" 0 "unpacked into $build (" \
  "$tree/tools/gpu-kit" unpack --kit "$kit"
check "src links to the tree" [ "$(readlink "$WEFT_KIT_HOME/src")" = "$tree" ]
expect "the environment it writes runs the program that needs the kit's library" 0 "" \
  bash -c "source '$WEFT_KIT_HOME/env.sh' && '$build/apps/needs-answer'"
expect "ctest runs the kit's entries from the unpacked build" 0 "100% tests passed" ctest --test-dir "$build"

# A second unpack of the same kit keeps what is there (gpu-check's logs); another kit replaces
# the build but not those logs.
mkdir -p "$build/gpu-check-logs" && touch "$build/gpu-check-logs/results.json" "$build/stale-file"
expect "the same kit again: nothing unpacked anew" 0 "unpacked into" "$tree/tools/gpu-kit" unpack --kit "$kit"
check "the same kit keeps the build" [ -f "$build/stale-file" ]
make_kit second
expect "another kit replaces the build" 0 "kit second" "$tree/tools/gpu-kit" unpack --kit "$kit"
check "...and keeps the logs" [ ! -f "$build/stale-file" -a -f "$build/gpu-check-logs/results.json" ]

# Libraries: one the machine has stays the machine's; one found only in PyTorch's nvidia-*
# wheels (a fake namespace package here) is found there, the toolkit's folders being absent.
make_kit machine-has-it
cp "$scratch/libs/libanswer.so" "$kit/lib/libz.so.1"
expect "a kit library the machine has" 0 "unpacked into" "$tree/tools/gpu-kit" unpack --kit "$kit"
check "...is not put before the machine's" [ ! -e "$WEFT_KIT_HOME/lib/libz.so.1" -a -e "$WEFT_KIT_HOME/lib/libanswer.so" ]
make_kit from-a-wheel
rm "$kit/lib/libanswer.so"
mkdir -p "$scratch/site/nvidia/answer/lib"
cp "$scratch/libs/libanswer.so" "$scratch/site/nvidia/answer/lib/"
expect "a library found in a wheel" 0 "unpacked into" env PYTHONPATH="$scratch/site" "$tree/tools/gpu-kit" unpack --kit "$kit"
check "...is on the path it writes" grep -qF "$scratch/site/nvidia/answer/lib" "$WEFT_KIT_HOME/env.sh"

# Refusals, each naming what is wrong.
make_kit no-one-has-it
rm "$kit/lib/libanswer.so"
expect "a library no one has is named, with the program" 1 "libanswer.so (apps/needs-answer)" \
  "$tree/tools/gpu-kit" unpack --kit "$kit"
make_kit lacks-a-symbol
cp "$scratch/libs/libanswer-without-answer.so" "$kit/lib/libanswer.so"
expect "a library that lacks a symbol the programs bind" 1 "apps/weft-train does not load with every symbol bound" \
  "$tree/tools/gpu-kit" unpack --kit "$kit"
make_kit fifth
echo 'changed' >>"$tree/README.md"
expect "a Markdown change does not stale the kit" 0 "the working tree is the kit's" "$tree/tools/gpu-kit" verify --kit "$kit"
echo 'int question() { return 6 * 9; }' >>"$tree/core/answer.c"
expect "a changed source is refused, named" 1 "core/answer.c: FAILED" "$tree/tools/gpu-kit" unpack --kit "$kit"
expect "verify names it too" 1 "core/answer.c: FAILED" "$tree/tools/gpu-kit" verify --kit "$kit"
make_kit sixth
echo 'int more() { return 1; }' >"$tree/core/more.c"
expect "verify names a source added since the pack" 1 "core/more.c: not in the kit" \
  "$tree/tools/gpu-kit" verify --kit "$kit"
rm "$tree/core/more.c"
expect "no kit: says how to make one" 1 "no kit in $scratch/nowhere" "$tree/tools/gpu-kit" unpack --kit "$scratch/nowhere"
rm "$WEFT_KIT_HOME/src" && mkdir "$WEFT_KIT_HOME/src"
expect "the packing machine's own copy is not replaced by a link" 1 "this machine packs kits" \
  "$tree/tools/gpu-kit" unpack --kit "$kit"
expect "an unknown option" 2 "unknown option '--fast'" "$tree/tools/gpu-kit" unpack --fast

[ $failures -eq 0 ] && echo "all gpu-kit checks passed"
exit $((failures > 0))
