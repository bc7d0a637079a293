// Dataset's default batching, TensorDataset and the Fashion-MNIST loader.
#include "data/dataset.h"

#include <filesystem>

#include "core/autograd.h"
#include "core/error.h"
#include "data/idx.h"
#include "kernels/cpu/parallel.h"
#include "kernels/index_ops.h"
#include "kernels/shape_ops.h"

namespace weft::data {

void Dataset::check_index(int64_t index, const char* who) const {
  int64_t n = size();
  WEFT_CHECK(index >= 0 && index < n, who, ": index ", index, " is out of range for a dataset of ", n, " samples",
             n > 0 ? " (valid: 0 to " + std::to_string(n - 1) + ")" : std::string());
}

Batch Dataset::get_batch(const std::vector<int64_t>& indices) const {
  WEFT_CHECK(!indices.empty(), "Dataset::get_batch: the index list is empty (a batch needs at least one sample)");
  std::vector<Tensor> data, targets;
  data.reserve(indices.size());
  targets.reserve(indices.size());
  bool labelled = false;
  for (size_t k = 0; k < indices.size(); ++k) {
    check_index(indices[k], "Dataset::get_batch");
    Example example = get(indices[k]);
    WEFT_CHECK(example.data.defined(), "Dataset::get_batch: get(", indices[k], ") returned an undefined data tensor");
    if (k == 0) labelled = example.target.defined();
    WEFT_CHECK(example.target.defined() == labelled, "Dataset::get_batch: get(", indices[k], ") returned ",
               labelled ? "no" : "a", " target, unlike get(", indices[0],
               ") (targets must be all defined or all undefined)");
    data.push_back(std::move(example.data));
    if (labelled) targets.push_back(std::move(example.target));
  }
  Batch batch;
  batch.data = stack(data);
  if (labelled) batch.target = stack(targets);
  return batch;
}

// --- TensorDataset -------------------------------------------------------------------

TensorDataset::TensorDataset(Tensor data, Tensor targets) {
  WEFT_CHECK(data.defined(), "TensorDataset: the data tensor is undefined");
  WEFT_CHECK(data.dim() >= 1, "TensorDataset: data must have at least one dim (the sample dim), got a 0-d tensor");
  if (targets.defined()) {
    WEFT_CHECK(targets.dim() >= 1,
               "TensorDataset: targets must have at least one dim (the sample dim), got a 0-d tensor");
    WEFT_CHECK(targets.size(0) == data.size(0), "TensorDataset: data and targets must have the same first dim (one row ",
               "per sample), got data ", data.shape(), " and targets ", targets.shape());
    targets_ = targets.detach();
  }
  data_ = data.detach();
}

Example TensorDataset::get(int64_t index) const {
  check_index(index, "TensorDataset::get");
  return {data_.select(0, index), targets_.defined() ? targets_.select(0, index) : Tensor()};
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  WEFT_CHECK(!indices.empty(), "TensorDataset::get_batch: the index list is empty (a batch needs at least one sample)");
  for (int64_t index : indices) check_index(index, "TensorDataset::get_batch");
  NoGradGuard no_grad;
  Tensor index = tensor(indices, Shape{static_cast<int64_t>(indices.size())},
                        TensorOptions(DType::Int64, data_.device()));
  Batch batch;
  batch.data = index_select(data_, 0, index);
  if (targets_.defined()) batch.target = index_select(targets_, 0, index.to(targets_.device()));
  return batch;
}

// --- FashionMNIST --------------------------------------------------------------------

namespace {

constexpr const char* kInstallHint =
    "install the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist) or pass the directory "
    "that holds the four IDX files";

// The unpacked file when present, else the gzip'd one.
std::string find_idx_file(const std::filesystem::path& root, const std::string& name) {
  std::filesystem::path plain = root / name;
  std::filesystem::path gz = root / (name + ".gz");
  if (std::filesystem::is_regular_file(plain)) return plain.string();
  if (std::filesystem::is_regular_file(gz)) return gz.string();
  WEFT_FAIL("FashionMNIST: neither '", plain.string(), "' nor '", gz.string(), "' exists; ", kInstallHint);
}

std::pair<Tensor, Tensor> load_fashion_mnist(const std::string& root, bool train, bool normalize) {
  std::filesystem::path dir(root);
  WEFT_CHECK(!std::filesystem::exists(dir) || std::filesystem::is_directory(dir), "FashionMNIST: '", root,
             "' is not a directory (give the directory that holds train-images-idx3-ubyte.gz, ...)");
  WEFT_CHECK(std::filesystem::is_directory(dir), "FashionMNIST: the directory '", root, "' does not exist; ",
             kInstallHint, " (train-images-idx3-ubyte.gz, ...)");
  std::string prefix = train ? "train" : "t10k";
  std::string images_path = find_idx_file(dir, prefix + "-images-idx3-ubyte");
  std::string labels_path = find_idx_file(dir, prefix + "-labels-idx1-ubyte");
  Tensor images = read_idx(images_path);
  Tensor labels = read_idx(labels_path);

  WEFT_CHECK(images.dtype() == DType::UInt8 && images.dim() == 3 && images.size(1) == 28 && images.size(2) == 28,
             "FashionMNIST: '", images_path, "' holds ", images.dtype(), " ", images.shape(),
             ", expected uint8 [N, 28, 28]");
  WEFT_CHECK(labels.dtype() == DType::UInt8 && labels.dim() == 1, "FashionMNIST: '", labels_path, "' holds ",
             labels.dtype(), " ", labels.shape(), ", expected uint8 [N]");
  WEFT_CHECK(labels.size(0) == images.size(0), "FashionMNIST: '", images_path, "' has ", images.size(0),
             " images but '", labels_path, "' has ", labels.size(0), " labels");

  const int64_t n = images.size(0);
  const uint8_t* pixels = images.data_ptr<uint8_t>();
  Tensor data = empty({n, 1, 28, 28}, DType::Float32);
  float* out = data.data_ptr<float>();
  // Float32 throughout, in torchvision's order (divide, subtract, divide), so that the
  // values equal ToTensor() + Normalize() bit for bit.
  cpu::parallel_for(0, data.numel(), cpu::kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float x = static_cast<float>(pixels[i]) / 255.0f;
      out[i] = normalize ? (x - kFashionMnistMean) / kFashionMnistStd : x;
    }
  });

  const uint8_t* label = labels.data_ptr<uint8_t>();
  Tensor targets = empty({n}, DType::Int64);
  int64_t* target = targets.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    WEFT_CHECK(label[i] <= 9, "FashionMNIST: '", labels_path, "': label ", int(label[i]), " of sample ", i,
               " is not a class in 0 to 9");
    target[i] = label[i];
  }
  return {data, targets};
}

}  // namespace

FashionMNIST::FashionMNIST(const std::string& root, bool train, bool normalize)
    : FashionMNIST(load_fashion_mnist(root, train, normalize)) {}

FashionMNIST::FashionMNIST(std::pair<Tensor, Tensor> loaded)
    : TensorDataset(std::move(loaded.first), std::move(loaded.second)) {}

const std::vector<std::string>& FashionMNIST::classes() {
  static const std::vector<std::string> names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                 "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

}  // namespace weft::data
