// The tiny Llama of the ladder (tests/mpi/strategy_harness.h: hidden 16, FFN 44, vocabulary 37, one KV head of 8,
// two blocks) as FSDP2 shards it, from the tensors' shapes by hand: torch.chunk on dim 0, every chunk padded to
// ceil(rows / N) rows (_fsdp_param.py, FSDPParam._init_sharded_param), not from emu's shard arithmetic.
#pragma once

#include <cstdint>
#include <vector>

#include "tests/mpi/strategy_harness.h"

namespace emu::testing {

struct Shape {
  int64_t rows, row;
};

// The root (embed_tokens, norm, lm_head) and one block, as Hugging Face's Llama stores them: [out, in].
const std::vector<Shape> kRoot = {{37, 16}, {16, 1}, {37, 16}};
const std::vector<Shape> kBlock = {{16, 1}, {16, 16}, {8, 16},  {8, 16}, {16, 16},
                                   {16, 1}, {44, 16}, {44, 16}, {16, 44}};
constexpr int64_t kBlocks = 2;

// S: elements of one rank's shard of a unit, every tensor padded on its own.
inline int64_t shard(const std::vector<Shape>& unit, int64_t n) {
  int64_t elements = 0;
  for (const Shape& s : unit) elements += (s.rows + n - 1) / n * s.row;
  return elements;
}

inline int64_t real(const std::vector<Shape>& unit) {
  int64_t elements = 0;
  for (const Shape& s : unit) elements += s.rows * s.row;
  return elements;
}

inline strategy::StrategyOptions mixed() {
  strategy::StrategyOptions options = test_options("fsdp2", optim::Recipe::kMixed);
  options.shrink = 32;  // the strategies' full-scale sizes ÷ k² (none matters to FSDP2); the model is not shrunk
  return options;
}

}  // namespace emu::testing
