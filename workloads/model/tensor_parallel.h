// The model's side of tensor parallelism (strategies/tensor_parallel.cpp, `tp`), as Megatron-LM splits a
// transformer (core/tensor_parallel/layers.py, mappings.py, cross_entropy.py): every rank of a TP group of t holds
// a slice of every matrix and runs the same tokens.
//
//   q, k, v, gate, up   column-parallel: rank r holds heads [r·a/t, (r+1)·a/t) (kv heads alike) and FFN rows
//                       [r·F/t, (r+1)·F/t); its output is its own heads' / rows' columns, nothing to reduce
//   o, down             row-parallel: the matching input columns; each rank's product is a partial sum, all-reduced
//                       before the residual add (Megatron's g operator: all-reduce in forward, identity in backward)
//   column inputs       the gradients of the norm outputs feeding q/k/v and gate/up are partial sums: all-reduced in
//                       backward (f operator: identity in forward, all-reduce in backward)
//   embedding           vocabulary-parallel (VocabParallelEmbedding): rank r holds rows [r·V'/t, (r+1)·V'/t) of the
//                       padded vocabulary V'; tokens outside its slice look up zeros; the output is all-reduced
//   LM head             vocabulary-parallel too (a ColumnParallelLinear over V', its input's gradient all-reduced,
//                       f); a tied head is the rank's embedding slice itself, as Megatron ties them within a rank
//   loss                vocab_parallel_cross_entropy: the row maximum all-reduced (max), then the target's logit
//                       and Σ exp(logit − max) all-reduced (sum): three all-reduces of [T] fp32 per micro-batch
//   norms               replicated: every rank normalises the same full hidden state, so their gradients come out
//                       identical on every rank (nothing to reduce; counted once in the gradient norm)
//
// GPT-2 (Megatron's GPT: its fused query_key_value, RowParallelLinear with bias, learned position embeddings), in
// Hugging Face's Conv1D layout [in, out]:
//   attn.c_attn         column-parallel by output columns, block by block: rank r holds q, k and v heads
//                       [r·a/t, (r+1)·a/t) each, [h, 3h/t] as [q_r | k_r | v_r]; its bias [3h] split the same way
//   mlp.c_fc            column-parallel: output columns [r·F/t, (r+1)·F/t), its bias likewise
//   attn.c_proj,        row-parallel: input rows (the matching heads' columns, the FFN slice); their biases whole
//   mlp.c_proj          on every rank and added once, after the all-reduce (RowParallelLinear adds its bias to the
//                       reduced output), so their gradients, Σ over the rows of the replicated output gradient, are
//                       identical on every rank: replicated, counted once in the gradient norm
//   ln_1, ln_2, ln_f    whole on every rank, replicated as the norms above
//   wte                 vocabulary-parallel over the padded V' (the tied LM head is the rank's rows)
//   wpe                 whole on every rank (Megatron's position_embeddings is a plain embedding): added to the
//                       all-reduced token embedding, its gradient the whole output gradient's, replicated
//
// Sequence parallelism (ModelOptions::sequence_parallel, Megatron's --sequence-parallel; Korthikanti et al. 2022 §4.2;
// core/tensor_parallel/mappings.py, layers.py): the residual stream and the norms run on this rank's rows
// [r·T/t, (r+1)·T/t) of the T = b·s, so everything the norms save and the block inputs are 1/t:
//   row-parallel outputs   reduce-scattered along the rows instead of all-reduced (reduce_scatter_to_sequence_
//                          parallel_region); in backward the gradient is all-gathered (its backward)
//   column-parallel inputs the norm output all-gathered before q/k/v and gate/up and saved as the rank's slice: in
//                          backward it is all-gathered again for the weight gradients, and the input gradient's
//                          partial sums are reduce-scattered (LinearWithGradAccumulationAndAsyncCommunication)
//   embedding              its output reduce-scattered (VocabParallelEmbedding with reduce_scatter_embeddings); the
//                          gradient all-gathered in backward
//   final norm and head    the norm on the slice; the head's input all-gathered, again in backward, and its input
//                          gradient reduce-scattered
//   norm weights           each rank's gradient covers its rows only: the strategy all-reduces them over the group
//                          once per step (Megatron marks them sequence_parallel; finalize_model_grads)
// Megatron's activations are [s, b, h], so its rows are a sequence slice; emu's are [b, s] (batch-major), so the
// contiguous 1/t of them is a sequence slice at b = 1 and b·s/t whole tokens in general: the norms and the residual
// adds work token by token, so the numbers and the bytes are the same. s must be divisible by t, as in Megatron.
//
// The model runs this split by taking the rank's local shapes as its config (tensor_parallel_config: a/t heads,
// kv/t kv heads of the same head dimension, F/t, V'/t) and calling the TensorParallel interface at the reduction
// points above. The vocabulary is padded as Megatron pads it (--make-vocab-size-divisible-by 128, times t:
// training.py _vocab_size_with_padding); at shrink k the multiple is t·⌈128/k⌉, so that the padding scales with
// the vocabulary. The padded rows are real rows of the head: their logits take part in the softmax, as in Megatron.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "emu/device.h"
#include "workloads/model/config.h"
#include "workloads/model/layout.h"

