// weft::AtomicFile: a committed file appears whole, an abandoned one leaves nothing, errors
// name the path and the step, and temporaries of processes that died are removed.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"

using namespace weft;
namespace fs = std::filesystem;

namespace {

struct Scratch {
  fs::path dir;
  explicit Scratch(const std::string& name)
      : dir(fs::temp_directory_path() / ("weft_atomic_file_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The pid of a process that has exited and been reaped (free, unless the system reuses it).
pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

void touch(const std::string& path) { std::ofstream(path) << "partial"; }

}  // namespace

TEST_CASE("commit replaces the file whole; an abandoned write leaves the old one and no temporary") {
  Scratch scratch("commit");
  const std::string path = scratch.path("out.json");
  {
    AtomicFile file(path, "test");
    file.write("first");
    CHECK_FALSE(fs::exists(path));  // nothing at the path until the commit
    CHECK(fs::exists(file.temporary_path()));
    file.commit();
  }
  CHECK(read(path) == "first");
  {
    AtomicFile file(path, "test");
    file.write("second, never committed");
  }
  CHECK(read(path) == "first");
  CHECK(scratch.files() == std::vector<std::string>{"out.json"});
}

TEST_CASE("errors name the caller, the path, the step and the reason") {
  Scratch scratch("errors");
  const std::string missing = scratch.path("no_such_dir/out.json");
  CHECK_THROWS_WITH_AS(AtomicFile(missing, "save_checkpoint"),
                       doctest::Contains(("save_checkpoint: cannot write '" + missing + "' (creating '" + missing +
                                          ".tmp." + std::to_string(::getpid()) + "'): No such file or directory")
                                             .c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(AtomicFile(scratch.dir.string(), "test"), doctest::Contains("it is a directory"), Error);
  CHECK_THROWS_WITH_AS(AtomicFile("", "test"), doctest::Contains("test: the file path is empty"), Error);

  // The rename fails (a directory took the path meanwhile): the temporary goes, the directory stays.
  const std::string taken = scratch.path("taken");
  {
    AtomicFile file(taken, "test");
    file.write("x");
    fs::create_directory(taken);
    CHECK_THROWS_WITH_AS(file.commit(), doctest::Contains("(renaming over it '"), Error);
  }
  CHECK(scratch.files() == std::vector<std::string>{"taken"});
}

TEST_CASE("check_writable probes the path and leaves nothing behind") {
  Scratch scratch("probe");
  check_writable(scratch.path("ok.st"), "test");
  CHECK(scratch.files().empty());
  CHECK_THROWS_WITH_AS(check_writable(scratch.path("missing/ok.st"), "--checkpoint"),
                       doctest::Contains("--checkpoint: cannot write"), Error);
}

TEST_CASE("temporaries of processes that died are removed, those of live ones and other files kept") {
  Scratch scratch("stale");
  const std::string path = scratch.path("model.st");
  const std::string dead = "model.st.tmp." + std::to_string(dead_pid());
  const std::string alive = "model.st.tmp." + std::to_string(::getppid());  // our parent runs
  for (const std::string& name : {dead, alive, std::string("model.st.tmp.x1"), std::string("other.st.tmp.1")})
    touch(scratch.path(name));
  CHECK(remove_stale_temporaries(path) == 1);
  std::vector<std::string> kept{alive, "model.st.tmp.x1", "other.st.tmp.1"};
  std::sort(kept.begin(), kept.end());
  CHECK(scratch.files() == kept);

  // A save to the path removes them itself.
  touch(scratch.path(dead));
  AtomicFile file(path, "test");
  file.write("new");
  file.commit();
  CHECK_FALSE(fs::exists(scratch.path(dead)));
}
