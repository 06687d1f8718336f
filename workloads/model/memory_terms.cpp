#include "workloads/model/memory_terms.h"

#include "workloads/model/layout.h"
#include "workloads/model/shrink.h"

namespace emu::model {

uint64_t saved_activation_bytes_per_block(const ModelConfig& c, const ModelOptions& options) {
  const uint64_t e = dtype_size(options.compute);
  const uint64_t T = uint64_t(c.tokens()), h = uint64_t(c.hidden), F = uint64_t(c.ffn);
  if (options.checkpoint) return e * T * h;
  // Per-row statistics are charged at full scale ÷ k² in a shrunk run (shrink.h): each buffer bytes / k, rounded up.
  const uint64_t attention = options.attention == Attention::kClassic
                                 ? e * uint64_t(c.batch * c.heads) * uint64_t(c.seq * c.seq)
                                 : per_row_charge(c, 4 * uint64_t(c.batch * c.heads * c.seq));
  if (c.style == Style::kLlama) {
    return e * T * (6 * h + 2 * uint64_t(c.kv_dim()) + 3 * F) + 2 * per_row_charge(c, 4 * T) + attention;
  }
  return e * T * (8 * h + 2 * F) + 2 * per_row_charge(c, 8 * T) + attention;
}

uint64_t logits_bytes(const ModelConfig& c) { return 4 * uint64_t(c.tokens()) * uint64_t(c.vocab); }

ParameterTerms parameter_terms(const ModelConfig& config) {
  ParameterTerms terms;
  const std::vector<UnitLayout> units = build_layouts(config);
  for (size_t u = 0; u < units.size(); ++u) {
    for (const ParamInfo& p : units[u].params) {
      if (p.shape.size() < 2) {
        terms.vector_params += p.count;
      } else if (u == 0) {
        terms.embeddings += p.count;
      } else {
        terms.block_matrices += p.count;
      }
    }
  }
  return terms;
}

uint64_t saved_activation_bytes(const ModelConfig& config, const ModelOptions& options) {
  return saved_activation_bytes_per_block(config, options) * static_cast<uint64_t>(config.layers) +
         logits_bytes(config);
}

}  // namespace emu::model
