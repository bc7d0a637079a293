// Host values that every rank of a group must hold alike (options, counts, sizes), checked in
// one collective: each value's smallest and largest over the ranks come from one all-reduce
// (max) of the values and their negatives, so a check costs 2n doubles whatever the group's
// size, and every rank learns of any difference, not only the ranks that differ: a rank that
// agreed would otherwise wait in its next collective for one that failed.
//
// Values are doubles: counts and sizes up to 2^53 are exact. For text (a model's parameter
// names and shapes), see text_collectives.h.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "parallel/process_group/process_group.h"

namespace weft::parallel {

// A value and the name an error calls it by.
struct NamedValue {
  std::string name;
  double value = 0;
};

// Each value's range over the ranks of `group`.
struct ValueRange {
  double low = 0, high = 0;
  bool agreed() const { return low == high; }
};

// The ranges of `values` over the ranks of `group` (a collective: every rank gives as many
// values, in the same order). `device` carries them (the nccl backend takes CUDA tensors only).
std::vector<ValueRange> value_ranges(ProcessGroup& group, const std::vector<double>& values, Device device);

// nullopt when every rank of `group` holds the same values; else the first that differs, as
// "NAME = V here, from LOW to HIGH over the group's N ranks". A collective, and every rank
// gets the answer.
std::optional<std::string> first_disagreement(ProcessGroup& group, const std::vector<NamedValue>& values,
                                              Device device);

}  // namespace weft::parallel
