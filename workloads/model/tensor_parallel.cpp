#include "workloads/model/tensor_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "emu/check.h"

namespace emu::model {
namespace {

bool contains(std::string_view name, std::string_view part) { return name.find(part) != std::string_view::npos; }

// GPT-2's column-parallel Conv1D weights [in, out]: the output columns split block by block (c_attn's q, k and v
// each by heads, as Megatron splits its fused query_key_value per head; c_fc one block), every input row kept.
std::vector<int64_t> conv1d_column_index(const ParamInfo& full, const ParamInfo& local,
                                         const std::vector<int64_t>& full_blocks, int rank, int tp) {
  const int64_t rows = local.shape[0], cols_full = full.shape[1], cols_local = local.shape[1];
  EMU_CHECK(rows == full.shape[0], "tp: {} has {} rows, its slice {}", local.name, full.shape[0], rows);
  std::vector<int64_t> column;  // the full column of each local column
  int64_t full_start = 0;
  for (int64_t block : full_blocks) {
    const int64_t mine = block / tp;
    for (int64_t c = 0; c < mine; ++c) column.push_back(full_start + int64_t{rank} * mine + c);
    full_start += block;
  }
  EMU_CHECK(int64_t(column.size()) == cols_local, "tp: {}'s slice has {} columns, its blocks {}", local.name,
            cols_local, column.size());
  std::vector<int64_t> index(local.count);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols_local; ++c) {
      index[static_cast<size_t>(r * cols_local + c)] = r * cols_full + column[static_cast<size_t>(c)];
    }
  }
  return index;
}

}  // namespace

int64_t tp_vocab_multiple(int tp, int64_t shrink) {
  const int64_t k = std::max<int64_t>(shrink, 1);
  return int64_t{tp} * ((128 + k - 1) / k);
}

int64_t tp_padded_vocab(const ModelConfig& config, int tp) {
  const int64_t multiple = tp_vocab_multiple(tp, config.shrink);
  return (config.vocab + multiple - 1) / multiple * multiple;
}

void check_tensor_parallel(const ModelConfig& config, int tp) {
  if (tp < 1) throw InputError(fmt::format("tensor-parallel size {}: accepted: 1 or more ranks", tp));
  const auto divisible = [&](std::string_view what, int64_t value) {
    if (value % tp == 0) return;
    std::vector<int> accepted;
    for (int t = 1; t <= value; ++t) {
      if (value % t == 0) accepted.push_back(t);
    }
    throw InputError(
        fmt::format("tp over {} ranks: {}'s {} ({}) is not divisible by {}; accepted tensor-parallel "
                    "sizes for it: {}",
                    tp, config.name, what, value, tp, fmt::join(accepted, ", ")));
  };
  divisible("attention heads a", config.heads);
  divisible("kv heads", config.kv_heads);
  divisible("FFN size F", config.ffn);
}

void check_sequence_parallel(const ModelConfig& config, const ModelOptions& options, int tp) {
  if (config.seq % tp != 0) {
    std::vector<int> accepted;
    for (int t = 1; t <= config.seq; ++t) {
      if (config.seq % t == 0) accepted.push_back(t);
    }
    throw InputError(fmt::format(
        "--sequence-parallel over {} ranks: the sequence length s ({}{}) is not divisible by {}; accepted: a "
        "sequence length that is a multiple of {}, or a tensor-parallel size dividing it: {}",
        tp, config.seq, config.shrink > 1 ? fmt::format(", shrunk by {}", config.shrink) : "", tp, tp,
        fmt::join(accepted, ", ")));
  }
  if (config.sandwich_norms) {
    throw InputError(
        fmt::format("--sequence-parallel: {}'s sandwich norms (Gemma 2) are not split along the sequence "
                    "yet; accepted: the other Llama-style families",
                    config.name));
  }
  if (config.style == Style::kGpt2) {
    throw InputError(fmt::format(
        "--sequence-parallel: {} is {}, whose learned positions Megatron adds after the embedding's all-reduce and "
        "whose row-parallel biases would need the norms' reduction: not split along the sequence yet; accepted: tp "
        "without --sequence-parallel for it, or a Llama-style family",
        config.name, family_name(config)));
  }
  if (options.autocast) {
    throw InputError(
        "--sequence-parallel runs Megatron's recipes (--precision bf16, mixed or fp32 with bf16 or fp32 parameters), "
        "not torch.autocast over fp32 parameters");
  }
}

ModelConfig tensor_parallel_config(const ModelConfig& config, int tp) {
  check_tensor_parallel(config, tp);
  ModelConfig local = config;
  local.head_size = config.head_dim();
  local.heads = config.heads / tp;
  local.kv_heads = config.kv_heads / tp;
  local.ffn = config.ffn / tp;
  local.vocab = tp_padded_vocab(config, tp) / tp;
  if (tp > 1) local.name = fmt::format("{} (tp rank slice 1/{})", config.name, tp);
  return local;
}

