// FileStore: the log format, the locking, and the polling waits.
//
// Note [FileStore format]
// The file starts with the 8 bytes "WEFTFS1\n", then records, integers little-endian:
//   'S' u32 key_length key u32 value_length value    key := value
//   'D' u32 key_length key                           key removed
// A store's content is the result of replaying every record in order. Writers append
// under an exclusive flock, at the end of the last whole record: if the file is longer
// than that (a writer died mid-record), the tail is cut off first. Readers hold a shared
// flock and stop at a record that is not whole yet. Nothing is ever rewritten in place,
// so the file grows with every set and add: a job's rendezvous writes kilobytes.
#include "parallel/store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>

#include "core/error.h"
#include "parallel/store/store_detail.h"

namespace weft::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using store_detail::clamp_timeout;
using store_detail::errno_text;
using store_detail::quoted_keys;

constexpr std::string_view kMagic = "WEFTFS1\n";
constexpr uint64_t kMaxLength = 0xffffffffu;


void put_u32(std::string& out, uint64_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
bool get_u32(std::string_view in, size_t& pos, uint32_t& v) {
  if (in.size() - pos < 4) return false;
  v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(in[pos + i])) << (8 * i);
  pos += 4;
  return true;
}

}  // namespace

FileStore::FileStore(std::string path, std::chrono::milliseconds timeout) : Store(timeout), path_(std::move(path)) {
  open_file();
}

FileStore::~FileStore() {
  if (fd_ >= 0) ::close(fd_);
}

void FileStore::open_file() {
  if (fd_ >= 0) ::close(fd_);
  data_.clear();
  read_ = size_ = 0;
  pid_ = ::getpid();
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  WEFT_CHECK(fd_ >= 0, "FileStore: cannot open '", path_, "': ", errno_text(errno),
             errno == ENOENT ? " (does its directory exist?)" : "");
  // The first process to lock an empty file writes the header; the others check it.
  int rc;
  while ((rc = ::flock(fd_, LOCK_EX)) != 0 && errno == EINTR) {
  }
  WEFT_CHECK(rc == 0, "FileStore: cannot lock '", path_, "': ", errno_text(errno));
  char head[kMagic.size()] = {};
  const ssize_t got = ::pread(fd_, head, sizeof head, 0);
  const std::string_view seen(head, got > 0 ? static_cast<size_t>(got) : 0);
  std::string error;
  if (got < 0) {
    error = "cannot read it: " + errno_text(errno);
  } else if (seen != kMagic && seen != kMagic.substr(0, seen.size())) {
    error = "it is not a weft FileStore (it does not start with \"WEFTFS1\")";
  } else if (seen.size() < kMagic.size() &&
             ::pwrite(fd_, kMagic.data(), kMagic.size(), 0) != static_cast<ssize_t>(kMagic.size())) {
    error = "cannot write it: " + errno_text(errno);
  }
  ::flock(fd_, LOCK_UN);
  if (!error.empty()) {
    ::close(fd_);
    fd_ = -1;
    WEFT_FAIL("FileStore: '", path_, "': ", error);
  }
  read_ = size_ = kMagic.size();
}

// Runs body() holding the process's mutex and the file's lock, with data_ up to date.
template <class F>
auto FileStore::locked(bool exclusive, F&& body) {
  std::lock_guard<std::mutex> guard(mutex_);
  if (pid_ != ::getpid()) open_file();  // a fork()ed child: the descriptor (and its lock) is the parent's
  int rc;
  while ((rc = ::flock(fd_, exclusive ? LOCK_EX : LOCK_SH)) != 0 && errno == EINTR) {
  }
  WEFT_CHECK(rc == 0, "FileStore: cannot lock '", path_, "': ", errno_text(errno));
  struct Unlock {
    int fd;
    ~Unlock() { ::flock(fd, LOCK_UN); }
  } unlock{fd_};
  refresh();
  return body();
}

// Replays the records appended since the last look.
void FileStore::refresh() {
  struct stat st;
  WEFT_CHECK(::fstat(fd_, &st) == 0, "FileStore: cannot stat '", path_, "': ", errno_text(errno));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < read_) {  // cut shorter behind our back: replay it all
    data_.clear();
    read_ = kMagic.size();
  }
  size_ = size;
  if (size == read_) return;
  std::string buf(size - read_, '\0');
  for (size_t done = 0; done < buf.size();) {
    const ssize_t n = ::pread(fd_, buf.data() + done, buf.size() - done, static_cast<off_t>(read_ + done));
    if (n < 0 && errno == EINTR) continue;
    WEFT_CHECK(n >= 0, "FileStore: cannot read '", path_, "': ", errno_text(errno));
    if (n == 0) {  // shorter than fstat said: read what is there
      buf.resize(done);
      break;
    }
    done += static_cast<size_t>(n);
  }
  const std::string_view in(buf);
  size_t pos = 0;
  while (pos < in.size()) {
    size_t p = pos + 1;
    const char tag = in[pos];
    WEFT_CHECK(tag == 'S' || tag == 'D', "FileStore: '", path_, "' is corrupt at byte ", read_ + pos,
               " (a record starts with '", tag, "', not 'S' or 'D')");
    uint32_t key_length, value_length = 0;
    if (!get_u32(in, p, key_length) || in.size() - p < key_length) break;
    const std::string_view key = in.substr(p, key_length);
    p += key_length;
    if (tag == 'S') {
      if (!get_u32(in, p, value_length) || in.size() - p < value_length) break;
      data_[std::string(key)] = std::string(in.substr(p, value_length));
      p += value_length;
    } else {
      data_.erase(std::string(key));
    }
    pos = p;
  }
  read_ += pos;
}