namespace emu::model {

// The TP group, as the model sees it; implemented by the strategy over its communicator.
class TensorParallel {
 public:
  virtual ~TensorParallel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Σ over the group of `buffer`, in place, at its dtype (no data on a shapes-only device: the bytes are counted).
  virtual void all_reduce(Buffer& buffer, std::string_view what) = 0;
  // Σ (or max) over the group of `count` fp32 values (the parallel cross-entropy's per-row statistics); `values`
  // is host memory, null on a shapes-only device.
  virtual void all_reduce_rows(float* values, size_t count, bool max, std::string_view what) = 0;
  // Sequence parallelism: Σ over the group of `full` [T, h], this rank receiving its rows into `slice` [T/t, h].
  virtual void reduce_scatter(const Buffer& full, Buffer& slice, std::string_view what) = 0;
  // Sequence parallelism: every rank's `slice` [T/t, h] gathered into `full` [T, h], in rank order.
  virtual void all_gather(const Buffer& slice, Buffer& full, std::string_view what) = 0;
};

// The multiple Megatron pads the vocabulary to at TP t and shrink k: 128·t at full scale, t·⌈128/k⌉ shrunk.
int64_t tp_vocab_multiple(int tp, int64_t shrink);
// V' = V rounded up to tp_vocab_multiple.
int64_t tp_padded_vocab(const ModelConfig& config, int tp);

// InputError (the bad value and the accepted ones) unless `config` can be split over t ranks: attention heads and
// kv heads divisible by t, the FFN divisible by t.
void check_tensor_parallel(const ModelConfig& config, int tp);

// InputError unless sequence parallelism can run over t ranks: the sequence length divisible by t (Megatron splits
// [s, b, h] along s), a Llama-style model without Gemma 2's sandwich norms (GPT-2's positions and row-parallel
// biases, Gemma 2's extra norms are not split along the sequence yet) and a recipe without autocast.
void check_sequence_parallel(const ModelConfig& config, const ModelOptions& options, int tp);

// One rank's shapes under TP t: a/t heads, kv/t kv heads with the head dimension kept, F/t, V'/t (checked first).
ModelConfig tensor_parallel_config(const ModelConfig& config, int tp);

// For each element of the local tensor `local` of TP rank `rank` of t, the element of the full tensor `full` (same
// name) it holds, or −1 for a padding row of the vocabulary. Column-parallel tensors (q, k, v, gate, up and their
// biases, Phi-3's fused qkv_proj and gate_up_proj block by block, embeddings, LM head) are split by rows,
// row-parallel ones (o_proj, down_proj) by columns, norm weights are whole; GPT-2's Conv1D [in, out] the other way
// round (c_attn by columns block by block, c_fc by columns, both c_proj by rows; their biases whole), wpe whole.
// `config`: the full (unsplit) shapes.
std::vector<int64_t> tensor_parallel_index(const ModelConfig& config, const ParamInfo& full, const ParamInfo& local,
                                           int rank, int tp);

}  // namespace emu::model

namespace emu::model {

// Megatron's vocab_parallel_cross_entropy on this rank's logits [rows, vocab] (fp32, host memory; columns are
// vocabulary entries [begin, begin + vocab) of the padded vocabulary), targets [rows] in the full vocabulary: the
// row maximum all-reduced (max), then the target's logit (on the rank holding it, 0 elsewhere) and Σ exp(logit −
// max) all-reduced (sum). Returns Σ_rows (log Σexp + max − target logit), the same on every rank, and turns the
// logits in place into (softmax − onehot)·grad_scale, as Ops::cross_entropy does. With null logits (shapes-only)
// only the three all-reduces are made.
double vocab_parallel_cross_entropy(TensorParallel& tp, float* logits, const int32_t* targets, int64_t rows,
                                    int64_t vocab, int64_t begin, float grad_scale);

// VocabParallelEmbedding's input mask: each token as a row of this rank's slice [begin, begin + vocab), or row 0
// where the token lies outside it (`outside` set to 1 there, 0 elsewhere): the looked-up row is then zeroed.
void vocab_parallel_tokens(const int32_t* tokens, int64_t rows, int64_t vocab, int64_t begin, int32_t* local,
                           std::vector<uint8_t>& outside);

}  // namespace emu::model
