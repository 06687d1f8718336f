// Pipeline parallelism's stage split (strategies/pipeline.cpp, `pp`): which blocks each of P stages runs.
//
// The L blocks are cut into P contiguous, non-empty stages balanced by parameter count, as DeepSpeed's
// PipelineModule(partition_method="parameters") balances them (runtime/pipe/module.py, ds_utils.partition_balanced):
// the split that makes the heaviest stage lightest, where the first stage also carries the embeddings and the
// last the final norm and the LM head (and, tied, its own copy of the embedding, as Megatron-LM's last stage keeps
// one: core/models/common/language_module.py, setup_embeddings_and_output_layer).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace emu::strategy {

struct StageBlocks {
  int first = 1;  // blocks first..last, 1-based
  int last = 1;
};

// P stages over blocks of the given weights (parameters of block 1..L, in order), the first stage also weighing
// `first_extra` and the last `last_extra`. Among equally heavy splits, the one giving earlier stages more blocks.
// Needs 1 ≤ P ≤ L.
std::vector<StageBlocks> balance_stages(std::span<const uint64_t> block_weights, uint64_t first_extra,
                                        uint64_t last_extra, int stages);

// The bubble of a synchronous pipeline schedule (GPipe and 1F1B alike): (P − 1)/(M + P − 1) of a step idle.
double bubble_fraction(int stages, int micro_batches);

}  // namespace emu::strategy