// Appends one record (under the exclusive lock, after refresh()) and applies it.
void FileStore::append(char tag, const std::string& key, const std::string& value) {
  WEFT_CHECK(key.size() <= kMaxLength && value.size() <= kMaxLength, "FileStore '", path_,
             "': keys and values are limited to 4 GiB");
  std::string record(1, tag);
  put_u32(record, key.size());
  record += key;
  if (tag == 'S') {
    put_u32(record, value.size());
    record += value;
  }
  // A half-written record of a writer that died would hide ours behind it.
  WEFT_CHECK(size_ == read_ || ::ftruncate(fd_, static_cast<off_t>(read_)) == 0, "FileStore: cannot truncate '",
             path_, "': ", errno_text(errno));
  for (size_t done = 0; done < record.size();) {
    const ssize_t n = ::pwrite(fd_, record.data() + done, record.size() - done, static_cast<off_t>(read_ + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      (void)!::ftruncate(fd_, static_cast<off_t>(read_));
      WEFT_FAIL("FileStore: cannot write '", path_, "': ", errno_text(err));
    }
    done += static_cast<size_t>(n);
  }
  read_ += record.size();
  size_ = read_;
  if (tag == 'S')
    data_[key] = value;
  else
    data_.erase(key);
}

void FileStore::set(const std::string& key, const Bytes& value) {
  locked(true, [&] { append('S', key, to_text(value)); });
}

Bytes FileStore::get(const std::string& key) {
  const auto deadline = Clock::now() + clamp_timeout(timeout());
  for (milliseconds pause(1);; pause = std::min(pause + milliseconds(1), milliseconds(10))) {
    std::optional<Bytes> value = locked(false, [&]() -> std::optional<Bytes> {
      auto it = data_.find(key);
      if (it == data_.end()) return std::nullopt;
      return to_bytes(it->second);
    });
    if (value) return *value;
    const auto now = Clock::now();
    if (now >= deadline) wait_failed("FileStore get('" + key + "')", {key}, timeout());
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
  }
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  return locked(true, [&] {
    int64_t value = 0;
    if (auto it = data_.find(key); it != data_.end()) {
      const std::string& s = it->second;
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
      WEFT_CHECK(ec == std::errc() && end == s.data() + s.size() && !s.empty(), "FileStore add('", key,
                 "'): the value of '", key, "' is not a decimal integer: '", s.substr(0, 40), "'");
    }
    WEFT_CHECK(!__builtin_add_overflow(value, delta, &value), "FileStore add('", key, "'): adding ", delta,
               " overflows int64");
    append('S', key, std::to_string(value));
    return value;
  });
}

Bytes FileStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return locked(true, [&] {
    auto it = data_.find(key);
    if (it == data_.end() ? expected.empty() : it->second == to_text(expected)) {
      append('S', key, to_text(desired));
      return desired;
    }
    return it == data_.end() ? Bytes() : to_bytes(it->second);
  });
}

bool FileStore::check(const std::vector<std::string>& keys) {
  return locked(false, [&] {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data_.count(k) > 0; });
  });
}

void FileStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + clamp_timeout(timeout);
  for (milliseconds pause(1);; pause = std::min(pause + milliseconds(1), milliseconds(10))) {
    if (check(keys)) return;
    const auto now = Clock::now();
    if (now >= deadline) wait_failed("FileStore wait", keys, timeout);
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
  }
}

void FileStore::wait_failed(const std::string& what, const std::vector<std::string>& keys, milliseconds timeout) {
  std::vector<std::string> missing = locked(false, [&] {
    std::vector<std::string> out;
    for (const std::string& k : keys)
      if (!data_.count(k)) out.push_back(k);
    return out;
  });
  if (missing.empty()) missing = keys;  // set at the last moment; still too late
  WEFT_FAIL(what, ": timed out after ", timeout.count(), " ms waiting for ", missing.size() == 1 ? "key " : "keys ",
            quoted_keys(missing), " (file '", path_, "')");
}

bool FileStore::delete_key(const std::string& key) {
  return locked(true, [&] {
    if (!data_.count(key)) return false;
    append('D', key, {});
    return true;
  });
}

int64_t FileStore::num_keys() {
  return locked(false, [&] { return static_cast<int64_t>(data_.size()); });
}

}  // namespace weft::parallel
