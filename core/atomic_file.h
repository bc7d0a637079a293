// AtomicFile: writes a file so that a reader sees the old one or the new one, never a mix.
//
//   AtomicFile file(path, "save_safetensors");
//   file.write(bytes, n);  // as often as needed
//   file.commit();         // fsync, rename over `path`, flush the directory
//
// Bytes go into the temporary "<path>.tmp.<pid>" beside `path` (rename is atomic only
// within a directory). An AtomicFile destroyed without commit() removes its temporary, so
// an error leaves `path` as it was and nothing beside it. A process killed mid-write leaves
// its temporary behind: the next AtomicFile for the same path removes every such file whose
// process no longer exists on this machine (a save in progress elsewhere keeps its own).
//
// Checkpoints, traces and weft-train's metrics are written this way. `context` names the
// caller in every error, which also names the path, the step and the system's reason.
#pragma once

#include <string>

namespace weft {

class AtomicFile {
 public:
  AtomicFile(std::string path, std::string context);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(const std::string& text) { write(text.data(), text.size()); }
  void commit();

  const std::string& temporary_path() const { return tmp_; }

 private:
  [[noreturn]] void fail(const char* step) const;

  std::string path_, context_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// Throws the error an AtomicFile for `path` would throw on opening (no such directory, no
// permission, `path` is a directory, an empty path): a program checks its output paths
// before hours of work, not after. Creates, writes and removes the temporary; leaves nothing.
void check_writable(const std::string& path, const std::string& context);

// Removes the temporaries "<path>.tmp.<pid>" of processes that no longer exist and returns
// how many it removed. AtomicFile calls it; exposed for tests.
int remove_stale_temporaries(const std::string& path);

}  // namespace weft
