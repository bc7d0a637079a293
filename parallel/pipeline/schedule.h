// Pipeline schedules as data: per rank (a device, or a process), the list of actions it
// performs in order (torch.distributed.pipelining's _Action lists).
//
// A pipeline of S stages runs micro-batches 0..m-1 through them. Stage s lives on rank
// s % R (R ranks; S = v * R with v virtual stages per rank for the interleaved schedule,
// else S = R). An action is one of
//
//   F    forward of micro-batch i on stage s             "2F5"       (stage, kind, micro-batch)
//   B    backward of micro-batch i on stage s            "2B5"
//   SEND_F / RECV_F  stage s's output of micro-batch i to / from the next / previous stage
//   SEND_B / RECV_B  the gradient of stage s's input / output to the previous / from the next
//
// as torch names them. Built in: GPipe (every forward, then every backward), 1F1B
// (PipeDream-Flush: a warm-up of forwards, then one forward and one backward in turn, which
// keeps at most R - r micro-batches' activations on rank r) and interleaved 1F1B (Megatron's:
// v stages per rank, bubble divided by v; m must be a multiple of R).
//
// validate() checks any schedule (built in or a user's) before it runs, and rejects it
// naming the first offending action: actions on the wrong rank or out of range, a forward
// or backward missing or repeated, a backward before its forward, a computation before the
// receive of its input, a send before what it sends is computed, a send without its receive
// (or a receive without its send), and a cyclic wait. The replay behind the last check
// treats sends as PyTorch's isend (they do not wait) and receives as blocking (they wait
// for their send).
//
// table() shows a schedule as one row per rank and one column per time step, with forward
// and backward taking one step each and communication none: what each rank does when, and
// its bubble (the idle cells). With one stage per rank cells say "F3", else "5F3".
#pragma once

#include <string>
#include <vector>

namespace weft::parallel::pipeline {

enum class ActionKind { Forward, Backward, SendForward, RecvForward, SendBackward, RecvBackward };

struct Action {
  ActionKind kind;
  int stage;
  int micro_batch;

  bool operator==(const Action&) const = default;
  bool is_computation() const { return kind == ActionKind::Forward || kind == ActionKind::Backward; }
  // "2F5", "2SEND_F5", ...
  std::string str() const;
};

struct Schedule {
  std::string name;
  int num_stages = 0;
  int num_micro_batches = 0;
  // actions[r]: what rank r does, in order. The number of ranks is actions.size().
  std::vector<std::vector<Action>> actions;

  int num_ranks() const { return static_cast<int>(actions.size()); }
  int rank_of(int stage) const { return stage % num_ranks(); }
  // The time-step table (see above); throws what validate() throws for an invalid schedule.
  std::string table() const;
};

// S stages, one per rank, m micro-batches.
Schedule gpipe(int stages, int micro_batches);
Schedule one_f_one_b(int stages, int micro_batches);
// R ranks with v stages each (stage s on rank s % R); m must be a multiple of R.
Schedule interleaved_one_f_one_b(int ranks, int virtual_stages, int micro_batches);
// By name: "gpipe", "1f1b", "interleaved" (virtual_stages > 1 only for "interleaved").
Schedule make_schedule(const std::string& name, int ranks, int micro_batches, int virtual_stages = 1);
// The micro-batches the built-in schedule `name` runs a batch of `batch` samples in:
// micro_batches, or for a batch with fewer samples (an epoch's short last batch) one sample
// per micro-batch; under "interleaved", whose micro-batches are a multiple of the ranks, the
// largest multiple of `ranks` that the batch fills (an error names a batch smaller than the ranks).
int micro_batches_for_batch(const std::string& name, int ranks, int micro_batches, int64_t batch);

// Adds the sends and receives a list of computations implies: RECV_F before each forward
// of a stage > 0, SEND_F after each forward of a stage < S - 1, RECV_B before each backward
// of a stage < S - 1, SEND_B after each backward of a stage > 0.
std::vector<Action> with_communication(const std::vector<Action>& computations, int num_stages);

// Throws weft::Error naming the first offending action (see above).
void validate(const Schedule& schedule);

// Per rank, the number of time steps it computes and the number it is idle in table()'s
// timeline up to the last step: bubble = idle / (idle + busy), for the theory's comparison.
struct Timeline {
  int steps = 0;                  // columns of the table
  std::vector<int> busy;          // per rank
  double bubble_fraction() const; // idle cells over all cells, all ranks
};
Timeline timeline(const Schedule& schedule);

}  // namespace weft::parallel::pipeline
