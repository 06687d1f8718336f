// Per-parameter sharding on dim 0, as PyTorch FSDP2 (fully_shard) cuts each parameter
// (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, FSDPParam._init_sharded_param): torch.chunk on dim 0 over
// the N ranks, every chunk padded to the first chunk's ceil(rows / N) rows. A unit's tensors are not flattened into
// one buffer: each is padded on its own, so a unit's shard is Σ_p ceil(rows_p / N)·row_p elements, which is more
// than the flat ceil(n_u / N) whenever a dim 0 does not divide by N.
//
// A rank's shard of the unit is its chunk of every tensor, back to back in registration order; the all-gather
// output (_fsdp_collectives.py, foreach_all_gather) is the N shards rank after rank, and the copy-out
// (foreach_all_gather_copy_out) moves each rank's chunk of each tensor to its rows in the unsharded tensor:
//
//   tensors a [5, 2], b [3] over N = 2: chunks of 3 rows and 2 rows, shard S = 3·2 + 2 = 8
//   all-gather output  [ a rows 0-2 | b 0-1 ][ a rows 3-4, pad row | b 2, pad ]   (2·S = 16 elements)
//   unsharded          a rows 0-4, pad row | b 0-2, pad                           (padded: 16, real: 13)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "workloads/model/config.h"
#include "workloads/model/layout.h"

namespace emu::strategy {

// One tensor as FSDP2 shards it: its dim 0, its place in the unit's flat layout and what a shrunk run charges.
struct TensorRows {
  uint64_t rows = 0;       // dim 0 (as Hugging Face stores the tensor: GPT-2's Conv1D weights are [in, out])
  uint64_t count = 0;      // elements
  uint64_t offset = 0;     // first element in the unit's flat layout
  uint64_t charged = 0;    // elements a shrunk run charges the whole tensor for (model/shrink.h: ÷ k for 1-D)
  uint64_t full_rows = 0;  // dim 0 at full scale (rows · k): its padding to N is what a shrunk run charges

  uint64_t row_elements() const { return rows == 0 ? 0 : count / rows; }
};

// A unit's tensors in registration order, as a run of `config` charges them.
std::vector<TensorRows> tensor_rows(const model::ModelConfig& config, const model::UnitLayout& unit);

struct Dim0Tensor {
  TensorRows tensor;
  uint64_t chunk_rows = 0;    // ceil(rows / N): every rank's chunk, padding rows included
  uint64_t shard_offset = 0;  // where its chunk starts in a rank's shard of the unit
  int ranks = 1;

  uint64_t chunk_elements() const { return chunk_rows * tensor.row_elements(); }
  // Real rows of rank `rank`'s chunk: the last ranks' chunks are short or empty.
  uint64_t valid_rows(int rank) const;
  // What a shrunk run charges for one chunk and for all N (the padded tensor): the tensor's charge with the padding
  // its full-scale dim 0 gets, ceil(R / N)·N / R, so that shrunk × k² stays the full-scale bytes; as held at k = 1.
  uint64_t charged_chunk() const;
  uint64_t charged_padded() const;
};

// A unit's tensors sharded on dim 0 over `ranks` ranks.
struct Dim0Shards {
  std::vector<Dim0Tensor> tensors;
  uint64_t shard = 0;  // S: elements of one rank's shard, padding included
  int ranks = 1;

  uint64_t padded() const { return shard * static_cast<uint64_t>(ranks); }  // the all-gather output, N·S
  uint64_t charged_shard() const;   // S as a shrunk run charges it (each tensor's chunk on its own)
  uint64_t charged_padded() const;  // N·S likewise
};

Dim0Shards dim0_shards(std::span<const TensorRows> tensors, int ranks);
// The same padded tensors cut into `ranks` (a divisor of shards.ranks) larger chunks, each the chunks of
// shards.ranks / ranks consecutive ranks: FSDPParam.to_sharded_post_forward's slice of the padded unsharded tensor.
Dim0Shards coarser(const Dim0Shards& shards, int ranks);

}  // namespace emu::strategy
