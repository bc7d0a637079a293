# Finds weft's dependencies and prints one status line for each.

function(weft_status name text)
  message(STATUS "weft: ${name}: ${text}")
endfunction()

find_package(Eigen3 3.4 REQUIRED NO_MODULE)
weft_status("Eigen" "${Eigen3_VERSION} (CPU matrix kernels)")

find_package(ZLIB REQUIRED)
weft_status("zlib" "${ZLIB_VERSION_STRING} (gzip'd IDX files)")

find_package(nlohmann_json 3 REQUIRED)
weft_status("nlohmann-json" "${nlohmann_json_VERSION} (safetensors headers)")

find_package(OpenMP COMPONENTS CXX)
if(OpenMP_CXX_FOUND)
  weft_status("OpenMP" "${OpenMP_CXX_VERSION} (multi-threaded CPU kernels)")
else()
  weft_status("OpenMP" "not found: CPU kernels run on one thread")
endif()

# CUDA: AUTO turns the backend on when nvcc is there. CMake 3.25 does not know that nvcc
# 13 supports C++20 (DESIGN.md): it is told so below, so that cxx_std_20 on weft (and on
# targets that link it and compile .cu files) maps to -std=c++20 instead of failing.
set(WEFT_WITH_CUDA OFF)
set(WEFT_WITH_NCCL OFF)
if(NOT WEFT_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(WEFT_WITH_CUDA ON)
  elseif(WEFT_CUDA STREQUAL "ON")
    message(FATAL_ERROR "WEFT_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER or put nvcc on PATH)")
  endif()
endif()
if(WEFT_WITH_CUDA)
  # The GPU in the machine when there is one, else Ampere and Hopper (A100, H100, H200).
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    execute_process(COMMAND nvidia-smi -L RESULT_VARIABLE weft_smi_rc OUTPUT_VARIABLE weft_smi_out ERROR_QUIET)
    if(weft_smi_rc EQUAL 0 AND weft_smi_out MATCHES "GPU ")
      set(CMAKE_CUDA_ARCHITECTURES native)
    else()
      set(CMAKE_CUDA_ARCHITECTURES "80;90")
    endif()
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  if(NOT "cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
    list(APPEND CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  weft_status("CUDA" "ON, nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
  weft_status("cuBLAS" "${CUDAToolkit_VERSION} (matrix products)")
  # cuDNN ships beside the toolkit but has no CMake package: find its header and library there,
  # or under CUDNN_ROOT (the nvidia-cudnn wheel that PyTorch brings has include/ and lib/, and
  # only the versioned libcudnn.so.9).
  find_path(WEFT_CUDNN_INCLUDE cudnn.h HINTS ${CUDNN_ROOT}/include $ENV{CUDNN_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS})
  find_library(WEFT_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9
               HINTS ${CUDNN_ROOT}/lib $ENV{CUDNN_ROOT}/lib ${CUDAToolkit_LIBRARY_DIR})
  if(NOT WEFT_CUDNN_INCLUDE OR NOT WEFT_CUDNN_LIBRARY)
    message(FATAL_ERROR "the CUDA backend needs cuDNN 9 (cudnn.h and libcudnn) beside the CUDA toolkit")
  endif()
  file(STRINGS ${WEFT_CUDNN_INCLUDE}/cudnn_version.h WEFT_CUDNN_MAJOR REGEX "#define CUDNN_MAJOR")
  weft_status("cuDNN" "${WEFT_CUDNN_MAJOR} (${WEFT_CUDNN_LIBRARY}; convolution, pooling, batch norm)")
  # NCCL (collectives across GPUs and processes): beside the toolkit, or under NCCL_ROOT
  # (the nvidia-nccl wheel that PyTorch brings has include/ and lib/). Optional: without
  # it the nccl process-group backend says it was not built.
  find_path(WEFT_NCCL_INCLUDE nccl.h HINTS ${NCCL_ROOT}/include $ENV{NCCL_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS})
  find_library(WEFT_NCCL_LIBRARY NAMES nccl libnccl.so.2
               HINTS ${NCCL_ROOT}/lib $ENV{NCCL_ROOT}/lib ${CUDAToolkit_LIBRARY_DIR})
  if(WEFT_NCCL_INCLUDE AND WEFT_NCCL_LIBRARY)
    set(WEFT_WITH_NCCL ON)
    file(STRINGS ${WEFT_NCCL_INCLUDE}/nccl.h weft_nccl_version REGEX "#define NCCL_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE "[^0-9;]" "" weft_nccl_version "${weft_nccl_version}")
    string(REPLACE ";" "." weft_nccl_version "${weft_nccl_version}")
    weft_status("NCCL" "${weft_nccl_version} (${WEFT_NCCL_LIBRARY}; the nccl process-group backend)")
  else()
    weft_status("NCCL" "not found (set NCCL_ROOT): no nccl process-group backend")
  endif()
else()
  weft_status("CUDA" "OFF (WEFT_CUDA=${WEFT_CUDA})")
endif()

set(WEFT_WITH_GLOO OFF)
if(NOT WEFT_GLOO STREQUAL "OFF")
  find_package(Gloo QUIET)
  if(Gloo_FOUND)
    set(WEFT_WITH_GLOO ON)
    weft_status("Gloo" "found (CPU collectives across processes; used by the parallel layer)")
  elseif(WEFT_GLOO STREQUAL "ON")
    message(FATAL_ERROR "WEFT_GLOO=ON but Gloo was not found (apt-get install libgloo-dev)")
  else()
    weft_status("Gloo" "not found")
  endif()
else()
  weft_status("Gloo" "OFF")
endif()

if(WEFT_BUILD_TESTS)
  find_package(doctest REQUIRED)
  weft_status("doctest" "${doctest_VERSION} (tests)")
endif()

if(WEFT_BUILD_APPS)
  find_package(CLI11 REQUIRED)
  weft_status("CLI11" "${CLI11_VERSION} (command lines of the executables)")
endif()
