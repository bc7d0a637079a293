#!/usr/bin/env bash
# docs/design.md's dependency order, checked on the sources and on the compiled objects:
# core <- kernels <- nn, data <- parallel <- train <- apps, bench; inside parallel/,
# store <- launch <- process_group <- mesh <- ddp <- pipeline, with optim beside ddp, and local
# (one process's devices), which uses nothing else in parallel/ and which pipeline uses too.
#
#   tests/check_layering.sh [SOURCE_DIR [BUILD_DIR]]
#
# A file may include headers of its own layer and of the layers below it, never above (nn
# and data are siblings: neither includes the other; so are ddp and optim inside parallel/). Nothing outside kernels/cuda/ (and
# the CUDA-only tests and benchmarks) includes a CUDA header or tests WEFT_WITH_CUDA,
# except the build files and the test that checks the CUDA registration. With a build
# directory, the library's objects are checked too: every weft symbol a layer's objects
# use is defined in that layer or below (a declaration in a lower header whose definition
# lives higher up is a back-edge that no include shows).
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
build=${2:-}
cd "$root"

status=0
# Reports the files of folder $1 that include headers under $2/ ($3: why that is wrong).
refuse_includes() {
  local hits
  if hits=$(grep -rnE "^#include \"$2/" "$1" --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh'); then
    echo "layering: $1/ includes $2/ ($3):"
    echo "$hits"
    status=1
  fi
}
# layer -> the top-level folders its files must not include
declare -A forbidden=(
  [core]="kernels nn data parallel train apps bench"
  [kernels]="nn data parallel train apps bench"
  [nn]="data parallel train apps bench"
  [data]="nn parallel train apps bench"
  [parallel]="train apps bench"
  [train]="apps bench"
)
for layer in "${!forbidden[@]}"; do
  [ -d "$layer" ] || continue
  for above in ${forbidden[$layer]}; do refuse_includes "$layer" "$above" "above it"; done
done
# parallel/'s sub-layers: sub-folder -> the sub-folders it may include besides its own.
declare -A parallel_uses=(
  [local]=""
  [store]=""
  [launch]="store"
  [process_group]="store launch"
  [mesh]="store launch process_group"
  [ddp]="store launch process_group mesh"
  [optim]="store launch process_group mesh"
  [pipeline]="store launch process_group mesh ddp local"
)
for sub in "${!parallel_uses[@]}"; do
  [ -d "parallel/$sub" ] || continue
  for other in "${!parallel_uses[@]}"; do
    [ "$other" = "$sub" ] && continue
    [[ " ${parallel_uses[$sub]} " == *" $other "* ]] || refuse_includes "parallel/$sub" "parallel/$other" "not below it"
  done
done
if stray=$(find parallel -maxdepth 1 -type f \( -name '*.h' -o -name '*.cpp' \)) && [ -n "$stray" ]; then
  echo "layering: files directly in parallel/ (each belongs in a sub-folder):"; echo "$stray"; status=1
fi
for dir in parallel/*/; do
  sub=$(basename "$dir")
  [ -n "${parallel_uses[$sub]+set}" ] || { echo "layering: parallel/$sub/ has no place in the sub-layer order"; status=1; }
done
# kernels/cuda is the only place for CUDA; the layers above reach it through core.
outside=()
for dir in core nn data parallel train apps; do [ -d "$dir" ] && outside+=("$dir"); done
non_cuda_kernels=(kernels/*.h kernels/*.cpp kernels/cpu)
if hits=$(grep -rnE "^#include \"kernels/cuda/" "${outside[@]}"); then
  echo "layering: CUDA backend headers included outside kernels/cuda:"; echo "$hits"; status=1
fi
if hits=$(grep -rnE "^#include <(cuda|cublas|cudnn|nccl)[^>]*>" "${outside[@]}" "${non_cuda_kernels[@]}"); then
  echo "layering: CUDA headers included outside kernels/cuda:"; echo "$hits"; status=1
fi
if hits=$(grep -rn "WEFT_WITH_CUDA" "${outside[@]}" "${non_cuda_kernels[@]}"); then
  echo "layering: #ifdef WEFT_WITH_CUDA outside kernels/cuda:"; echo "$hits"; status=1
fi

if [ -n "$build" ]; then
  objects="$build/CMakeFiles/weft.dir"
  [ -d "$objects/core" ] || { echo "layering: no library objects under $objects"; exit 1; }
  # The weft symbols the objects of some folders define, and those they use.
  defined() { for d in "$@"; do [ -d "$objects/$d" ] && find "$objects/$d" -maxdepth 1 -name '*.o'; done |
              xargs -r nm -C --defined-only | awk 'NF >= 3 && $2 != "U" {$1 = ""; $2 = ""; print substr($0, 3)}' |
              grep 'weft::' | sort -u; }
  used() { find "$objects/$1" -maxdepth 1 -name '*.o' | xargs -r nm -C -u | sed 's/^ *U //' | grep 'weft::' | sort -u; }
  # layer: the folders of its objects and of the layers below
  declare -A below=(
    [core]="core"
    [kernels]="core kernels kernels/cpu"
    [kernels/cpu]="core kernels kernels/cpu"
    [kernels/cuda]="core kernels kernels/cpu kernels/cuda"
    [nn]="core kernels kernels/cpu nn nn/models nn/optim"
    [nn/models]="core kernels kernels/cpu nn nn/models nn/optim"
    [nn/optim]="core kernels kernels/cpu nn nn/models nn/optim"
    [data]="core kernels kernels/cpu data"
    [parallel/local]="core kernels kernels/cpu nn nn/models nn/optim data parallel/local"
    [parallel/store]="core kernels kernels/cpu nn nn/models nn/optim data parallel/store"
    [parallel/launch]="core kernels kernels/cpu nn nn/models nn/optim data parallel/store parallel/launch"
    [parallel/process_group]="core kernels kernels/cpu nn nn/models nn/optim data parallel/store parallel/launch parallel/process_group"
    [parallel/mesh]="core kernels kernels/cpu nn nn/models nn/optim data parallel/store parallel/launch parallel/process_group parallel/mesh"
    [parallel/ddp]="core kernels kernels/cpu nn nn/models nn/optim data parallel/store parallel/launch parallel/process_group parallel/mesh parallel/ddp"
    [parallel/optim]="core kernels kernels/cpu nn nn/models nn/optim data parallel/store parallel/launch parallel/process_group parallel/mesh parallel/optim"
    [parallel/pipeline]="core kernels kernels/cpu nn nn/models nn/optim data parallel/store parallel/launch parallel/process_group parallel/mesh parallel/ddp parallel/local parallel/pipeline"
    [train]="core kernels kernels/cpu nn nn/models nn/optim data parallel/local parallel/store parallel/launch parallel/process_group parallel/mesh parallel/ddp parallel/optim parallel/pipeline train"
  )
  for layer in "${!below[@]}"; do
    [ -d "$objects/$layer" ] || continue
    if missing=$(comm -23 <(used "$layer") <(defined ${below[$layer]})) && [ -n "$missing" ]; then
      echo "layering: objects of $layer/ use symbols defined above it:"
      echo "$missing"
      status=1
    fi
  done
fi
[ $status -eq 0 ] && echo "layering: core <- kernels <- nn, data <- parallel <- train <- apps holds, and parallel/'s sub-layers; CUDA stays in kernels/cuda"
exit $status
