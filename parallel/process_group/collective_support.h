// What the process-group backends share: argument checks with messages that name the
// operation, staging of non-contiguous tensors, and lists of tensors as one flat buffer.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/process_group/process_group.h"

namespace weft::parallel::detail {

// `r` is a rank of a group of `size` (`name` is "root", "dst" or "src").
void check_rank(int r, int size, const char* name, const std::string& what);
// Bool reduces with max or min only; avg needs a floating dtype (float16 and bfloat16 too).
void check_reduce(DType dtype, ReduceOp op, const std::string& what);
// `count` defined tensors on like's device, each of like's shape and dtype.
void check_list(const std::vector<Tensor>& list, size_t count, const Tensor& like, const char* name,
                const std::string& what);

// t <- t / divisor, in place (an average's last step); float16 and bfloat16 are divided in
// float32 and rounded once.
void divide_in_place(const Tensor& t, double divisor);

// The tensors one after the other in one contiguous 1-d tensor (on their device).
Tensor flatten(const std::vector<Tensor>& tensors);
// flat holds the tensors one after the other: copies each piece into its tensor.
void unflatten_into(const Tensor& flat, const std::vector<Tensor>& outputs);

// A contiguous tensor with `t`'s values that a library may read and write: `t` itself when
// it is contiguous, else a copy, written back by finish().
class Staged {
 public:
  explicit Staged(const Tensor& t);
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data_.raw_data());
  }
  size_t count() const { return static_cast<size_t>(data_.numel()); }
  const Tensor& tensor() const { return data_; }
  void finish() const;

 private:
  Tensor original_;
  Tensor data_;
};

}  // namespace weft::parallel::detail
