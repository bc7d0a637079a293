// The entry point every fuzz target defines, libFuzzer's: called once per input. Built with
// Clang and -DWEFT_FUZZ=ON it is a libFuzzer program; otherwise replay_main.cpp runs it over
// the files of a corpus, as an ordinary test (tests/fuzz/CMakeLists.txt).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace weft::fuzz {

// Writes `bytes` to a file of this process's own ("<tmp>/weft_fuzz_<pid>/<name>"), for the
// parsers that read files, and returns its path.
std::string write_scratch_file(const std::string& name, const uint8_t* data, size_t size);

}  // namespace weft::fuzz
