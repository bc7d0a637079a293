// run_as_ranks: exec weft-run on this program.
#include "train/launch.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/launch/launch_env.h"
#include "parallel/process_group/distributed.h"

namespace weft::train {

namespace {

bool executable(const std::filesystem::path& p) { return !p.empty() && ::access(p.c_str(), X_OK) == 0; }

std::filesystem::path self_path() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : p;
}

}  // namespace

std::string find_weft_run() {
  if (const char* env = std::getenv("WEFT_RUN"); env != nullptr && *env != '\0')
    return executable(env) ? std::string(env) : std::string();
  const auto self = self_path();
  for (const auto& candidate : {self.parent_path() / "weft-run", self.parent_path().parent_path() / "apps" / "weft-run",
                                std::filesystem::path(WEFT_INSTALL_BINDIR) / "weft-run"})
    if (executable(candidate)) return candidate.string();
  if (const char* path = std::getenv("PATH")) {
    std::string dirs(path);
    size_t start = 0;
    while (start <= dirs.size()) {
      const size_t end = dirs.find(':', start);
      const std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
      if (!dir.empty() && executable(std::filesystem::path(dir) / "weft-run"))
        return (std::filesystem::path(dir) / "weft-run").string();
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
  return "";
}

void run_as_ranks(int nproc, int argc, char** argv, const NodeOptions& nodes) {
  WEFT_CHECK(nproc >= 1, "run_as_ranks: nproc must be at least 1, got ", nproc);
  const std::string launcher = find_weft_run();
  WEFT_CHECK(!launcher.empty(), "run_as_ranks: weft-run was not found (not in WEFT_RUN, next to this program, in ",
             WEFT_INSTALL_BINDIR, " or on PATH); start the ranks with weft-run yourself");
  const auto self = self_path();
  std::vector<std::string> args = {launcher, "--nproc-per-node", std::to_string(nproc), "--nnodes",
                                   std::to_string(nodes.nnodes), "--node-rank", std::to_string(nodes.node_rank)};
  if (!nodes.master_addr.empty()) args.insert(args.end(), {"--master-addr", nodes.master_addr});
  if (nodes.master_port > 0) args.insert(args.end(), {"--master-port", std::to_string(nodes.master_port)});
  args.push_back(self.empty() ? std::string(argv[0]) : self.string());
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> raw;
  for (auto& a : args) raw.push_back(a.data());
  raw.push_back(nullptr);
  ::execv(raw[0], raw.data());
  WEFT_FAIL("run_as_ranks: cannot execute ", launcher, ": ", std::strerror(errno));
}

Device join_job(const std::optional<Device>& device, const std::string& backend) {
  Device mine = kCPU;
  if (device) {
    mine = *device;
  } else if (cuda_available()) {
    const int local = parallel::launched_as_rank() ? parallel::read_launch_env().local_rank : 0;
    mine = Device::cuda(local % cuda_device_count());
  }
  if (!parallel::is_initialized())
    parallel::init_process_group(!backend.empty() ? backend : mine.is_cuda() ? "nccl" : "gloo");
  return mine;
}

}  // namespace weft::train
