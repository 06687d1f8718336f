// coll-teach --tp-layer: the collectives of one tensor-parallel transformer layer, run for real and explained.
//
// Megatron-LM splits a layer over a TP group of t ranks (Shoeybi et al. 2019, §3; core/tensor_parallel/layers.py,
// mappings.py): q, k, v and gate, up are column-parallel (each rank a/t heads and F/t FFN rows: its output is its
// own columns, nothing to reduce), o and down row-parallel (each rank's product a partial sum of the [b·s, h]
// output). So per layer:
//   forward   an all-reduce of the o_proj output and one of the down_proj output (Megatron's g)
//   backward  an all-reduce of the gradient of the gate/up input and one of the q/k/v input (Megatron's f)
// each of S = b·s·h·e bytes, a ring sending 2(t − 1)/t·S from every rank. With sequence parallelism (Korthikanti et
// al. 2022, §4.2) each all-reduce becomes a reduce-scatter and an all-gather of the same S ((t − 1)/t·S each: the
// same bytes on the wire), the norms and the residual stream hold T/t rows, and backward all-gathers the saved 1/t
// inputs of q/k/v and gate/up once more for their weight gradients (2 all-gathers more per layer).
//
// Every rank runs the layer's collectives in order on the world communicator (t = the world), on verifiable data
// of those sizes; the bytes each call sent are read from the ledger, not computed, and printed beside the ring's
// closed form.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/types.h"

namespace emu::coll::teach {

struct LayerShape {
  int64_t batch = 1;    // b
  int64_t seq = 8;      // s
  int64_t hidden = 16;  // h
  DType dtype = DType::kF32;
  bool sequence_parallel = false;
};

// One collective of the layer, in the order the layer makes them.
struct LayerCall {
  std::string pass;  // "forward" or "backward"
  CollectiveKind kind = CollectiveKind::kAllReduce;
  std::string what;  // the tensor it carries and why
};
std::vector<LayerCall> layer_calls(bool sequence_parallel);

// InputError unless the layer splits over t ranks: b, s, h at least 1, h divisible by t (a/t heads of h/t columns),
// and under sequence parallelism s divisible by t (Megatron splits [s, b, h] along s).
void check_layer_shape(const LayerShape& shape, int t);

// What this rank measured: per call, the bytes it sent and received (the ledger), and the wrong elements.
struct LayerMeasured {
  std::vector<uint64_t> sent, received;
  uint64_t wrong = 0;
};
LayerMeasured run_layer(Communicator& comm, Device& device, const LayerShape& shape, int rank);

// Rank 0's text: the split, each call with S, what every rank sent (sent[rank][call]) and the ring's closed form,
// the totals, the activations. `agrees` is set false when a rank's measured bytes differ from the closed form.
std::string format_layer(const LayerShape& shape, int t, const std::string& algorithm,
                         const std::vector<std::vector<uint64_t>>& sent, uint64_t wrong, bool& agrees);

}  // namespace emu::coll::teach
