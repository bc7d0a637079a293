// train_throughput: weft-train against PyTorch on the same model, data and settings.
//
// Runs `weft-train` (next to this executable, in apps/) and
// bench/reference/train_convnet.py with the same arguments, reads both metrics files
// and prints images/s of each, their ratio, and each side's test accuracy as the
// correctness check of the same run.
//
//   train_throughput [--model convnet] [--batch-size 128] [--epochs 1] [--device cpu]
//                    [--threads N] [--data-dir DIR] [--json FILE]
#include <cstring>
#include <iomanip>
#include <iostream>
#include <map>
#include <string>

#include "bench_util.h"

int main(int argc, char** argv) {
  std::string model = "convnet", device = "cpu", json_path, batch = "128", epochs = "1", threads;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "train_throughput: " << argv[i] << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    std::string a = argv[i];
    if (a == "--model") model = next();
    else if (a == "--device") device = next();
    else if (a == "--batch-size") batch = next();
    else if (a == "--epochs") epochs = next();
    else if (a == "--threads") threads = next();
    else if (a == "--json") json_path = next();
    else if (a == "--data-dir") data_dir = next();
    else {
      const bool help = a == "--help" || a == "-h";
      (help ? std::cout : std::cerr) << "usage: train_throughput [--model M] [--batch-size N] [--epochs N] "
                                        "[--device D] [--threads N] [--data-dir DIR] [--json FILE]\n";
      return help ? 0 : 2;
    }
  }
  std::string self = argv[0];
  std::string build = self.substr(0, self.find_last_of('/') + 1) + "../";
  std::string common = "--model " + model + " --batch-size " + batch + " --epochs " + epochs +
                       " --device " + device + " --data-dir " + data_dir + " --optimizer sgd --lr 0.01 --momentum 0.9 --seed 0";
  std::string pid = std::to_string(::getpid());
  std::string weft_json = "/tmp/weft_throughput_" + pid + ".json";
  std::string env = threads.empty() ? "" : "OMP_NUM_THREADS=" + threads + " ";
  std::string weft_cmd = env + build + "apps/weft-train " + common + " --no-progress --metrics-json " + weft_json +
                         " > /dev/null";
  std::cout << "# train_throughput: " << model << ", batch " << batch << ", " << epochs << " epoch(s) of Fashion-MNIST, "
            << device << (threads.empty() ? "" : ", " + threads + " threads") << "\n";
  if (std::system(weft_cmd.c_str()) != 0) {
    std::cerr << "train_throughput: weft-train failed: " << weft_cmd << "\n";
    return 1;
  }
  std::map<std::string, double> weft = weft::bench::read_flat_json(weft_json);
  std::map<std::string, double> torch =
      weft::bench::run_reference("train_convnet.py", common + (threads.empty() ? "" : " --threads " + threads));

  std::cout << "# framework   images/s   test_accuracy\n";
  std::cout << std::fixed << "weft       " << std::setw(11) << std::setprecision(0) << weft["images_per_second"]
            << std::setw(16) << std::setprecision(4) << weft["test_accuracy"] << "\n";
  if (torch.empty()) {
    std::cout << "pytorch            n/a             n/a   (no python3 can import torch: tools/install-deps --bench)\n";
  } else {
    std::cout << "pytorch    " << std::setw(11) << std::setprecision(0) << torch["images_per_second"] << std::setw(16)
              << std::setprecision(4) << torch["test_accuracy"] << "\n";
    std::cout << "# ratio weft / pytorch: " << std::setprecision(2)
              << weft["images_per_second"] / torch["images_per_second"] << "x\n";
  }
  if (!json_path.empty()) {
    weft::bench::JsonWriter json;
    json.add("benchmark", std::string("train_throughput"));
    json.add("model", model);
    json.add("device", device);
    json.add("weft_images_per_second", weft["images_per_second"]);
    json.add("weft_test_accuracy", weft["test_accuracy"]);
    if (!torch.empty()) {
      json.add("pytorch_images_per_second", torch["images_per_second"]);
      json.add("pytorch_test_accuracy", torch["test_accuracy"]);
      json.add("ratio", weft["images_per_second"] / torch["images_per_second"]);
    }
    if (!json.write(json_path)) return 1;
  }
  return 0;
}
