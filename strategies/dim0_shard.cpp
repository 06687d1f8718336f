#include "strategies/dim0_shard.h"

#include <algorithm>
#include <cmath>

#include "workloads/model/shrink.h"

namespace emu::strategy {

uint64_t TensorRows::charge(uint64_t elements) const {
  if (count == 0 || charged == count) return elements;
  return static_cast<uint64_t>(std::llround(double(elements) * double(charged) / double(count)));
}

std::vector<TensorRows> tensor_rows(const model::ModelConfig& config, const model::UnitLayout& unit) {
  std::vector<TensorRows> rows;
  for (const model::ParamInfo& p : unit.params) {
    const auto dim0 = p.shape.empty() ? uint64_t{1} : static_cast<uint64_t>(p.shape.front());
    rows.push_back({dim0, p.count, p.offset, model::tensor_charge(config, p)});
  }
  return rows;
}

uint64_t Dim0Tensor::valid_rows(int rank) const {
  const uint64_t begin = chunk_rows * static_cast<uint64_t>(rank);
  return begin >= tensor.rows ? 0 : std::min(chunk_rows, tensor.rows - begin);
}

uint64_t Dim0Shards::charged_shard() const {
  uint64_t total = 0;
  for (const Dim0Tensor& t : tensors) total += t.tensor.charge(t.chunk_elements());
  return total;
}

uint64_t Dim0Shards::charged_padded() const {
  uint64_t total = 0;
  for (const Dim0Tensor& t : tensors) total += t.tensor.charge(t.chunk_elements() * static_cast<uint64_t>(ranks));
  return total;
}

Dim0Shards dim0_shards(std::span<const TensorRows> tensors, int ranks) {
  Dim0Shards shards;
  shards.ranks = ranks;
  const auto n = static_cast<uint64_t>(ranks);
  for (const TensorRows& tensor : tensors) {
    Dim0Tensor t;
    t.tensor = tensor;
    t.chunk_rows = (tensor.rows + n - 1) / n;
    t.shard_offset = shards.shard;
    shards.shard += t.chunk_elements();
    shards.tensors.push_back(t);
  }
  return shards;
}

}  // namespace emu::strategy
