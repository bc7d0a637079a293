// DistributedPipeline: one rank's stages, messages through the process group; see
// distributed_pipeline.h.
#include "parallel/pipeline/distributed_pipeline.h"

#include <algorithm>
#include <exception>
#include <initializer_list>
#include <map>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/trace.h"
#include "kernels/elementwise.h"
#include "kernels/shape_ops.h"
#include "parallel/pipeline/tensor_header.h"
#include "parallel/process_group/coalesced_collectives.h"
#include "parallel/process_group/collective_support.h"
#include "parallel/process_group/connect_peers.h"
#include "parallel/process_group/text_collectives.h"
#include "parallel/process_group/value_agreement.h"

namespace weft::parallel::pipeline {

namespace {

// A bucket cap in bytes; -1 for what is no size (not positive, NaN, a million MiB or more).
int64_t bucket_bytes(double mb) { return mb > 0 && mb < 1e6 ? static_cast<int64_t>(mb * (1 << 20)) : -1; }

// The stage that receives what `a` (a SEND or RECV action) carries, and the one that sends it.
int receiving_stage(const Action& a) {
  if (a.kind == ActionKind::SendForward) return a.stage + 1;
  if (a.kind == ActionKind::SendBackward) return a.stage - 1;
  return a.stage;
}
int sending_stage(const Action& a) {
  if (a.kind == ActionKind::RecvForward) return a.stage - 1;
  if (a.kind == ActionKind::RecvBackward) return a.stage + 1;
  return a.stage;
}
bool is_send(const Action& a) { return a.kind == ActionKind::SendForward || a.kind == ActionKind::SendBackward; }
bool is_recv(const Action& a) { return a.kind == ActionKind::RecvForward || a.kind == ActionKind::RecvBackward; }

// A message's number, the same for its send and its receive: forward or backward, the
// sending stage, the micro-batch.
int64_t message_id(const Action& a, int num_stages, int num_micro_batches) {
  const bool forward = a.kind == ActionKind::SendForward || a.kind == ActionKind::RecvForward;
  return ((forward ? 0 : 1) * int64_t{num_stages} + sending_stage(a)) * num_micro_batches + a.micro_batch;
}

std::string describe_message(int64_t id, int num_stages, int num_micro_batches) {
  const int64_t mb = id % num_micro_batches, stage = id / num_micro_batches % num_stages;
  const bool forward = id / num_micro_batches / num_stages == 0;
  return std::to_string(stage) + (forward ? "SEND_F" : "SEND_B") + std::to_string(mb);
}

// Sends and receives through the group: a header (dtype, rank, dims) then the data, each
// with a tag of its own; messages a rank sends itself (two of its stages in a row) stay here.
class GroupTransport final : public Transport {
 public:
  GroupTransport(ProcessGroup& group, const Schedule& schedule) : group_(group), schedule_(schedule) {}

  void send(const Action& send, const Tensor& tensor) override {
    const int dst = schedule_.rank_of(receiving_stage(send));
    const int64_t id = message_id(send, schedule_.num_stages, schedule_.num_micro_batches);
    Tensor data = tensor.contiguous();
    if (dst == group_.rank()) {
      local_[id] = data;
      return;
    }
    WEFT_CHECK(data.dim() <= kMaxHeaderDims, "pipeline: ", send.str(), " sends a ", data.dim(),
               "-d tensor; stages may pass at most ", kMaxHeaderDims, "-d tensors between ranks");
    Tensor head = tensor_header(data, data.device());
    // The sends known to be done let go of their tensors: a recomputed micro-batch's output
    // (stage_runner.h) should not outlive its message. NCCL's sends say so as soon as their
    // event has passed; Gloo's only once waited for, so over Gloo they stay until finish(). A
    // failed one stays for finish() to report.
    std::erase_if(in_flight_, [](const auto& s) { return s.first->is_completed() && !s.first->exception(); });
    in_flight_.emplace_back(group_.send(head, dst, tag(id, 0)), head);
    in_flight_.emplace_back(group_.send(data, dst, tag(id, 1)), data);
  }

