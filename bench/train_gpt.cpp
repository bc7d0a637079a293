// train_gpt: weft's GPT training throughput beside PyTorch's on the same model, data and optimizer.
//
// Trains nn::GPT (nn/models/gpt.h) on the bytes of a text corpus (data/text_dataset.h: the
// fortunes by default; non-overlapping windows of block_size + 1 bytes from the first 90%, in a
// shuffled order per epoch) with AdamW over nanoGPT's two groups (weight decay 0.1 on matrices
// and embeddings, betas (0.9, 0.95), a constant lr), one optimizer step per batch, then runs
// bench/reference/gpt.py `train` with the same flags (the same GPT in PyTorch, the same corpus
// read the same way) and prints both:
//
//   tokens/s      B * T * (steps - warmup) / the time of those steps (the first --warmup steps
//                 are left out: allocator growth, OpenMP start-up, cuBLAS handles)
//   step (ms)     the median step, batch upload to loss.item() (which waits for the device)
//   GFLOP/s       tokens/s * (6 N + 12 L T C) FLOP per token, nanoGPT's estimate of a training
//                 step's matrix products (N parameters, L layers, T block, C width): the work
//                 against which a CPU's or GPU's peak is the floor on the step time
//   loss          the first and the last step's: both fall from ln 256 = 5.55 within tens of
//                 steps, the same-run check that the step computes what it should (the equality
//                 of the two GPTs is tests/nn/test_gpt.cpp's gpt_pytorch_equivalence)
//
// Defaults: on the CPU n_layer 4, n_head 4, n_embd 128, block 64, batch 32, 50 steps; on CUDA
// GPT-2 small's shape (12 layers, 12 heads, n_embd 768, block 1024; vocabulary 256 bytes, so
// 86M parameters) at batch 8, 30 steps. float32 on both.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/device.h"
#include "core/generator.h"
#include "core/stream.h"
#include "data/text_dataset.h"
#include "kernels/cpu/threads.h"
#include "kernels/random.h"
#include "nn/models/gpt.h"
#include "nn/optim/adam.h"
#include "nn/optim/param_group.h"

using namespace weft;

