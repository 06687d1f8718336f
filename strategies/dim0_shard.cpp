#include "strategies/dim0_shard.h"

#include <algorithm>
#include <cmath>

#include "workloads/model/shrink.h"

namespace emu::strategy {

namespace {

// `charged` elements padded as `full_rows` rows are to `padded_rows`, rounded to the nearest.
uint64_t padded_charge(uint64_t charged, uint64_t padded_rows, uint64_t full_rows) {
  if (full_rows == 0) return 0;
  return static_cast<uint64_t>(std::llround(double(charged) * double(padded_rows) / double(full_rows)));
}

}  // namespace

std::vector<TensorRows> tensor_rows(const model::ModelConfig& config, const model::UnitLayout& unit) {
  std::vector<TensorRows> rows;
  for (const model::ParamInfo& p : unit.params) {
    const auto dim0 = p.shape.empty() ? uint64_t{1} : static_cast<uint64_t>(p.shape.front());
    const auto k = static_cast<uint64_t>(std::max<int64_t>(1, config.shrink));
    rows.push_back({dim0, p.count, p.offset, model::tensor_charge(config, p), dim0 * k});
  }
  return rows;
}

uint64_t Dim0Tensor::valid_rows(int rank) const {
  const uint64_t begin = chunk_rows * static_cast<uint64_t>(rank);
  return begin >= tensor.rows ? 0 : std::min(chunk_rows, tensor.rows - begin);
}

uint64_t Dim0Tensor::charged_chunk() const {
  const auto n = static_cast<uint64_t>(ranks);
  return padded_charge(tensor.charged, (tensor.full_rows + n - 1) / n, tensor.full_rows);
}

uint64_t Dim0Tensor::charged_padded() const {
  const auto n = static_cast<uint64_t>(ranks);
  return padded_charge(tensor.charged, (tensor.full_rows + n - 1) / n * n, tensor.full_rows);
}

uint64_t Dim0Shards::charged_shard() const {
  uint64_t total = 0;
  for (const Dim0Tensor& t : tensors) total += t.charged_chunk();
  return total;
}

uint64_t Dim0Shards::charged_padded() const {
  uint64_t total = 0;
  for (const Dim0Tensor& t : tensors) total += t.charged_padded();
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
    t.ranks = ranks;
    shards.shard += t.chunk_elements();
    shards.tensors.push_back(t);
  }
  return shards;
}

Dim0Shards coarser(const Dim0Shards& shards, int ranks) {
  Dim0Shards wide;
  wide.ranks = ranks;
  const auto factor = static_cast<uint64_t>(shards.ranks / ranks);
  for (Dim0Tensor t : shards.tensors) {
    t.chunk_rows *= factor;
    t.ranks = ranks;
    t.shard_offset = wide.shard;
    wide.shard += t.chunk_elements();
    wide.tensors.push_back(t);
  }
  return wide;
}

}  // namespace emu::strategy
