// What the suites that run Gloo groups share: the skip where weft was built without Gloo, and
// a group of one process (through a store file of its own) for their in-process cases.
#pragma once

#include <unistd.h>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "parallel/process_group/distributed.h"
#include "parallel/process_group/process_group_gloo.h"
#include "parallel/store/file_store.h"

namespace weft::test {

// True (after a visible message) when this build has no Gloo: the case then returns.
inline bool skip_without_gloo() {
  if (parallel::gloo_available()) return false;
  MESSAGE("skipped: weft was built without Gloo");
  return true;
}

inline std::shared_ptr<parallel::ProcessGroup> solo_group() {
  const auto path = std::filesystem::temp_directory_path() / ("weft_solo_group_" + std::to_string(::getpid()) + "_" +
                                                              std::to_string(std::rand()));
  auto store = std::make_shared<parallel::FileStore>(path.string(), std::chrono::seconds(10));
  auto group = parallel::new_group_from_store("gloo", store, 0, 1, std::chrono::seconds(10));
  std::filesystem::remove(path);
  return group;
}

}  // namespace weft::test
