// Tiny transformer shapes for tests: both styles, a few thousand parameters, grouped-query attention in the
// Llama case, tied embeddings in the GPT-2 case.
#pragma once

#include <cstdint>

#include "workloads/model/config.h"

namespace emu::test {

struct TinySizes {
  int64_t hidden = 32;
  int64_t ffn = 64;
  int64_t vocab = 16;
  int64_t seq = 16;
  int64_t max_positions = 0;  // 0: seq
  int64_t batch = 4;
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t llama_kv_heads = 2;  // GPT-2 has as many as heads
};

inline model::ModelConfig tiny_config(model::Style style, const TinySizes& s = {}) {
  model::ModelConfig c;
  c.name = style == model::Style::kLlama ? "tiny-llama" : "tiny-gpt2";
  c.style = style;
  c.hidden = s.hidden;
  c.ffn = s.ffn;
  c.vocab = s.vocab;
  c.seq = s.seq;
  c.max_positions = s.max_positions != 0 ? s.max_positions : s.seq;
  c.layers = s.layers;
  c.heads = s.heads;
  c.kv_heads = style == model::Style::kLlama ? s.llama_kv_heads : s.heads;
  c.batch = s.batch;
  c.tie_embeddings = style == model::Style::kGpt2;
  return c;
}

// The smallest shapes, for finite-difference gradients and weight round trips: hidden 8, two heads (one kv head for
// Llama), vocabulary 11, sequences of 5 with room for 6 positions.
inline model::ModelConfig smallest_config(model::Style style) {
  return tiny_config(style, {.hidden = 8,
                             .ffn = style == model::Style::kLlama ? 12 : 16,
                             .vocab = 11,
                             .seq = 5,
                             .max_positions = 6,
                             .batch = 2,
                             .heads = 2,
                             .llama_kv_heads = 1});
}

}  // namespace emu::test
