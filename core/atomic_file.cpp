// AtomicFile: a temporary beside the target, renamed over it once complete.
#include "core/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace weft {

namespace {

std::string temporary_for(const std::string& path) { return path + ".tmp." + std::to_string(::getpid()); }

}  // namespace

int remove_stale_temporaries(const std::string& path) {
  const std::filesystem::path target(path);
  const std::string prefix = target.filename().string() + ".tmp.";
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : ".";
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec), end;
  int removed = 0;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    pid_t pid = 0;
    const char* first = name.data() + prefix.size();
    const char* last = name.data() + name.size();
    auto [stop, parse_error] = std::from_chars(first, last, pid);
    if (parse_error != std::errc() || stop != last || pid <= 0 || pid == ::getpid()) continue;
    // Only a process that is gone: one that exists (EPERM: another user's) may be saving now.
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (::unlink(it->path().c_str()) == 0) ++removed;
  }
  return removed;
}

AtomicFile::AtomicFile(std::string path, std::string context)
    : path_(std::move(path)), context_(std::move(context)), tmp_(temporary_for(path_)) {
  WEFT_CHECK(!path_.empty(), context_, ": the file path is empty");
  std::error_code ec;
  WEFT_CHECK(!std::filesystem::is_directory(path_, ec), context_, ": cannot write '", path_, "': it is a directory");
  remove_stale_temporaries(path_);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd_ < 0) fail("creating");
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::fail(const char* step) const {
  WEFT_FAIL(context_, ": cannot write '", path_, "' (", step, " '", tmp_, "'): ", std::strerror(errno));
}

void AtomicFile::write(const void* data, size_t n) {
  WEFT_CHECK(fd_ >= 0 && !committed_, context_, ": '", path_, "' is already committed");
  const auto* in = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = ::write(fd_, in, n);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) fail("writing");
    in += put;
    n -= static_cast<size_t>(put);
  }
}

void AtomicFile::commit() {
  WEFT_CHECK(fd_ >= 0 && !committed_, context_, ": '", path_, "' is already committed");
  if (::fsync(fd_) != 0) fail("flushing to disk");
  const int closed = ::close(fd_);
  fd_ = -1;
  if (closed != 0) fail("closing");
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("renaming over it");
  committed_ = true;
  // The rename itself is durable only once the directory is flushed. Some filesystems
  // refuse fsync on a directory; the file is complete either way, so that is not an error.
  const std::string dir = std::filesystem::path(path_).parent_path().string();
  const int dir_fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    (void)::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void check_writable(const std::string& path, const std::string& context) {
  AtomicFile probe(path, context);
  probe.write("probe", 5);  // a full disk or a quota shows here, not only at open
}

}  // namespace weft
