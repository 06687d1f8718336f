// Memory-faithful shrinking by a factor k (DESIGN.md §1), and the report of how far each memory term of the shrunk
// model, times k², lands from the full-scale value.
//
// The rule: h, F, V and s (and GPT-2's position table) are divided by k; L, a, kv and b are unchanged.
// - h/k must be exact with a whole head dimension: (h/a)/k an integer ≥ 1, and even for Llama (rotary embedding
//   rotates pairs). This bounds k; any other k is an InputError listing the valid values.
// - F/k, V/k, s/k and the position rows /k are rounded to the nearest integer (halves up), at least 1. Exact
//   division is not required because real vocabularies are often odd (GPT-2's 50257 = 29·1733); the rounding shows
//   up as a deviation in the report instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "emu/device.h"
#include "workloads/model/config.h"
#include "workloads/model/layout.h"

namespace emu::model {

// Every k ≥ 1 the head dimension allows, ascending.
std::vector<int64_t> valid_shrink_factors(const ModelConfig& full);
// The config shrunk by k; InputError naming k and listing the valid factors when k breaks the head dimension.
ModelConfig shrink(const ModelConfig& full, int64_t k);

// The training FLOPs of one micro-batch's step on one rank, as the dense count of Narayanan et al. 2021 (Megatron-LM,
// §5.1) writes it: forward 2·T·(block matrices + V·h) for every matrix product with a weight, plus 4·b·s²·a·d for
// the attention scores q·kᵀ and their product with v; backward twice the forward. Recomputation under activation
// checkpointing and the element-wise ops are left out: a bound on this count bounds the run's compute.
double step_flops(const ModelConfig& config);

// What the default shrink factor (no --shrink) bounds, so that a default run stays a quick run on a laptop or a CI
// runner: the smallest valid k that leaves at most kDefaultShrinkParams parameters (the optimizer's element-wise
// work and every collective scale with it) and at most kDefaultShrinkFlops per micro-batch step (the matrix
// products, which dominate a long-sequence run: s shrinks by k too, so step_flops falls by k³). The FLOPs bound:
// SmolLM2-135M's default run at the parameter bound alone (k = 8, 40 GFLOP per step; 3 steps of 6 strategies on
// 8 ranks sharing 2 cores) took 51 s on an idle machine, about 1.3 s per GFLOP of step, so 16 GFLOP keeps every
// default run near 20 s of compute, with room for start-up, the optimizer and a busier machine within a minute.
// The largest valid k when none meets both.
inline constexpr uint64_t kDefaultShrinkParams = 4'000'000;
inline constexpr double kDefaultShrinkFlops = 16e9;
int64_t default_shrink(const ModelConfig& full);

// Charging a shrunk run as the full-scale model ÷ k². Most buffers need nothing: their bytes scale by k² with
// the shapes. Two kinds of term scale by k only, and are charged at their shrunk bytes / k, which is their
// full-scale bytes / k² up to the rounding of s and F:
// - per-row statistics, one value per token row (T = b·s) or per attention row (b·a·s): RMSNorm's rstd,
//   LayerNorm's mean and rstd, the flash logsumexp, the token ids;
// - norm weights and biases (∝ h or F) inside the flat parameter units, and every gradient, master weight, Adam
//   moment and bucket that mirrors them.
// A config at full scale (shrink 1) is charged as it holds.

// Bytes charged for a per-row buffer of `bytes` held bytes: bytes / k, rounded up (k = config.shrink).
uint64_t per_row_charge(const ModelConfig& config, uint64_t bytes);
// A per-row buffer of `count` elements of `dtype`, charged per_row_charge() (Device::allocate's charged overload).
Buffer allocate_per_row(Device& device, const ModelConfig& config, size_t count, DType dtype, Category category,
                        std::string_view what);

// How the elements of a flat parameter space (one unit, or all units back to back) are charged: a matrix or
// embedding element as one, a norm weight or bias element as 1/k. A shard of the space is charged its share.
struct ParameterCharge {
  uint64_t held = 0;   // elements of the space
  double charged = 0;  // what they are charged for, in elements

  // What `count` elements of the space are charged for, in elements: count · charged / held, rounded to the
  // nearest; count when the space is empty or at full scale. Also what a full-scale size limit (a prefetch
  // bucket, a persistence threshold, ÷ k²) is compared with, so the shrunk run decides as the full-scale one.
  size_t elements(size_t count) const;
  // Bytes charged for `count` elements of the space at `dtype`: elements(count) at dtype's size.
  size_t bytes(size_t count, DType dtype) const { return elements(count) * dtype_size(dtype); }
};
ParameterCharge parameter_charge(const ModelConfig& config, std::span<const UnitLayout> units);
// What one tensor's `param.count` elements are charged for, in elements: as held for a matrix or embedding, ÷ k
// (rounded to the nearest) for a norm weight or bias. For a buffer sized by one tensor (ZeRO offload's staging).
size_t tensor_charge(const ModelConfig& config, const ParamInfo& param);
// `count` elements of the space `charge` describes (parameters, gradients, buckets, optimizer state of a shard).
Buffer allocate_parameter_space(Device& device, const ParameterCharge& charge, size_t count, DType dtype,
                                Category category, std::string_view what);

// One memory term at full scale and shrunk, in bytes (or elements where said).
struct ShrinkTerm {
  std::string name;
  double full = 0;
  double shrunk = 0;   // as a shrunk run charges it
  bool memory = true;  // false: bytes on the wire, which are real data
  // shrunk · k² / full − 1: 0 is an exact 1/k² scaling.
  double deviation(int64_t k) const { return full == 0 ? 0 : shrunk * double(k) * double(k) / full - 1; }
};

struct ShrinkReport {
  ModelConfig full;
  ModelConfig shrunk;
  int64_t k = 1;
  std::vector<ShrinkTerm> terms;

  // The memory term furthest from an exact 1/k², after charging: only the rounding of F, V and s is left.
  const ShrinkTerm& worst_memory_term() const;
  // The wire's deviation: the parameters' payload as held (norm weights and biases at their shrunk size).
  double wire_deviation() const;
  // One line on what remains of the deviation, for the run header and the report's footer.
  std::string remaining() const;
  // A table: the shapes side by side, then each term with its deviation in percent, then remaining().
  std::string format() const;
};

ShrinkReport shrink_report(const ModelConfig& full, int64_t k, const ModelOptions& options);

}  // namespace emu::model
