#include "workloads/model/shrink.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "emu/check.h"
#include "workloads/model/memory_terms.h"

namespace emu::model {
namespace {

bool head_dim_allows(const ModelConfig& full, int64_t k) {
  const int64_t d = full.head_dim();
  if (d % k != 0 || full.hidden % k != 0) return false;  // a head_dim of its own (Gemma 2) leaves h to divide too
  return full.style != Style::kLlama || (d / k) % 2 == 0;
}

// n/k rounded to the nearest integer, halves up, at least 1.
int64_t divide_rounded(int64_t n, int64_t k) { return std::max<int64_t>(1, (2 * n + k) / (2 * k)); }

}  // namespace

uint64_t per_row_charge(const ModelConfig& config, uint64_t bytes) {
  const auto k = static_cast<uint64_t>(config.shrink);
  return (bytes + k - 1) / k;
}

Buffer allocate_per_row(Device& device, const ModelConfig& config, size_t count, DType dtype, Category category,
                        std::string_view what) {
  return device.allocate(count, dtype, category, what, per_row_charge(config, count * dtype_size(dtype)));
}

ParameterCharge parameter_charge(const ModelConfig& config, std::span<const UnitLayout> units) {
  ParameterCharge charge;
  uint64_t vectors = 0;  // norm weights and biases: one dimension, ∝ h or F
  for (const UnitLayout& unit : units) {
    charge.held += unit.count;
    for (const ParamInfo& p : unit.params) {
      if (p.shape.size() < 2) vectors += p.count;
    }
  }
  charge.charged = double(charge.held - vectors) + double(vectors) / double(config.shrink);
  return charge;
}

size_t tensor_charge(const ModelConfig& config, const ParamInfo& param) {
  if (param.shape.size() >= 2 || config.shrink <= 1) return param.count;
  return static_cast<size_t>(std::llround(double(param.count) / double(config.shrink)));
}

size_t ParameterCharge::elements(size_t count) const {
  if (held == 0 || charged == double(held)) return count;
  return static_cast<size_t>(std::llround(double(count) * charged / double(held)));
}

Buffer allocate_parameter_space(Device& device, const ParameterCharge& charge, size_t count, DType dtype,
                                Category category, std::string_view what) {
  return device.allocate(count, dtype, category, what, charge.bytes(count, dtype));
}

std::vector<int64_t> valid_shrink_factors(const ModelConfig& full) {
  std::vector<int64_t> factors;
  for (int64_t k = 1; k <= full.head_dim(); ++k) {
    if (head_dim_allows(full, k)) factors.push_back(k);
  }
  return factors;
}

ModelConfig shrink(const ModelConfig& full, int64_t k) {
  full.validate();
  if (k < 1 || !head_dim_allows(full, k)) {
    throw InputError(
        fmt::format("shrink factor k = {} does not fit model {}: its head dimension {} = {} must stay a whole number{} "
                    "after dividing by k; valid k: {}",
                    k, full.name,
                    full.head_size != 0 ? fmt::format("head_dim (h = {} too)", full.hidden)
                                        : fmt::format("h/a = {}/{}", full.hidden, full.heads),
                    full.head_dim(), full.style == Style::kLlama ? " and even (rotary embedding rotates pairs)" : "",
                    fmt::join(valid_shrink_factors(full), ", ")));
  }
  ModelConfig s = full;
  s.name = fmt::format("{}/{}", full.name, k);
  s.hidden = full.hidden / k;
  s.head_size = full.head_size / k;
  s.query_scale = full.query_scale / double(k);  // the scale keeps its ratio to the head dimension
  s.ffn = divide_rounded(full.ffn, k);
  s.vocab = divide_rounded(full.vocab, k);
  s.seq = divide_rounded(full.seq, k);
  s.max_positions = divide_rounded(full.max_positions, k);
  s.shrink = full.shrink * k;
  s.validate();
  return s;
}

double step_flops(const ModelConfig& c) {
  const ParameterTerms terms = parameter_terms(c);
  const double T = double(c.tokens()), h = double(c.hidden), V = double(c.vocab);
  const double attention = 4 * double(c.batch) * double(c.seq) * double(c.seq) * double(c.q_dim());
  const double forward = 2 * T * (double(terms.block_matrices) + V * h) + double(c.layers) * attention;
  return 3 * forward;
}

int64_t default_shrink(const ModelConfig& full) {
  const std::vector<int64_t> valid = valid_shrink_factors(full);
  for (int64_t k : valid) {
    const ModelConfig shrunk = shrink(full, k);
    if (parameter_count(shrunk) <= kDefaultShrinkParams && step_flops(shrunk) <= kDefaultShrinkFlops) return k;
  }
  return valid.back();
}

ShrinkReport shrink_report(const ModelConfig& full, int64_t k, const ModelOptions& options) {
  ShrinkReport report;
  report.full = full;
  report.shrunk = shrink(full, k);
  report.k = k;
  const ParameterTerms pf = parameter_terms(full), ps = parameter_terms(report.shrunk);
  const double e = double(dtype_size(options.compute));
  const double k1 = double(k);
  report.terms = {
      {"parameters as charged", e * double(pf.total()),
       e * (double(ps.block_matrices + ps.embeddings) + double(ps.vector_params) / k1)},
      {"  block matrices", e * double(pf.block_matrices), e * double(ps.block_matrices)},
      {"  norm weights, biases (charged / k)", e * double(pf.vector_params), e * double(ps.vector_params) / k1},
      {"  embeddings, head, positions", e * double(pf.embeddings), e * double(ps.embeddings)},
      {"saved activations per block", double(saved_activation_bytes_per_block(full, options)),
       double(saved_activation_bytes_per_block(report.shrunk, options))},
      {"logits (fp32)", double(logits_bytes(full, options)), double(logits_bytes(report.shrunk, options))},
      {"parameters on the wire (as held)", e * double(pf.total()), e * double(ps.total()), false},
  };
  return report;
}

const ShrinkTerm& ShrinkReport::worst_memory_term() const {
  const ShrinkTerm* worst = &terms.front();
  for (const ShrinkTerm& t : terms) {
    if (t.memory && std::abs(t.deviation(k)) > std::abs(worst->deviation(k))) worst = &t;
  }
  return *worst;
}

double ShrinkReport::wire_deviation() const {
  for (const ShrinkTerm& t : terms) {
    if (!t.memory) return t.deviation(k);
  }
  return 0;
}

std::string ShrinkReport::remaining() const {
  const ShrinkTerm& worst = worst_memory_term();
  std::string name = worst.name;
  name.erase(0, name.find_first_not_of(' '));
  return fmt::format(
      "memory is charged at full scale / k^2 (norm weights, biases and per-row statistics / k, collective slices "
      "/ k^2); what remains is the rounding of F, V and s to whole numbers: at most {:+.3f}% ({}). Bytes on the "
      "wire are the shrunk model's own: {:+.2f}% on parameter payloads (norm weights and biases)",
      100 * worst.deviation(k), name, 100 * wire_deviation());
}

std::string ShrinkReport::format() const {
  std::string out = fmt::format("{} shrunk by k = {} (memory terms scale by 1/k² = 1/{})\n", full.name, k, k * k);
  out += fmt::format("  {:<28} {:>12} {:>12}\n", "shape", "full", "shrunk");
  const std::pair<const char*, std::pair<int64_t, int64_t>> shapes[] = {
      {"hidden h", {full.hidden, shrunk.hidden}},
      {"FFN F", {full.ffn, shrunk.ffn}},
      {"vocabulary V", {full.vocab, shrunk.vocab}},
      {"sequence s", {full.seq, shrunk.seq}},
      {"positions", {full.max_positions, shrunk.max_positions}},
      {"layers L", {full.layers, shrunk.layers}},
      {"heads a", {full.heads, shrunk.heads}},
      {"kv heads", {full.kv_heads, shrunk.kv_heads}},
      {full.head_size != 0 ? "head dim (head_dim)" : "head dim h/a", {full.head_dim(), shrunk.head_dim()}},
      {"micro-batch b", {full.batch, shrunk.batch}},
  };
  for (const auto& [name, values] : shapes) {
    out += fmt::format("  {:<28} {:>12} {:>12}\n", name, values.first, values.second);
  }
  out += fmt::format("  {:<36} {:>16} {:>16} {:>16} {:>10}\n", "memory term", "full (B)", "shrunk (B)", "shrunk·k² (B)",
                     "deviation");
  for (const ShrinkTerm& t : terms) {
    out += fmt::format("  {:<36} {:>16.0f} {:>16.0f} {:>16.0f} {:>+9.3f}%\n", t.name, t.full, t.shrunk,
                       t.shrunk * double(k) * double(k), 100 * t.deviation(k));
  }
  out += fmt::format("  {}\n", remaining());
  return out;
}

}  // namespace emu::model
