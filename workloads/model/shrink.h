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

#include <cstdint>
#include <string>
#include <vector>

#include "workloads/model/config.h"

namespace emu::model {

// Every k ≥ 1 the head dimension allows, ascending.
std::vector<int64_t> valid_shrink_factors(const ModelConfig& full);
// The config shrunk by k; InputError naming k and listing the valid factors when k breaks the head dimension.
ModelConfig shrink(const ModelConfig& full, int64_t k);

// One memory term at full scale and shrunk, in bytes (or elements where said).
struct ShrinkTerm {
  std::string name;
  double full = 0;
  double shrunk = 0;
  // shrunk · k² / full − 1: 0 is an exact 1/k² scaling.
  double deviation(int64_t k) const { return full == 0 ? 0 : shrunk * double(k) * double(k) / full - 1; }
};

struct ShrinkReport {
  ModelConfig full;
  ModelConfig shrunk;
  int64_t k = 1;
  std::vector<ShrinkTerm> terms;

  // A table: the shapes side by side, then each term with its deviation in percent.
  std::string format() const;
};

ShrinkReport shrink_report(const ModelConfig& full, int64_t k, const ModelOptions& options);

}  // namespace emu::model