namespace {

struct Options {
  std::string device = "cpu", data = data::kDefaultTextCorpus, json;
  int64_t n_layer = 0, n_head = 0, n_embd = 0, block_size = 0, batch_size = 0, steps = 0;  // 0: the device's
  int64_t warmup = 5, seed = 0;
  double lr = 1e-3;
  int threads = 0;  // 0: weft's default (OMP_NUM_THREADS or the cores), passed to PyTorch too
  bool reference = true;
};

struct Run {
  int64_t parameters = 0;
  double tokens_per_second = 0, median_step_ms = 0, first_loss = NAN, final_loss = NAN;
};

int usage(std::ostream& to, int status) {
  to << "usage: train_gpt [--device cpu|cuda] [--n-layer N] [--n-head N] [--n-embd N] [--block-size N]\n"
        "                 [--batch-size N] [--steps N] [--warmup N] [--lr X] [--seed N] [--threads N]\n"
        "                 [--data PATH] [--no-reference] [--json FILE]\n"
        "  Trains weft's GPT on a text corpus (bytes) with AdamW and reports tokens/s, then the same\n"
        "  with PyTorch (bench/reference/gpt.py train).\n"
        "  --device       cpu (default) or cuda\n"
        "  --n-layer ... --batch-size  the model and batch (CPU: 4 4 128, block 64, batch 32; CUDA:\n"
        "                 GPT-2 small's 12 12 768, block 1024, batch 8)\n"
        "  --steps N      optimizer steps (CPU 50, CUDA 30); --warmup N of them are not timed (5)\n"
        "  --lr X         AdamW's learning rate, constant (1e-3)\n"
        "  --threads N    CPU threads, for weft and PyTorch (default: weft's, from OMP_NUM_THREADS or the cores)\n"
        "  --data PATH    a text file or a folder of text files (default " << data::kDefaultTextCorpus << ")\n"
        "  --no-reference do not run PyTorch\n"
        "  --json FILE    also write the figures as flat JSON (weft_*, pytorch_*)\n"
        "  Exit status: 0 done and checked, 1 a failed op or a non-finite or non-falling loss, 2 bad arguments\n"
        "  (a model or corpus that cannot be), 77 --device cuda without a CUDA GPU, or no default corpus\n"
        "  (apt-get install fortunes).\n";
  return status;
}

// Trains for o.steps steps and times those after o.warmup.
Run train(const Options& o, const nn::GPTConfig& config, const data::TextDataset& windows, Device device) {
  Generator gen(static_cast<uint64_t>(o.seed));
  nn::GPT model(config, TensorOptions(DType::Float32, device), &gen);
  optim::AdamW opt(optim::weight_decay_groups(model, 0.1), optim::AdamWOptions(o.lr, {0.9, 0.95}));
  const int64_t B = o.batch_size, n = windows.size();
  std::vector<int64_t> order;
  size_t cursor = 0;
  std::vector<double> step_seconds;
  Run run;
  run.parameters = model.num_parameters();
  for (int64_t step = 0; step < o.steps; ++step) {
    if (cursor + B > order.size()) order = randperm(n, DType::Int64, &gen).to_vector<int64_t>(), cursor = 0;
    const auto first = order.begin() + static_cast<std::ptrdiff_t>(cursor);
    const data::Batch batch = windows.get_batch(std::vector<int64_t>(first, first + B));
    cursor += B;
    const auto start = std::chrono::steady_clock::now();
    const Tensor x = batch.data.to(device), y = batch.target.to(device);
    opt.zero_grad();
    Tensor loss = nn::next_token_loss(model(x), y);
    loss.backward();
    opt.step();
    const double value = loss.item();  // waits for the device: the step's time is its own
    step_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (step == 0) run.first_loss = value;
    run.final_loss = value;
  }
  std::vector<double> timed(step_seconds.begin() + std::min<int64_t>(o.warmup, o.steps - 1), step_seconds.end());
  double seconds = 0;
  for (double s : timed) seconds += s;
  run.tokens_per_second = static_cast<double>(timed.size() * B * config.block_size) / seconds;
  run.median_step_ms = bench::median(timed) * 1e3;
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) try {
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "train_gpt: " << argv[i] << " needs a value\n";
        std::exit(usage(std::cerr, 2));
      }
      return argv[++i];
    };
    const std::string a = argv[i];
    if (a == "--device") o.device = next();
    else if (a == "--n-layer") o.n_layer = std::stoll(next());
    else if (a == "--n-head") o.n_head = std::stoll(next());
    else if (a == "--n-embd") o.n_embd = std::stoll(next());
    else if (a == "--block-size") o.block_size = std::stoll(next());
    else if (a == "--batch-size") o.batch_size = std::stoll(next());
    else if (a == "--steps") o.steps = std::stoll(next());
    else if (a == "--warmup") o.warmup = std::stoll(next());
    else if (a == "--lr") o.lr = std::stod(next());
    else if (a == "--seed") o.seed = std::stoll(next());
    else if (a == "--threads") o.threads = std::stoi(next());
    else if (a == "--data") o.data = next();
    else if (a == "--no-reference") o.reference = false;
    else if (a == "--json") o.json = next();
    else if (a == "--help" || a == "-h") return usage(std::cout, 0);
    else return usage(std::cerr, 2);
  } catch (const std::exception&) {  // std::stoll / std::stod
    std::cerr << "train_gpt: " << argv[i - 1] << " takes a number, got '" << argv[i] << "'\n";
    return usage(std::cerr, 2);
  }
  if (o.device != "cpu" && o.device != "cuda") return usage(std::cerr, 2);
  const bool cuda = o.device == "cuda";
  if (cuda && !cuda_available()) {
    std::cout << "train_gpt: --device cuda, but " << cuda_unavailable_reason() << "\n";
    return 77;
  }
  auto or_default = [](int64_t& v, int64_t d) { v = v > 0 ? v : d; };
  or_default(o.n_layer, cuda ? 12 : 4);
  or_default(o.n_head, cuda ? 12 : 4);
  or_default(o.n_embd, cuda ? 768 : 128);
  or_default(o.block_size, cuda ? 1024 : 64);
  or_default(o.batch_size, cuda ? 8 : 32);
  or_default(o.steps, cuda ? 30 : 50);
  if (o.warmup < 0 || o.threads < 0 || !(o.lr > 0)) return usage(std::cerr, 2);
  if (o.data == data::kDefaultTextCorpus && !std::filesystem::exists(o.data)) {
    std::cout << "train_gpt: no corpus at " << o.data << " (the Debian package fortunes: apt-get install fortunes)\n";
    return 77;
  }
  if (o.threads > 0) set_num_threads(o.threads);
  const int threads = num_threads();
  const nn::GPTConfig config{.vocab_size = data::kTextVocabSize, .block_size = o.block_size, .n_layer = o.n_layer,
                             .n_head = o.n_head, .n_embd = o.n_embd};

  Run weft_run;
  int64_t corpus_bytes = 0;
  std::optional<data::TextDataset> windows;
  try {  // the model's shape and the corpus: what the arguments chose
    config.check();
    const data::TextCorpus corpus = data::TextCorpus::open(o.data);
    corpus_bytes = corpus.size();
    windows = corpus.split(data::Split::Train, o.block_size);
  } catch (const Error& e) {
    std::cerr << "train_gpt: " << e.what() << "\n";
    return 2;
  }
  if (windows->size() < o.batch_size) {
    std::cerr << "train_gpt: " << o.data << " has " << windows->size() << " training windows of " << o.block_size + 1
              << " bytes, fewer than a batch of " << o.batch_size << "\n";
    return 2;
  }
  try {
    weft_run = train(o, config, *windows, cuda ? Device::cuda(0) : kCPU);
  } catch (const Error& e) {
    std::cerr << "train_gpt: training failed: " << e.what() << "\n";
    return 1;
  }
  const int64_t parameters = weft_run.parameters;
  const double flops_per_token = 6.0 * static_cast<double>(parameters) +
                                 12.0 * static_cast<double>(o.n_layer * o.block_size * o.n_embd);

  std::map<std::string, double> torch;
  if (o.reference) {
    std::ostringstream args;
    args << "train --device " << o.device << " --n-layer " << o.n_layer << " --n-head " << o.n_head << " --n-embd "
         << o.n_embd << " --block-size " << o.block_size << " --batch-size " << o.batch_size << " --steps " << o.steps
         << " --warmup " << o.warmup << " --lr " << o.lr << " --seed " << o.seed << " --threads " << threads
         << " --data " << o.data;
    torch = bench::run_reference("gpt.py", args.str());
  }

  std::cout << "# train_gpt: GPT n_layer " << o.n_layer << ", n_head " << o.n_head << ", n_embd " << o.n_embd
            << ", block " << o.block_size << ", vocab 256 bytes (" << std::fixed << std::setprecision(2)
            << static_cast<double>(parameters) / 1e6 << "M parameters), batch " << o.batch_size << ", float32\n"
            << "# AdamW lr " << std::defaultfloat << o.lr << ", " << o.steps << " steps (" << o.warmup
            << " warm-up, not timed), " << o.device << ", " << threads << " CPU threads, corpus " << o.data << " ("
            << corpus_bytes << " bytes)\n"
            << "# " << std::setprecision(3) << flops_per_token / 1e6
            << " MFLOP per token (6 N + 12 L T C, nanoGPT's estimate)\n"
            << "# framework        tokens/s   step (ms)    GFLOP/s   loss first -> final\n";
  auto row = [&](const std::string& name, double tps, double step_ms, double first, double final_loss) {
    std::cout << std::left << std::setw(16) << name << std::right << std::fixed << std::setprecision(0)
              << std::setw(11) << tps << std::setprecision(1) << std::setw(12) << step_ms << std::setw(11)
              << tps * flops_per_token / 1e9 << std::setprecision(4) << "   " << first << " -> " << final_loss << "\n";
  };
  row("weft", weft_run.tokens_per_second, weft_run.median_step_ms, weft_run.first_loss, weft_run.final_loss);
  if (torch.empty()) {
    std::cout << "pytorch                n/a" << (o.reference ? "   (no python3 can import torch: tools/install-deps "
                                                              "--bench)\n"
                                                            : "   (--no-reference)\n");
  } else {
    row("pytorch", torch["tokens_per_second"], torch["median_step_ms"], torch["first_loss"], torch["final_loss"]);
    std::cout << "# ratio weft / pytorch: " << std::setprecision(2)
              << weft_run.tokens_per_second / torch["tokens_per_second"] << "x\n";
    if (torch["reference_blas"] == 1)
      std::cout << "# PyTorch's matrix products ran on the reference BLAS (Debian's libblas3, unoptimised);\n"
                   "# for an optimised one, install libopenblas0-openmp or run with\n"
                   "#   LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp\n";
  }
  std::cout << std::defaultfloat;

  // The same-run check: finite losses, and falling ones once there are steps enough to fall.
  const bool finite = std::isfinite(weft_run.first_loss) && std::isfinite(weft_run.final_loss);
  const bool fell = o.steps < 20 || weft_run.final_loss < weft_run.first_loss - 0.5;
  if (!finite || !fell)
    std::cout << "train_gpt: FAILED: weft's loss went from " << weft_run.first_loss << " to " << weft_run.final_loss
              << " in " << o.steps << " steps\n";

  if (!o.json.empty()) {
    bench::JsonWriter json;
    json.add("benchmark", std::string("train_gpt"));
    json.add("device", o.device);
    json.add("n_layer", static_cast<double>(o.n_layer));
    json.add("n_head", static_cast<double>(o.n_head));
    json.add("n_embd", static_cast<double>(o.n_embd));
    json.add("block_size", static_cast<double>(o.block_size));
    json.add("batch_size", static_cast<double>(o.batch_size));
    json.add("steps", static_cast<double>(o.steps));
    json.add("warmup", static_cast<double>(o.warmup));
    json.add("threads", static_cast<double>(threads));
    json.add("parameters", static_cast<double>(parameters));
    json.add("flops_per_token", flops_per_token);
    json.add("weft_tokens_per_second", weft_run.tokens_per_second);
    json.add("weft_median_step_ms", weft_run.median_step_ms);
    json.add("weft_first_loss", weft_run.first_loss);
    json.add("weft_final_loss", weft_run.final_loss);
    if (!torch.empty()) {
      json.add("pytorch_tokens_per_second", torch["tokens_per_second"]);
      json.add("pytorch_median_step_ms", torch["median_step_ms"]);
      json.add("pytorch_first_loss", torch["first_loss"]);
      json.add("pytorch_final_loss", torch["final_loss"]);
      json.add("pytorch_threads", torch["threads"]);
      json.add("pytorch_reference_blas", torch["reference_blas"]);
      json.add("ratio", weft_run.tokens_per_second / torch["tokens_per_second"]);
    }
    if (!json.write(o.json)) return 1;
  }
  return finite && fell ? 0 : 1;
}
