// FileStore: a Store in one file shared by the processes of one machine (`file://path`
// initialisation; PyTorch's c10d FileStore).
//
// The file is an append-only log (format in file_store.cpp): every operation takes a
// flock on the file (shared to read, exclusive to append), reads the records appended
// since its last look and, to change something, appends one record. Records are never
// rewritten, so a reader never sees a half-changed store; a record left half-written by a
// process that died is cut off by the next writer. Each FileStore keeps the keys it has
// read so far, so an operation reads only what is new.
//
// get() and wait() poll the file (every 1 ms at first, every 10 ms after a while) until
// the keys are there or the timeout has passed. flock needs a local file system (not
// NFS); the file is left in place when the store goes away (delete it after the job).
// Safe from several threads at once; a fork()ed child reopens the file on its first call
// (an inherited descriptor would share the parent's lock).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "parallel/store/store.h"

namespace weft::parallel {

class FileStore final : public Store {
 public:
  // Opens `path`, creating it when missing; fails naming the path when it cannot be
  // opened or written, or holds something else than a FileStore.
  explicit FileStore(std::string path, std::chrono::milliseconds timeout = kDefaultTimeout);
  ~FileStore() override;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  using Store::set;
  using Store::wait;

  const std::string& path() const { return path_; }

 private:
  template <class F>
  auto locked(bool exclusive, F&& body);
  void open_file();
  void refresh();
  void append(char tag, const std::string& key, const std::string& value);
  [[noreturn]] void wait_failed(const std::string& what, const std::vector<std::string>& keys,
                                std::chrono::milliseconds timeout);

  std::string path_;
  std::mutex mutex_;  // one operation at a time per FileStore (flock does not exclude threads)
  int fd_ = -1;
  pid_t pid_ = 0;       // the process that opened fd_
  uint64_t read_ = 0;   // the end of the last whole record read
  uint64_t size_ = 0;   // the file's size at the last look (more than read_: a half-written record)
  std::unordered_map<std::string, std::string> data_;  // the keys of the records before read_
};

}  // namespace weft::parallel
