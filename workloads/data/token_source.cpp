#include "workloads/data/token_source.h"

#include "emu/check.h"

namespace emu::data {

Batch TokenSource::batch(int64_t step, int64_t first, int64_t batch) const {
  EMU_CHECK(batch >= 0 && first >= 0, "batch of {} samples from sample {}", batch, first);
  Batch result;
  result.batch = batch;
  result.seq_len = seq_len();
  const auto s = static_cast<size_t>(seq_len());
  result.tokens.resize(static_cast<size_t>(batch) * s);
  result.targets.resize(static_cast<size_t>(batch) * s);
  for (int64_t i = 0; i < batch; ++i) {
    const size_t row = static_cast<size_t>(i) * s;
    sample(step, first + i, std::span(result.tokens).subspan(row, s), std::span(result.targets).subspan(row, s));
  }
  return result;
}

}  // namespace emu::data