std::vector<int64_t> tensor_parallel_index(const ModelConfig& config, const ParamInfo& full, const ParamInfo& local,
                                           int rank, int tp) {
  EMU_CHECK(full.name == local.name, "tp: {} against {}", local.name, full.name);
  std::vector<int64_t> index(local.count);
  if (local.count == full.count && local.shape == full.shape) {  // norm weights, and everything at t = 1
    for (size_t i = 0; i < index.size(); ++i) index[i] = static_cast<int64_t>(i);
    return index;
  }
  const int64_t cols_full = full.shape.size() > 1 ? full.shape[1] : 1;
  const int64_t cols_local = local.shape.size() > 1 ? local.shape[1] : 1;
  if (contains(local.name, "o_proj") || contains(local.name, "down_proj")) {  // row-parallel: input columns split
    const int64_t rows = local.shape[0];
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols_local; ++c) {
        index[static_cast<size_t>(r * cols_local + c)] = r * cols_full + int64_t{rank} * cols_local + c;
      }
    }
    return index;
  }
  if (contains(local.name, "c_attn.weight") || contains(local.name, "c_fc.weight")) {
    // GPT-2's Conv1D [in, out]: column-parallel splits the output columns, c_attn's block by block.
    const std::vector<int64_t> blocks = contains(local.name, "c_attn")
                                            ? std::vector<int64_t>{config.q_dim(), config.q_dim(), config.q_dim()}
                                            : std::vector<int64_t>{cols_full};
    return conv1d_column_index(full, local, blocks, rank, tp);
  }
  // Column-parallel: output rows split, block by block; rows past a block's full length are vocabulary padding.
  // GPT-2's Conv1D row-parallel c_proj [in, out] splits its input rows, the same contiguous rows.
  EMU_CHECK(cols_full == cols_local, "tp: {} has {} columns, its slice {}", local.name, cols_full, cols_local);
  std::vector<int64_t> full_blocks, local_blocks;
  if (contains(local.name, "qkv_proj") || contains(local.name, "c_attn.bias")) {  // [q | k | v] rows
    full_blocks = {config.q_dim(), config.kv_dim(), config.kv_dim()};
  } else if (contains(local.name, "gate_up_proj")) {
    full_blocks = {full.shape[0] / 2, full.shape[0] / 2};
  } else {
    full_blocks = {full.shape[0]};
  }
  if (full_blocks.size() == 1) {
    local_blocks = {local.shape[0]};
  } else {
    for (int64_t b : full_blocks) local_blocks.push_back(b / tp);
  }
  int64_t full_start = 0, local_start = 0;
  for (size_t b = 0; b < full_blocks.size(); ++b) {
    for (int64_t r = 0; r < local_blocks[b]; ++r) {
      const int64_t in_block = int64_t{rank} * local_blocks[b] + r;  // the row within the full block
      for (int64_t c = 0; c < cols_local; ++c) {
        index[static_cast<size_t>((local_start + r) * cols_local + c)] =
            in_block < full_blocks[b] ? (full_start + in_block) * cols_full + c : -1;
      }
    }
    full_start += full_blocks[b];
    local_start += local_blocks[b];
  }
  return index;
}

double vocab_parallel_cross_entropy(TensorParallel& tp, float* logits, const int32_t* targets, int64_t rows,
                                    int64_t vocab, int64_t begin, float grad_scale) {
  const size_t n = static_cast<size_t>(rows);
  if (logits == nullptr) {  // shapes only: the three reductions' bytes
    tp.all_reduce_rows(nullptr, n, true, "tp cross-entropy max");
    tp.all_reduce_rows(nullptr, n, false, "tp cross-entropy target logit");
    tp.all_reduce_rows(nullptr, n, false, "tp cross-entropy sum exp");
    return 0;
  }
  std::vector<float> max(n, -std::numeric_limits<float>::infinity()), target(n, 0.0f), sum(n, 0.0f);
  for (size_t t = 0; t < n; ++t) {
    const float* row = logits + t * static_cast<size_t>(vocab);
    max[t] = *std::max_element(row, row + vocab);
  }
  tp.all_reduce_rows(max.data(), n, true, "tp cross-entropy max");
  for (size_t t = 0; t < n; ++t) {
    const float* row = logits + t * static_cast<size_t>(vocab);
    const int64_t local = targets[t] - begin;
    if (local >= 0 && local < vocab) target[t] = row[local] - max[t];
    double s = 0;
    for (int64_t v = 0; v < vocab; ++v) s += std::exp(double(row[v] - max[t]));
    sum[t] = static_cast<float>(s);
  }
  tp.all_reduce_rows(target.data(), n, false, "tp cross-entropy target logit");
  tp.all_reduce_rows(sum.data(), n, false, "tp cross-entropy sum exp");
  double loss = 0;
  for (size_t t = 0; t < n; ++t) {
    float* row = logits + t * static_cast<size_t>(vocab);
    loss += std::log(double(sum[t])) - double(target[t]);
    const int64_t local = targets[t] - begin;
    for (int64_t v = 0; v < vocab; ++v) {
      const double p = std::exp(double(row[v] - max[t])) / double(sum[t]);
      row[v] = static_cast<float>((p - (v == local ? 1.0 : 0.0)) * grad_scale);
    }
  }
  return loss;
}

void vocab_parallel_tokens(const int32_t* tokens, int64_t rows, int64_t vocab, int64_t begin, int32_t* local,
                           std::vector<uint8_t>& outside) {
  outside.assign(static_cast<size_t>(rows), 0);
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t row = tokens[t] - begin;
    const bool out = row < 0 || row >= vocab;
    outside[static_cast<size_t>(t)] = out ? 1 : 0;
    local[t] = out ? 0 : static_cast<int32_t>(row);
  }
}

}  // namespace emu::model
