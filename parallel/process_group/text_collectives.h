// Text between the ranks of a group (PyTorch's all_gather_object, for strings): what the
// parallel layer exchanges when it checks that every rank agrees (DDP's model, ZeRO's
// parameters) or sends a description ahead of the tensors it describes (ZeRO's state).
//
// The text travels as uint8 tensors on `device` (the nccl backend takes CUDA tensors only),
// padded to the longest rank's: two collectives, whatever the sizes.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "parallel/process_group/process_group.h"

namespace weft::parallel {

// Every rank's `text`, in rank order (a collective: every rank of the group calls it). The
// text must not contain NUL bytes.
std::vector<std::string> all_gather_text(ProcessGroup& group, const std::string& text, Device device);

// Compares every rank's lines with rank 0's (a collective): nullopt when all are equal,
// else the first difference, as "on rank 0, <line>; on rank r, <line>" ("there is nothing
// more" where one list ends first).
std::optional<std::string> first_difference_across_ranks(ProcessGroup& group, const std::vector<std::string>& lines,
                                                         Device device);

}  // namespace weft::parallel
