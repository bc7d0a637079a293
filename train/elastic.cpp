// The elastic worker's variables, its resume rule, and ElasticAdmission; see elastic.h.
#include "train/elastic.h"

#include <cstdlib>
#include <filesystem>
#include <limits>
#include <system_error>

#include "core/error.h"
#include "parallel/launch/launch_env.h"
#include "parallel/store/tcp_store.h"

namespace weft::train {

namespace {

std::string variable(const char* name) {
  const char* v = std::getenv(name);
  WEFT_CHECK(v != nullptr && *v != '\0', "elastic run (WEFT_ELASTIC=1): ", name,
             " is not set; weft-run's elastic agents set it for their workers");
  return v;
}

int integer(const char* name, int min, int max = std::numeric_limits<int>::max()) {
  const std::string text = variable(name);
  const std::optional<int> value = parallel::parse_int_in(text, min, max);
  WEFT_CHECK(value.has_value(), "elastic run: ", name, "='", text, "' is not an integer in [", min, ", ", max, "]");
  return *value;
}

// How long rank 0 waits for the rendezvous store to answer at a checkpoint.
constexpr std::chrono::seconds kStoreTimeout{30};

}  // namespace

bool elastic_from_env(const char* value) {
  if (value == nullptr) return false;
  const std::string text = value;
  WEFT_CHECK(text.empty() || text == "0" || text == "1", "WEFT_ELASTIC must be 1 (a worker of an elastic job) or 0, "
             "got '", text, "'");
  return text == "1";
}

std::optional<ElasticEnv> read_elastic_env() {
  if (!elastic_from_env(std::getenv("WEFT_ELASTIC")) || std::getenv("WEFT_RUN_ID") == nullptr) return std::nullopt;
  ElasticEnv e;
  e.run_id = variable("WEFT_RUN_ID");
  e.round = integer("WEFT_ROUND", 0);
  e.num_nodes = integer("GROUP_WORLD_SIZE", 1);
  e.min_nodes = integer("WEFT_MIN_NODES", 1);
  e.max_nodes = integer("WEFT_MAX_NODES", e.min_nodes);
  e.restart_count = integer("WEFT_RESTART_COUNT", 0);
  e.store_host = variable("MASTER_ADDR");
  e.store_port = integer("MASTER_PORT", 1, 65535);
  return e;
}

ResumeChoice choose_resume(bool elastic, const std::string& checkpoint, const std::string& resume) {
  if (!elastic) return {resume, false};
  WEFT_CHECK(!checkpoint.empty(), "WEFT_ELASTIC=1: a worker of an elastic job needs --checkpoint: it is started again "
             "after a failure or a change of members and resumes from that file (without one it would start over)");
  WEFT_CHECK(resume.empty() || resume == checkpoint, "WEFT_ELASTIC=1: --resume '", resume, "' is not --checkpoint '",
             checkpoint, "': every restart of an elastic job would go back to '", resume, "'. Leave --resume out (a "
             "worker resumes from --checkpoint when it exists); to start from another checkpoint, copy it there first");
  std::error_code error;
  if (!std::filesystem::exists(checkpoint, error)) {
    WEFT_CHECK(!error, "WEFT_ELASTIC=1: cannot tell whether the checkpoint '", checkpoint, "' exists: ",
               error.message());
    // Not there yet (--resume naming it too): the job's first round starts from the beginning.
    return {"", false};
  }
  return {checkpoint, true};
}

ElasticAdmission::ElasticAdmission(const ElasticEnv& env, int rank) : env_(env), rank_(rank) {
  if (rank_ != 0) return;
  auto store = std::make_shared<parallel::TCPStore>(env_.store_host, static_cast<uint16_t>(env_.store_port),
                                                    /*is_server=*/false, kStoreTimeout);
  job_ = std::make_unique<parallel::ElasticJob>(std::make_shared<parallel::PrefixStore>("rdzv/" + env_.run_id, store));
  job_->admit_at_checkpoints(env_.round);
}

void ElasticAdmission::on_checkpoint(TrainLoop& loop) {
  // Rank 0 decides and ends the round *before* the others learn it, so the round's end is
  // in the store before any worker exits: an agent whose workers all exit 0 then knows
  // the round ended, not the job.
  double waiting = 0;
  if (rank_ == 0 && env_.num_nodes < env_.max_nodes && !job_->end_reason(env_.round)) {
    waiting = static_cast<double>(job_->waiting(env_.round));
    if (waiting > 0)
      job_->end_round(env_.round,
                      "admitting " + std::to_string(static_cast<int64_t>(waiting)) +
                          (waiting == 1 ? " waiting node" : " waiting nodes") + " at the checkpoint after epoch " +
                          std::to_string(loop.epoch()) + " + " + std::to_string(loop.epoch_samples()) + " samples",
                      /*failure=*/false);
  }
  if (loop.strategy().reduce({.loss = waiting}).loss > 0) {
    admitting_ = true;
    loop.request_stop();
  }
}

}  // namespace weft::train