  Tensor recv(const Action& recv, Device device) override {
    const int src = schedule_.rank_of(sending_stage(recv));
    const int64_t id = message_id(recv, schedule_.num_stages, schedule_.num_micro_batches);
    if (src == group_.rank()) {
      auto node = local_.extract(id);
      WEFT_CHECK(!node.empty(), "pipeline: ", recv.str(), " found nothing its rank sent itself");
      return node.mapped();
    }
    Tensor head = zeros({kHeaderLength}, TensorOptions(DType::Int64, device));
    group_.recv(head, src, tag(id, 0))->wait();
    const std::string who = "pipeline: " + recv.str() + " from rank " + std::to_string(src);
    std::optional<Tensor> data = empty_from_header(head, device, who);
    WEFT_CHECK(data.has_value(), who, " got a header without a tensor");
    group_.recv(*data, src, tag(id, 1))->wait();
    return *data;
  }

  // Every send is done (their tensors may be freed).
  void finish() {
    for (const auto& [work, tensor] : in_flight_) work->wait();
    in_flight_.clear();
  }

 private:
  // Gloo's tags are below 2^30 for users: two per message.
  int tag(int64_t id, int part) const {
    const int64_t t = id * 2 + part;
    WEFT_CHECK(t < kConnectPeersTag, "pipeline: too many stages and micro-batches for message tags");
    return static_cast<int>(t);
  }

