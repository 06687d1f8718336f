#include "collectives/tools/teach_layer.h"

#include <fmt/format.h>

#include <algorithm>

#include "collectives/verify.h"
#include "emu/check.h"

namespace emu::coll::teach {

std::vector<LayerCall> layer_calls(bool sequence_parallel) {
  using K = CollectiveKind;
  if (!sequence_parallel) {
    return {
        {"forward", K::kAllReduce,
         "o_proj output: each rank's heads' partial sum of attn·Wo (g), before the residual add"},
        {"forward", K::kAllReduce, "down_proj output: each rank's F/t rows' partial sum (g), before the residual add"},
        {"backward", K::kAllReduce, "gate_proj/up_proj input gradient: each rank's partial sum (f), into the norm"},
        {"backward", K::kAllReduce, "q/k/v_proj input gradient: each rank's partial sum (f), into the norm"},
    };
  }
  return {
      {"forward", K::kAllGather, "input_layernorm output, the ranks' T/t rows gathered for q/k/v"},
      {"forward", K::kReduceScatter, "o_proj output's partial sums, each rank keeping its T/t rows"},
      {"forward", K::kAllGather, "post_attention_layernorm output, gathered for gate/up"},
      {"forward", K::kReduceScatter, "down_proj output's partial sums, each rank keeping its T/t rows"},
      {"backward", K::kAllGather, "d layer output, gathered for down_proj (the reduce-scatter's backward)"},
      {"backward", K::kAllGather, "post_attention_layernorm output again, for gate/up's weight gradients"},
      {"backward", K::kReduceScatter, "gate_proj/up_proj input gradient's partial sums, to the rank's rows"},
      {"backward", K::kAllGather, "d residual after attention, gathered for o_proj"},
      {"backward", K::kAllGather, "input_layernorm output again, for q/k/v's weight gradients"},
      {"backward", K::kReduceScatter, "q/k/v_proj input gradient's partial sums, to the rank's rows"},
  };
}

void check_layer_shape(const LayerShape& shape, int t) {
  const auto positive = [](int64_t value, std::string_view flag) {
    if (value < 1) throw InputError(fmt::format("{} {}: expected 1 or more", flag, value));
  };
  positive(shape.batch, "--batch");
  positive(shape.seq, "--seq");
  positive(shape.hidden, "--hidden");
  if (shape.hidden % t != 0) {
    throw InputError(
        fmt::format("--hidden {} over {} ranks: each rank holds h/t columns of its heads; accepted: a multiple of {}",
                    shape.hidden, t, t));
  }
  if (shape.sequence_parallel && shape.seq % t != 0) {
    throw InputError(fmt::format(
        "--seq {} with --sequence-parallel over {} ranks: Megatron splits the sequence; accepted: a multiple of {}",
        shape.seq, t, t));
  }
}

namespace {

size_t elements(const LayerShape& shape) { return static_cast<size_t>(shape.batch * shape.seq * shape.hidden); }

// The ring's bytes per rank for one call of payload S over t ranks: 2(t − 1)/t·S for an all-reduce, (t − 1)/t·S
// for a reduce-scatter or an all-gather (exact: t divides the elements).
uint64_t ring_sent(CollectiveKind kind, uint64_t payload, int t) {
  const uint64_t share = payload / static_cast<uint64_t>(t) * static_cast<uint64_t>(t - 1);
  return kind == CollectiveKind::kAllReduce ? 2 * share : share;
}

}  // namespace

LayerMeasured run_layer(Communicator& comm, Device& device, const LayerShape& shape, int rank) {
  const int t = comm.size();
  const std::vector<LayerCall> calls = layer_calls(shape.sequence_parallel);
  LayerMeasured measured;
  for (size_t i = 0; i < calls.size(); ++i) {
    const CollectiveKind kind = calls[i].kind;
    // The all-reduce's buffer is the whole [b·s, h]; a reduce-scatter's and an all-gather's count is a rank's block.
    const size_t count = kind == CollectiveKind::kAllReduce ? elements(shape) : elements(shape) / size_t(t);
    VerifiedCase c(device, kind, shape.dtype, ReduceOp::kSum, count, {}, 0, false, rank, t);
    Call call = c.call();
    const std::string phase = fmt::format("tp layer call {}", i + 1);
    call.phase = phase;
    comm.run(call);
    measured.wrong += c.wrong();
    const LedgerEntry entry = comm.ledger().entries().at({kind, phase});
    measured.sent.push_back(entry.moved.sent);
    measured.received.push_back(entry.moved.received);
  }
  return measured;
}

std::string format_layer(const LayerShape& shape, int t, const std::string& algorithm,
                         const std::vector<std::vector<uint64_t>>& sent, uint64_t wrong, bool& agrees) {
  const uint64_t e = dtype_size(shape.dtype), payload = elements(shape) * e;
  const std::vector<LayerCall> calls = layer_calls(shape.sequence_parallel);
  std::string out = fmt::format(
      "one tensor-parallel transformer layer over t = {} ranks (Megatron-LM), b = {}, s = {}, h = {}, {}{}\n"
      "  S = b·s·h·e = {}·{}·{}·{} = {} B: the [b·s, h] tensor every collective below carries\n\n",
      t, shape.batch, shape.seq, shape.hidden, dtype_name(shape.dtype),
      shape.sequence_parallel ? ", sequence parallel" : "", shape.batch, shape.seq, shape.hidden, e, payload);
  out +=
      "column-parallel (ColumnParallelLinear: weight split by output rows; input whole on every rank; output the\n"
      "  rank's own columns, nothing to reduce in forward):\n"
      "    q_proj, k_proj, v_proj   each rank a/t heads (h/t columns of q, k, v)\n"
      "    gate_proj, up_proj       each rank F/t rows\n"
      "  backward: each rank's input gradient is a partial sum over its columns: reduced (f)\n"
      "row-parallel (RowParallelLinear: weight split by input columns; input the rank's own slice; output a partial\n"
      "  sum over the ranks, reduced before the residual add (g)):\n"
      "    o_proj                   input columns of the rank's heads\n"
      "    down_proj                input columns of the rank's F/t rows\n\n";
  out += fmt::format("  # pass      collective      S (B)  sent per rank (B)  ring: {} (B)  what\n",
                     shape.sequence_parallel ? "(t-1)/t·S" : "2(t-1)/t·S");
  uint64_t total = 0, total_model = 0;
  agrees = true;
  for (size_t i = 0; i < calls.size(); ++i) {
    const uint64_t model = ring_sent(calls[i].kind, payload, t);
    uint64_t low = sent[0][i], high = sent[0][i];
    for (const std::vector<uint64_t>& rank : sent) {
      low = std::min(low, rank[i]);
      high = std::max(high, rank[i]);
    }
    const bool same = low == model && high == model;
    agrees = agrees && same;
    const std::string measured = low == high ? fmt::format("{}", low) : fmt::format("{}..{}", low, high);
    out += fmt::format("{:>3} {:<9} {:<14} {:>6}  {:>17}  {:>13}{}  {}\n", i + 1, calls[i].pass,
                       kind_name(calls[i].kind), payload, measured, model, same ? "" : " DIFFERS", calls[i].what);
    total += sent[0][i];
    total_model += model;
  }
  const uint64_t activation = payload / (shape.sequence_parallel ? static_cast<uint64_t>(t) : 1);
  if (!shape.sequence_parallel) {
    out += fmt::format(
        "\nper layer: 2 all-reduces in forward, 2 in backward: 4 · 2(t-1)/t · S = 4 · 2·{}/{} · {} = {} B sent per "
        "rank; measured (rank 0) {} B\n",
        t - 1, t, payload, total_model, total);
  } else {
    out += fmt::format(
        "\nper layer: each all-reduce replaced by a reduce-scatter and an all-gather of the same S, (t-1)/t · S each: "
        "4 pairs = 4 · 2(t-1)/t · S = {} B, the all-reduces' bytes; plus 2 all-gathers of the saved 1/t inputs for "
        "the weight gradients, 2 · (t-1)/t · S = {} B: {} B sent per rank; measured (rank 0) {} B\n",
        4 * ring_sent(CollectiveKind::kAllReduce, payload, t), 2 * ring_sent(CollectiveKind::kAllGather, payload, t),
        total_model, total);
  }
  out += fmt::format(
      "activations between the layers (the residual stream, each norm's input and output): [{}, h] per rank, {} B "
      "each{}\n",
      shape.sequence_parallel ? "b·s/t" : "b·s", activation,
      shape.sequence_parallel ? " (1/t: the norms run on the rank's T/t rows)" : " (whole on every rank)");
  out += fmt::format("algorithm: {}; bytes: {}\n", algorithm,
                     agrees ? "as the ring's closed form" : "DISAGREE with the ring's closed form");
  out += fmt::format("result: {}\n", wrong == 0 ? "correct on every rank" : fmt::format("{} wrong elements", wrong));
  return out;
}

}  // namespace emu::coll::teach
