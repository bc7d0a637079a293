// A program written the way seed 004 writes its distributed part: the rank and the world
// size from the command line (or from the launcher), MASTER_ADDR and MASTER_PORT set in the
// code unless given, init_process_group, a collective, destroy_process_group. The README
// shows it; tests/seed004_style.sh runs it under weft-run and as processes started by hand.
//
//   seed004_style --world-size 3 --rank 0 & seed004_style --world-size 3 --rank 1 & ...
//   weft-run --nproc-per-node 3 seed004_style
#include <cstdlib>
#include <iostream>
#include <string>

#include <weft.h>

using namespace weft;

int main(int argc, char** argv) {
  parallel::InitOptions options;  // init_method "env://"
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--world-size") options.world_size = std::atoi(argv[i + 1]);
    if (flag == "--rank") options.rank = std::atoi(argv[i + 1]);
  }
  if (options.rank >= 0) {  // started by hand: say where rank 0 serves the rendezvous
    ::setenv("RANK", std::to_string(options.rank).c_str(), 0);
    ::setenv("WORLD_SIZE", std::to_string(options.world_size).c_str(), 0);
  }
  ::setenv("MASTER_ADDR", "127.0.0.1", 0);  // as seed 004 does (0: a launcher's value wins)
  ::setenv("MASTER_PORT", "8889", 0);
  try {
    parallel::init_process_group("gloo", options);
    const int rank = parallel::get_rank(), world = parallel::get_world_size();
    Tensor t = full({4}, static_cast<double>(rank + 1));
    parallel::default_group().all_reduce(t)->wait();  // 1 + 2 + ... + world in every element
    std::cout << "rank " << rank << " of " << world << ": all_reduce gives " << t.to_vector<float>()[0] << std::endl;
    parallel::destroy_process_group();
    return t.to_vector<float>()[0] == world * (world + 1) / 2 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "seed004_style: " << e.what() << "\n";
    return 1;
  }
}
