// A DDP program written by hand, the way a PyTorch user writes one: the rank and the world
// size from the command line (or from the launcher), MASTER_ADDR and MASTER_PORT set in the
// code unless given, init_process_group, a collective, then a training loop: the ConvNet
// wrapped in DistributedDataParallel, each rank on its DistributedSampler's share, and
// destroy_process_group. docs/process-groups.md shows it; handwritten_ddp_program.sh beside it runs it
// under weft-run and as processes started by hand.
//
//   handwritten_ddp_program --world-size 3 --rank 0 &
//   handwritten_ddp_program --world-size 3 --rank 1 & ...
//   weft-run --nproc-per-node 3 handwritten_ddp_program
//   weft-run --nproc-per-node 3 handwritten_ddp_program --uneven
//   weft-run --nproc-per-node 3 handwritten_ddp_program --local-sgd
//
// --uneven trains on every sample exactly once per epoch: 121 samples shared without padding
// (DistributedEvalSampler, shuffled each epoch), so at 3 ranks rank 0 has 5 batches of 10
// and the others 4, and the loop runs inside ddp->join() (parallel/process_group/join.h).
// --local-sgd trains with post-local SGD (parallel/ddp/post_localsgd_hook.h): gradients averaged
// over every rank for the first 4 steps, then not at all, the replicas averaged after every
// 4th step instead (steps 4 and 8 of 12), and once more after the last, before they are
// compared.
#include <cstdlib>
#include <iostream>
#include <string>

#include <weft.h>

using namespace weft;

int main(int argc, char** argv) {
  parallel::InitOptions options;  // init_method "env://"
  bool uneven = false, local_sgd = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--world-size" && i + 1 < argc) options.world_size = std::atoi(argv[++i]);
    else if (flag == "--rank" && i + 1 < argc) options.rank = std::atoi(argv[++i]);
    else if (flag == "--uneven") uneven = true;
    else if (flag == "--local-sgd") local_sgd = true;
  }
  if (options.rank >= 0) {  // started by hand: say where rank 0 serves the rendezvous
    ::setenv("RANK", std::to_string(options.rank).c_str(), 0);
    ::setenv("WORLD_SIZE", std::to_string(options.world_size).c_str(), 0);
  }
  ::setenv("MASTER_ADDR", "127.0.0.1", 0);  // as a PyTorch script does (0: a launcher's value wins)
  ::setenv("MASTER_PORT", "8889", 0);
  try {
    parallel::init_process_group("gloo", options);
    const int rank = parallel::get_rank(), world = parallel::get_world_size();
    Tensor t = full({4}, static_cast<double>(rank + 1));
    parallel::default_group().all_reduce(t)->wait();  // 1 + 2 + ... + world in every element
    std::cout << "rank " << rank << " of " << world << ": all_reduce gives " << t.to_vector<float>()[0] << std::endl;
    if (t.to_vector<float>()[0] != world * (world + 1) / 2) return 1;

    // The training, on learnable synthetic images (a pattern per class plus noise).
    const int64_t samples = uneven ? 121 : 120;
    Generator pattern(1234), noise(5);
    Tensor prototypes = randn({10, 1, 28, 28}, DType::Float32, &pattern);
    Tensor labels = randint(0, 10, {samples}, DType::Int64, &noise);
    Tensor images = add(index_select(prototypes, 0, labels), randn({samples, 1, 28, 28}, DType::Float32, &noise));
    auto train_set = std::make_shared<data::TensorDataset>(images, labels);
    auto model = std::make_shared<nn::ConvNet>();
    auto ddp = std::make_shared<parallel::DistributedDataParallel>(model);
    std::shared_ptr<optim::Optimizer> optimizer =  // the rate scales with the ranks
        std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions{0.01 * world, 0.9});
    if (local_sgd) {
      ddp->register_comm_hook(parallel::post_localsgd_hook(std::make_shared<parallel::PostLocalSGDState>(
          parallel::PostLocalSGDOptions{.start_iteration = 4, .post_local_gradient_allreduce = false})));
      optimizer = std::make_shared<parallel::PostLocalSGDOptimizer>(
          optimizer, std::make_shared<parallel::PeriodicModelAverager>(/*period=*/4, /*warmup_steps=*/4));
    }
    optim::Optimizer& sgd = *optimizer;
    std::shared_ptr<data::Sampler> sampler;
    if (uneven)
      sampler = std::make_shared<data::DistributedEvalSampler>(train_set->size(), world, rank,
                                                               data::EvalShard::Strided, /*shuffle=*/true);
    else
      sampler = std::make_shared<data::DistributedSampler>(train_set->size(), world, rank);
    data::DataLoader loader(train_set, {.batch_size = 10}, sampler);
    double first = 0, last = 0;
    int64_t batches = 0;
    for (int epoch = 0; epoch < 3; ++epoch) {
      loader.set_epoch(epoch);
      // With uneven shares, a rank that runs out shadows the others' collectives until every
      // rank has (without the join, the others' next all-reduce would wait for it in vain).
      ddp->join([&] {
        for (const data::Batch& batch : loader) {
          sgd.zero_grad();
          Tensor loss = cross_entropy((*ddp)(batch.data), batch.target);
          loss.backward();
          sgd.step();
          last = loss.item();
          if (first == 0) first = last;
          ++batches;
        }
      }, {.enable = uneven});
    }
    if (uneven) std::cout << "rank " << rank << ": " << batches << " batches in 3 epochs" << std::endl;
    // Every replica took the same steps: rank 0's weights, broadcast, equal this rank's.
    auto same_as_rank_0 = [&] {
      Tensor mine = model->parameters()[0].detach().clone(), zeroth = mine.clone();
      parallel::default_group().broadcast(zeroth, 0)->wait();
      return sum(abs(sub(mine, zeroth))).item() == 0.0;
    };
    if (local_sgd) {  // three local steps since the last average: apart, until averaged
      const bool equal = same_as_rank_0();  // a collective: every rank calls it
      if (rank > 0)
        std::cout << "rank " << rank << ": local SGD: " << (equal ? "equal to" : "apart from")
                  << " rank 0's replica after the last step" << std::endl;
      parallel::average_parameters(model->parameters(), parallel::default_group());
    }
    const bool same = same_as_rank_0();
    std::cout << "rank " << rank << ": DDP loss " << first << " -> " << last << (same ? ", replicas equal" : ", replicas DIFFER")
              << std::endl;
    parallel::destroy_process_group();
    return same && last < first ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "handwritten_ddp_program: " << e.what() << "\n";
    return 1;
  }
}