  ProcessGroup& group_;
  const Schedule& schedule_;
  std::vector<std::pair<std::shared_ptr<Work>, Tensor>> in_flight_;  // sends and the tensors they read
  std::map<int64_t, Tensor> local_;
};

}  // namespace

void check_messages_in_order(const Schedule& s) {
  // Per (sender, receiver): the messages in the order the sender sends them and in the
  // order the receiver receives them.
  std::map<std::pair<int, int>, std::vector<int64_t>> sent, received;
  for (int r = 0; r < s.num_ranks(); ++r)
    for (const Action& a : s.actions[r]) {
      if (is_send(a) && s.rank_of(receiving_stage(a)) != r)
        sent[{r, s.rank_of(receiving_stage(a))}].push_back(message_id(a, s.num_stages, s.num_micro_batches));
      if (is_recv(a) && s.rank_of(sending_stage(a)) != r)
        received[{s.rank_of(sending_stage(a)), r}].push_back(message_id(a, s.num_stages, s.num_micro_batches));
    }
  for (const auto& [pair, order] : sent) {
    const auto& other = received[pair];
    for (size_t i = 0; i < order.size() && i < other.size(); ++i)
      WEFT_CHECK(order[i] == other[i], "pipeline schedule '", s.name, "': rank ", pair.first, "'s message ", i,
                 " to rank ", pair.second, " is ", describe_message(order[i], s.num_stages, s.num_micro_batches),
                 ", but rank ", pair.second, " receives ", describe_message(other[i], s.num_stages,
                                                                            s.num_micro_batches),
                 " then: between processes messages arrive in the order sent (run this schedule in one process, ",
                 "with Pipeline)");
  }
}

DistributedPipeline::DistributedPipeline(std::shared_ptr<nn::Sequential> model, std::shared_ptr<ProcessGroup> group,
                                         DistributedPipelineOptions options)
    : Module("DistributedPipeline"), group_(std::move(group)), options_(std::move(options)) {
  WEFT_CHECK(model != nullptr && group_ != nullptr, "DistributedPipeline: the model and the group must be given");
  // The options are checked once every rank has them: a rank whose differ fails every rank.
  check_ranks_agree(model->size());
  WEFT_CHECK(options_.virtual_stages >= 1, "DistributedPipeline: virtual_stages must be at least 1, got ",
             options_.virtual_stages);
  WEFT_CHECK(bucket_bytes(options_.bucket_cap_mb) > 0 && bucket_bytes(options_.first_bucket_mb) > 0,
             "DistributedPipeline: bucket_cap_mb and first_bucket_mb must be at least a byte, got ",
             options_.bucket_cap_mb, " and ", options_.first_bucket_mb);
  WEFT_CHECK(options_.balance.empty() || !options_.balance_by,
             "DistributedPipeline: give balance or balance_by, not both");
  recomputed_micro_batches(options_.activation_checkpointing, 1);  // a mode it knows
  const int stages = group_->size() * options_.virtual_stages;
  stages_ = split_stages(*model, stages, options_.balance_by ? measured_balance(*model, stages) : options_.balance);
  options_.balance_by = nullptr;  // and with it what it holds (by_time's sample)
  set_schedule(make_schedule(options_.schedule, group_->size(), options_.micro_batches, options_.virtual_stages));
  for (int s = 0; s < num_stages(); ++s) {
    if (!holds_stage(s)) continue;
    stages_[s]->to(options_.device);
    for (const auto& [name, layer] : stages_[s]->named_children()) register_module(name, layer);
  }
  if (options_.replicas_group) {
    start_replicas_equal();
    make_reducers();
  }
}

DistributedPipeline::DistributedPipeline(std::shared_ptr<nn::Sequential> model, const PipelineMesh& mesh,
                                         DistributedPipelineOptions options)
    : DistributedPipeline(std::move(model), mesh.pipeline, [&] {
        if (mesh.replicas_group) options.job_group = mesh.job;
        options.replicas_group = mesh.replicas_group;
        return std::move(options);
      }()) {}

void DistributedPipeline::start_replicas_equal() const {
  WEFT_CHECK(options_.job_group != nullptr, "DistributedPipeline: replicas_group needs job_group (the whole job's "
             "ranks, which check that the replicas agree); pipeline_mesh's mesh gives both");
  ProcessGroup& replicas = *options_.replicas_group;
  WEFT_CHECK(options_.job_group->size() == group_->size() * replicas.size(), "DistributedPipeline: a job of ",
             options_.job_group->size(), " ranks cannot hold ", replicas.size(), " replicas of a pipeline of ",
             group_->size(), " ranks");
  // The replicas of this rank's stages must hold the same tensors, or averaging their gradients
  // would mix unrelated ones (or wait for a message of another size).
  std::vector<std::string> lines;
  std::vector<Tensor> state;
  for (int s = 0; s < num_stages(); ++s) {
    if (!holds_stage(s)) continue;
    for (const auto& [name, t] : stages_[s]->state_dict()) {
      lines.push_back("stage " + std::to_string(s) + " " + name + " " + t.shape().str() + " " +
                      std::string(dtype_name(t.dtype())));
      state.push_back(t);
    }
  }
  const auto difference = first_difference_across_ranks(replicas, lines, options_.device);
  // Every rank hears of a difference at any position: the positions whose replicas agree would
  // otherwise wait for the others in their next collective.
  const int position = group_->rank();
  std::vector<double> differs(static_cast<size_t>(group_->size()), 0.0);
  differs[static_cast<size_t>(position)] = difference ? 1.0 : 0.0;
  Tensor flags = tensor(differs).to(options_.device);
  options_.job_group->all_reduce(flags, ReduceOp::Max)->wait();
  if (difference)
    WEFT_FAIL("DistributedPipeline: the replicas of pipeline position ", position, " hold different stages: ",
              *difference, " (ranks counted within the replica group, where rank d is replica d; every rank must "
              "build the same model and options)");
  std::string elsewhere;
  const std::vector<double> any = flags.to(kCPU).to_vector<double>();
  for (int p = 0; p < group_->size(); ++p)
    if (any[static_cast<size_t>(p)] != 0) elsewhere += (elsewhere.empty() ? "" : ", ") + std::to_string(p);
  WEFT_CHECK(elsewhere.empty(), "DistributedPipeline: the replicas of pipeline position ", elsewhere, " hold different "
             "stages (the errors of those ranks say how; every rank must build the same model and options)");
  broadcast_tensors(state, replicas, 0);
}

void DistributedPipeline::make_reducers() {
  for (int s = 0; s < num_stages(); ++s) {
    if (!holds_stage(s)) continue;
    std::vector<Tensor> params;
    std::vector<std::string> names;
    for (const auto& [name, p] : stages_[s]->named_parameters())
      if (p.requires_grad()) params.push_back(p), names.push_back(name);  // frozen ones have nothing to average
    if (params.empty()) continue;
    reducers_[s] = std::make_unique<Reducer>(
        std::move(params), std::move(names), options_.replicas_group,
        ReducerOptions{.bucket_cap_bytes = bucket_bytes(options_.bucket_cap_mb),
                       .first_bucket_cap_bytes = bucket_bytes(options_.first_bucket_mb),
                       .find_unused_parameters = options_.find_unused_parameters,
                       .finish_at_end_of_backward = false,
                       .owner = "stage " + std::to_string(s) + "'s gradients averaged over its replica group",
                       .unused_parameter_advice = "A parameter of a replicated stage that takes no part in producing "
                                                  "the output of the stage's last micro-batch needs "
                                                  "DistributedPipelineOptions::find_unused_parameters (as DDP's), or "
                                                  "else freeze it (requires_grad_(false) before the pipeline is "
                                                  "built)"});
  }
}

void DistributedPipeline::check_ranks_agree(size_t layers) const {
  // What every rank must share, as numbers: layers, ranks per pipeline, micro-batches, stages
  // per rank, the schedule and the activation checkpointing mode (by their index among the
  // known ones, -1 for another), whether balance_by is given, the replicas and how their
  // reducers run (their buckets must match), and the balance (up to 8 stages' worth). Over job():
  // the replicas of a pipeline must agree too.
  auto index_of = [](const std::string& name, std::initializer_list<const char*> known) {
    int64_t i = 0;
    for (const char* k : known) {
      if (name == k) return i;
      ++i;
    }
    return int64_t{-1};
  };
  const double schedule = static_cast<double>(index_of(options_.schedule, {"gpipe", "1f1b", "interleaved"}));
  const double recompute =
      static_cast<double>(index_of(options_.activation_checkpointing, {"never", "except_last", "always"}));
  std::vector<NamedValue> mine{
      {"layers", static_cast<double>(layers)},
      {"pipeline ranks", static_cast<double>(group_->size())},
      {"micro_batches", static_cast<double>(options_.micro_batches)},
      {"virtual_stages", static_cast<double>(options_.virtual_stages)},
      {"schedule", schedule},
      {"activation_checkpointing", recompute},
      {"balance_by given", options_.balance_by ? 1.0 : 0.0},
      {"replicas", options_.replicas_group ? static_cast<double>(options_.replicas_group->size()) : 0.0},
      {"bucket_cap_mb (in bytes)", static_cast<double>(bucket_bytes(options_.bucket_cap_mb))},
      {"first_bucket_mb (in bytes)", static_cast<double>(bucket_bytes(options_.first_bucket_mb))},
      {"find_unused_parameters", options_.find_unused_parameters ? 1.0 : 0.0},
      {"balance entries", static_cast<double>(options_.balance.size())}};
  for (size_t k = 0; k < 8; ++k)
    mine.push_back({"balance[" + std::to_string(k) + "]",
                    k < options_.balance.size() ? static_cast<double>(options_.balance[k]) : -1.0});
  ProcessGroup& ranks = job();
  if (auto difference = first_disagreement(ranks, mine, options_.device))
    WEFT_FAIL("DistributedPipeline: ranks disagree: rank ", ranks.rank(), ": ", *difference,
              " (every rank must build the same model and pipeline options)");
}

std::vector<size_t> DistributedPipeline::measured_balance(const nn::Sequential& model, int stages) const {
  // [1, layers per stage...] from rank 0; [0, ...] when its measurement failed.
  std::vector<int64_t> message(static_cast<size_t>(stages) + 1, 0);
  std::exception_ptr failure;
  ProcessGroup& measurers = job();
  if (measurers.rank() == 0) {
    try {
      const std::vector<size_t> balance = options_.balance_by(model, stages, options_.device);
      WEFT_CHECK(balance.size() == static_cast<size_t>(stages), "DistributedPipeline: balance_by gave ",
                 balance.size(), " entries for ", stages, " stages");
      message[0] = 1;
      std::copy(balance.begin(), balance.end(), message.begin() + 1);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  Tensor sent = tensor(message, Shape{static_cast<int64_t>(message.size())}).to(options_.device);
  measurers.broadcast(sent, 0)->wait();
  if (failure) std::rethrow_exception(failure);
  message = sent.to(kCPU).to_vector<int64_t>();
  WEFT_CHECK(message[0] == 1, "DistributedPipeline: balance_by failed on rank 0, which measures the balance (its "
             "error says why)");
  return std::vector<size_t>(message.begin() + 1, message.end());
}

void DistributedPipeline::set_schedule(Schedule schedule) {
  validate(schedule);
  WEFT_CHECK(schedule.num_ranks() == group_->size() &&
                 (stages_.empty() || schedule.num_stages == static_cast<int>(stages_.size())),
             "DistributedPipeline: schedule '", schedule.name, "' has ", schedule.num_stages, " stages on ",
             schedule.num_ranks(), " ranks; this pipeline has ", stages_.size(), " stages on ", group_->size(),
             " ranks");
  check_messages_in_order(schedule);
  connect_peers(schedule);
  schedule_ = std::move(schedule);
}

// Note [Connecting before the first step]: weft's NCCL backend makes the communicators of a
// pair of ranks at their first send or receive. Making one while a kernel of another
// communicator runs can wait for that kernel, and the kernel for the peer, which may be
// waiting for this communicator: in 1F1B over two ranks, rank 1 making its communicator for
// gradients to rank 0 (inside NCCL's cuMemHostAlloc) waits behind a running send/receive
// kernel while rank 0 issues its receive of those gradients. So the pairs are connected here,
// before any step (parallel::connect_peers): pair after pair in the same order on every rank,
// the lower rank sending first, each message done before the next, so that no communicator is
// made while a kernel of this rank runs.
void DistributedPipeline::connect_peers(const Schedule& s) const {
  std::vector<std::pair<int, int>> pairs;
  for (int r = 0; r < s.num_ranks(); ++r)
    for (const Action& a : s.actions[r]) {
      const int to = is_send(a) ? s.rank_of(receiving_stage(a)) : r;
      if (to != r) pairs.emplace_back(r, to);
    }
  parallel::connect_peers(*group_, pairs, options_.device);
}

std::shared_ptr<nn::Module> DistributedPipeline::shallow_copy() const {
  WEFT_FAIL("DistributedPipeline: cannot be cloned or replicated (build one on every rank)");
}

Tensor DistributedPipeline::forward(const Tensor& input) {
  NoGradGuard no_grad;
  const int S = num_stages();
  GroupTransport transport(*group_, schedule_);
  Tensor x;
  try {
    for (int s = 0; s < S; ++s) {
      if (!holds_stage(s)) continue;
      if (s == 0) {
        WEFT_CHECK(input.defined() && input.dim() >= 1, "rank ", group_->rank(),
                   " runs the first stage and needs the input batch");
        x = input.to(options_.device);
      } else {
        x = transport.recv({ActionKind::RecvForward, s, 0}, options_.device);
      }
      {
        TraceSpan span("forward", options_.device);
        span.arg("stage", s);
        x = stages_[s]->forward(x);
      }
      if (s + 1 < S) transport.send({ActionKind::SendForward, s, 0}, x);
    }
    transport.finish();
  } catch (const std::exception& e) {
    WEFT_FAIL("DistributedPipeline::forward on ", rank_name(), ": ", e.what());
  }
  return holds_stage(S - 1) ? x : Tensor();
}

void DistributedPipeline::broadcast_stages() {
  NoGradGuard no_grad;
  TraceSpan span("broadcast stages", options_.device);
  if (options_.replicas_group) {
    // Replica 0's buffers (BatchNorm's running statistics) in every replica, as DDP's rank 0's;
    // the parameters are equal already.
    std::vector<Tensor> buffers;
    for (int s = 0; s < num_stages(); ++s)
      if (holds_stage(s))
        for (const Tensor& b : stages_[s]->buffers()) buffers.push_back(b);
    broadcast_tensors(buffers, *options_.replicas_group, 0);
  }
  for (int s = 0; s < num_stages(); ++s) {
    const int root = schedule_.rank_of(s);
    // The stage's tensors by dtype (a flat buffer holds one), in state_dict order on every rank.
    std::map<DType, std::vector<Tensor>> by_dtype;
    for (const auto& [name, t] : stages_[s]->state_dict()) by_dtype[t.dtype()].push_back(t);
    for (const auto& [dtype, tensors] : by_dtype) {
      Tensor flat;
      if (holds_stage(s)) {
        std::vector<Tensor> here;
        for (const Tensor& t : tensors) here.push_back(t.to(options_.device));
        flat = detail::flatten(here);
      } else {
        int64_t n = 0;
        for (const Tensor& t : tensors) n += t.numel();
        flat = empty({n}, TensorOptions(dtype, options_.device));
      }
      group_->broadcast(flat, root)->wait();
      if (!holds_stage(s)) detail::unflatten_into(flat, tensors);
    }
  }
}

std::string DistributedPipeline::extra_repr() const {
  std::ostringstream out;
  out << "rank=" << group_->rank() << " of " << group_->size() << ", stages=[";
  bool first = true;
  for (int s = 0; s < num_stages(); ++s)
    if (holds_stage(s)) out << (first ? "" : ", ") << s, first = false;
  out << "] of " << num_stages() << ", balance=[";
  for (int s = 0; s < num_stages(); ++s) out << (s ? ", " : "") << stages_[s]->size();
  out << "], device=" << options_.device << ", schedule=" << schedule_.name
      << ", micro_batches=" << schedule_.num_micro_batches;
  return out.str();
}

std::string DistributedPipeline::rank_name() const {
  const std::string mine = "rank " + std::to_string(group_->rank());
  if (!options_.job_group || options_.job_group->size() == group_->size()) return mine;
  return "pipeline " + mine + " (rank " + std::to_string(options_.job_group->rank()) + " of the job)";
}

void DistributedPipeline::check_reducers_ready() const {
  for (const auto& [s, reducer] : reducers_) {
    WEFT_CHECK(!reducer->expecting_gradients(), "DistributedPipeline::step on ", rank_name(), ": a previous step "
               "failed after stage ", s, " began averaging its gradients, so its replicas' collectives are out of "
               "step; stop every rank and start the job again");
    size_t trainable = 0;
    for (const Tensor& p : stages_[s]->parameters()) trainable += p.requires_grad() ? 1 : 0;
    WEFT_CHECK(trainable == reducer->parameter_count(), "DistributedPipeline::step on ", rank_name(), ": stage ", s,
               " has ", trainable, " trainable parameters, but ", reducer->parameter_count(), " when the pipeline was "
               "built, whose gradients its replicas average; freeze or unfreeze parameters before building it");
  }
}

void DistributedPipeline::finish_reducers() {
  // Every reducer waits for its buckets, also after another's error (the first is reported).
  std::exception_ptr first;
  for (auto& [s, reducer] : reducers_) {
    // On a GPU as the device waited, as the reducer's "wait for buckets" inside it.
    DeviceTraceSpan span("average gradients", options_.device);
    try {
      reducer->finish();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

const Schedule& DistributedPipeline::schedule_for(const Tensor& input, const Tensor& target) {
  const Tensor& known = input.defined() && input.dim() >= 1 ? input : target;
  if (!known.defined() || known.dim() < 1) return schedule_;
  if (schedule_.name != options_.schedule) return schedule_;
  const int m = micro_batches_for_batch(options_.schedule, group_->size(), schedule_.num_micro_batches, known.size(0));
  if (m == schedule_.num_micro_batches) return schedule_;
  auto it = short_schedules_.find(m);
  if (it == short_schedules_.end()) {
    Schedule shorter = make_schedule(options_.schedule, group_->size(), m, options_.virtual_stages);
    check_messages_in_order(shorter);  // the same pairs of ranks as the whole schedule's: connected
    it = short_schedules_.emplace(m, std::move(shorter)).first;
  }
  return it->second;
}

StepResult DistributedPipeline::step(const Tensor& input, const Tensor& target, const Criterion& criterion) {
  const Schedule& schedule = schedule_for(input, target);
  const int S = num_stages(), m = schedule.num_micro_batches;
  StageStep data;
  data.criterion = &criterion;
  data.recompute_below = recomputed_micro_batches(options_.activation_checkpointing, m);
  if (holds_stage(0)) {
    WEFT_CHECK(input.defined() && input.dim() >= 1, "DistributedPipeline::step: rank ", group_->rank(),
               " runs the first stage and needs the input batch");
    data.batch = input.size(0);
    data.sizes = micro_batch_sizes(data.batch, m);
    data.inputs = split(input.detach().to(options_.device), data.sizes);
  }
  if (holds_stage(S - 1)) {
    WEFT_CHECK(target.defined() && target.dim() >= 1, "DistributedPipeline::step: rank ", group_->rank(),
               " runs the last stage and needs the targets");
    WEFT_CHECK(!input.defined() || input.size(0) == target.size(0), "DistributedPipeline::step: input ",
               input.shape(), " and target ", target.shape(), " must have the same batch size (dim 0)");
    data.batch = target.size(0);
    data.sizes = micro_batch_sizes(data.batch, m);
    data.targets = split(target.detach().to(options_.device), data.sizes);
  }
  // Replicas: each stage's last backward launches its buckets (Note [Replicated stages]).
  check_reducers_ready();
  data.before_last_backward = [this](int s, const Tensor& from) {
    if (auto it = reducers_.find(s); it != reducers_.end()) it->second->prepare_for_backward({from});
  };
  GroupTransport transport(*group_, schedule);
  try {
    run_stage_actions(
        schedule, group_->rank(), [this](int s) -> nn::Module& { return *stages_[s]; },
        [this](int) { return options_.device; }, transport, data);
    transport.finish();
    finish_reducers();
  } catch (const std::exception& e) {
    WEFT_FAIL("DistributedPipeline::step (schedule ", schedule.name, ") on ", rank_name(), ": ", e.what());
  }
  if (!holds_stage(S - 1)) return {};
  NoGradGuard no_grad;
  Tensor loss = data.losses[0];
  for (int i = 1; i < m; ++i) loss = add(loss, data.losses[i]);
  return {loss, cat(data.outputs)};
}

}  // namespace weft::parallel::pipeline
