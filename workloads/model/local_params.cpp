#include "workloads/model/local_params.h"

#include <cstring>

#include "workloads/model/tensor.h"

namespace emu::model {

LocalParams::LocalParams(Model& model, uint64_t seed) : model_(model) {
  Device& device = model.device();
  const DType dt = model.compute_dtype();
  for (int u = 0; u < model.num_units(); ++u) {
    const UnitLayout& layout = model.layout(u);
    weights_.push_back(device.allocate(layout.count, dt, Category::kParameters, layout.name + " weights"));
    grads_.push_back(device.allocate(layout.count, dt, Category::kGradients, layout.name + " gradients"));
    if (device.holds_data()) {
      std::vector<float> values(layout.count);  // host scratch for initialisation, not charged
      model.init_unit(u, seed, values.data());
      narrow(values.data(), dt, values.size(), weights_.back().data());
    }
    model.bind_weights(u, weights_.back().data());
    model.bind_grads(u, grads_.back().data());
  }
}

void LocalParams::zero_grads() {
  for (Buffer& g : grads_) {
    if (g.data() != nullptr) std::memset(g.data(), 0, g.bytes());
  }
}

void LocalParams::sgd_step(float lr) {
  std::vector<float> w, g;  // host fp32 scratch for the update, not charged
  for (size_t u = 0; u < weights_.size(); ++u) {
    Buffer& wb = weights_[u];
    if (wb.data() == nullptr) continue;
    w.resize(wb.count());
    g.resize(wb.count());
    widen(wb.data(), wb.dtype(), w.size(), w.data());
    widen(grads_[u].data(), grads_[u].dtype(), g.size(), g.data());
    for (size_t i = 0; i < w.size(); ++i) w[i] -= lr * g[i];
    narrow(w.data(), wb.dtype(), w.size(), wb.data());
  }
  zero_grads();
}

float LocalParams::train_step(const int32_t* tokens, const int32_t* targets, float lr) {
  zero_grads();
  const float loss = model_.step(tokens, targets, hooks_);
  sgd_step(lr);
  return loss;
}

}  // namespace emu::model
