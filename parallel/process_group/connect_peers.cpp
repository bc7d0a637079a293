// The pairs of ranks exchange a message each way before the program's own; see connect_peers.h.
#include "parallel/process_group/connect_peers.h"

#include <algorithm>
#include <set>

#include "core/error.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace weft::parallel {

void connect_peers(ProcessGroup& group, const std::vector<std::pair<int, int>>& pairs, Device device) {
  std::set<std::pair<int, int>> ordered;  // one order on every rank: by the lower rank, then the higher
  for (const auto& [a, b] : pairs) {
    WEFT_CHECK(a != b && a >= 0 && b >= 0 && a < group.size() && b < group.size(), "connect_peers: the pair (", a,
               ", ", b, ") is not two different ranks of the group of ", group.size());
    ordered.insert({std::min(a, b), std::max(a, b)});
  }
  const int me = group.rank();
  const TensorOptions on_device(DType::Float32, device);
  // wait() returns once the operation is queued (on NCCL: its communicator made); synchronize()
  // waits for it to be done, so that the next communicator is made with nothing in flight.
  auto done = [&](const std::shared_ptr<Work>& work) {
    work->wait();
    synchronize(device);
  };
  for (const auto& [low, high] : ordered) {
    if (me != low && me != high) continue;
    const int peer = me == low ? high : low;
    Tensor mine = full({1}, static_cast<double>(me), on_device), theirs = zeros({1}, on_device);
    if (me == low) done(group.send(mine, peer, kConnectPeersTag));
    done(group.recv(theirs, peer, kConnectPeersTag));
    if (me == high) done(group.send(mine, peer, kConnectPeersTag));
    const double got = theirs.item();
    WEFT_CHECK(got == static_cast<double>(peer), "connect_peers: rank ", peer, " answered with ", got,
               " instead of its rank");
  }
}

}  // namespace weft::parallel
