// write_scratch_file: one directory per process, one file per name, rewritten per input.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "fuzz_target.h"

namespace weft::fuzz {

std::string write_scratch_file(const std::string& name, const uint8_t* data, size_t size) {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("weft_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {  // a replay leaves nothing behind (libFuzzer ends by exit() too)
      std::error_code ignored;
      std::filesystem::remove_all(std::filesystem::temp_directory_path() /
                                      ("weft_fuzz_" + std::to_string(::getpid())), ignored);
    });
    return d;
  }();
  const std::string path = (dir / name).string();
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data),
                                                                  static_cast<std::streamsize>(size));
  return path;
}

}  // namespace weft::fuzz
