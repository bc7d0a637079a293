// The workers' side of an elastic job (weft-run --nnodes MIN:MAX --rdzv-endpoint ...,
// apps/elastic_agent.h): what the agent told this worker, which checkpoint a worker resumes
// from, and the TrainLoop callback that ends a round at a checkpoint so that waiting nodes
// can join.
//
// Resuming. The agents start the workers again, with the same command line, after a worker
// fails and whenever the membership changes. A restarted worker must go on from the job's
// newest checkpoint, not from the beginning, and not from whatever --resume named when the
// job was first started: every worker of such a job has WEFT_ELASTIC=1 and resumes from its
// --checkpoint file when that exists. The file is replaced atomically (core/atomic_file.h),
// so it is always the newest complete checkpoint, mid-epoch ones included
// (train/train_loop.h); the world size may differ from the run that wrote it
// (DistributedSampler re-shards the rest of the epoch, data/sampler.h). Every rank must see
// the same file: rank 0 writes it, so on several machines it must be on shared storage.
//
// Admitting nodes.
// A node that arrives while a round runs cannot join it: the ranks, the process group and
// the data shards are fixed for the round. The agents could stop the workers at once (what
// they do for programs that do not say otherwise), but the steps since the last checkpoint
// would be lost. ElasticAdmission marks the round as one whose workers admit nodes at
// checkpoints; then at every checkpoint point rank 0 asks the rendezvous whether nodes
// wait (and the job is below its maximum), and, if so, ends the round there and tells the
// other ranks (one all-reduce of the answer, so that every rank stops at the same step).
// The loop stops right after the checkpoint; the workers exit 0; the agents see the
// round's end, and the next round resumes from that checkpoint with the new nodes. Make it
// early (weft-train does so before loading data): until the mark is set, a node that
// arrives makes the agents stop the workers at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "parallel/launch/elastic_rendezvous.h"
#include "train/train_loop.h"

namespace weft::train {

// The variables weft-run's elastic agents give their workers.
struct ElasticEnv {
  std::string run_id;      // WEFT_RUN_ID: the job (--rdzv-id)
  int64_t round = 0;       // WEFT_ROUND
  int num_nodes = 1;       // GROUP_WORLD_SIZE: nodes in this round
  int min_nodes = 1;       // WEFT_MIN_NODES
  int max_nodes = 1;       // WEFT_MAX_NODES
  int restart_count = 0;   // WEFT_RESTART_COUNT: rounds ended by a failure before this one
  std::string store_host;  // MASTER_ADDR, MASTER_PORT: the rendezvous store
  int store_port = 0;
};

// WEFT_ELASTIC's value (null: unset): "1" is an elastic worker; unset, "" and "0" are not;
// anything else is refused with a message.
bool elastic_from_env(const char* value);

// The agent's variables: nullopt unless WEFT_ELASTIC=1 and WEFT_RUN_ID is set (a worker
// started by hand with WEFT_ELASTIC=1 resumes as one, but has no rendezvous to talk to);
// then every variable must be there (the error names the missing one).
std::optional<ElasticEnv> read_elastic_env();

struct ResumeChoice {
  std::string path;        // the checkpoint to resume from; empty: start from the beginning
  bool automatic = false;  // chosen by the elastic rule: the job is elastic and its checkpoint exists
};

// checkpoint: where the run writes its checkpoints ("" none); resume: the one asked for
// ("" none). Not elastic: `resume`, as given. Elastic: a checkpoint path is required (a
// restarted worker would otherwise start over); `resume`, when given, must be that same
// path (another would take every restart back to it); the checkpoint is resumed from when
// it exists, else the run starts from the beginning.
ResumeChoice choose_resume(bool elastic, const std::string& checkpoint, const std::string& resume);

class ElasticAdmission final : public Callback {
 public:
  // `rank`: this worker's rank in the round's group; rank 0 talks to the rendezvous.
  ElasticAdmission(const ElasticEnv& env, int rank);

  void on_checkpoint(TrainLoop& loop) override;
  // Whether this callback stopped the loop to admit waiting nodes.
  bool admitting() const { return admitting_; }

 private:
  ElasticEnv env_;
  int rank_;
  std::unique_ptr<parallel::ElasticJob> job_;  // rank 0 only
  bool admitting_ = false;
};

}  // namespace weft::train
