// What the TrainLoop's strategies ask of models and optimizers, instead of their types: a
// model that a pipeline can split says so (Module::as_sequential), and an optimizer says
// whether its step() talks to other ranks (Optimizer::step_scope; the data-parallel wrappers'
// scopes, and the strategies' refusals of them, are test_ddp's, over a group of one).
#include "test_util.h"

#include <memory>
#include <vector>

#include "core/generator.h"
#include "nn/activation.h"
#include "nn/linear.h"
#include "nn/models/convnet.h"
#include "nn/models/mlp.h"
#include "nn/optim/sgd.h"
#include "nn/sequential.h"
#include "train/pipeline_strategy.h"

using namespace weft;
using doctest::Contains;

TEST_CASE("Module::as_sequential: the same layers for a Sequential and the models that have one; none otherwise") {
  Generator gen(2);
  auto seq = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(4, 3, true, TensorOptions(), &gen),
                                              std::make_shared<nn::ReLU>());
  auto again = seq->as_sequential();
  REQUIRE(again != nullptr);
  CHECK(again->size() == 2);
  CHECK(&(*again)[0] == &(*seq)[0]);  // shared, not copied
  CHECK(again->named_parameters().size() == seq->named_parameters().size());
  CHECK(again->named_parameters()[0].first == "0.weight");
  auto convnet = std::make_shared<nn::ConvNet>(10, &gen);
  CHECK(convnet->as_sequential() != nullptr);
  auto mlp = std::make_shared<nn::MLP>(4, std::vector<int64_t>{8}, 3, 0.0, &gen);
  CHECK(mlp->as_sequential() == nullptr);
  CHECK_THROWS_WITH_AS(train::pipeline_sequential(mlp), Contains("a MLP cannot be split into stages"), Error);
}

TEST_CASE("Optimizer::step_scope: the optimizers of nn/optim step their own parameters alone") {
  Generator gen(4);
  auto model = std::make_shared<nn::Linear>(2, 2, true, TensorOptions(), &gen);
  optim::SGD sgd(model->parameters(), optim::SGDOptions{0.1});
  CHECK(sgd.step_scope() == optim::StepScope::Local);
}
