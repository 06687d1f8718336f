// A second estimator of per-rank model-state memory, used only by tests (DESIGN §4b). It is written from the
// ZeRO paper (Rajbhandari et al. 2020, §5: 2Ψ + 2Ψ + KΨ, K = 12, divided by N as each stage partitions more)
// and from what PyTorch DDP, DeepSpeed ZeRO and PyTorch FSDP1 document and allocate, and it takes nothing but the
// model's shapes and the knobs: it includes nothing from strategies/ and counts parameters with its own formulas,
// so that its agreement with emu's measurement means something.
//
// Grain: the model's units (the root — embeddings, final norm, head — then one unit per block) are the modules
// the frameworks fetch, wrap and bucket, and the root's backward encloses every block's (the model's hook order:
// the head's gradients come first, the embeddings' last). Within a unit the oracle does not go down to single
// tensors except to count them, to split the root's gradients into the head's and the embeddings', and for
// ZeRO-2's one .grad at a time.
//
// Per rank, Ψ parameters, N ranks, k the shrink factor (every full-scale bucket and threshold size / k²):
//   DDP      parameters Ψ·p, gradients Ψ·g, bucket copies Ψ·g unless gradient_as_bucket_view (the Reducer's
//            buckets hold every gradient once; 25 MiB and a 1 MiB first bucket change their number, not their
//            sum), master and Adam over Ψ; mixed precision is autocast over fp32 (p = g = 4, no master). ddp-zero
//            (ZeroRedundancyOptimizer): the same, with Adam over rank 0's whole tensors (greedy, largest first)
//   zero0    DeepSpeed without ZeRO (stage 0, FP16_UnfusedOptimizer over torch AdamW): parameters Ψ·p, gradients
//            Ψ·g plus Ψ·4 of fp32 .grads at step() (when g is not 4), master and Adam over Ψ, AdamW's step
//            temporaries, and the largest flat copy of its all-reduce buckets (tensors in order, closed past
//            500,000,000 / k² elements)
//   ZeRO-1   DeepSpeed flattens the bit16 parameters into one group aligned to 2·N elements
//            (nccl_start_alignment_factor = 2): P = Ψ rounded up to 2N, S = P/N. parameters P·p, gradients Ψ·g
//            (autograd's .grad per tensor) plus, when the gradient partition S (made at the first
//            reduction) comes before F elements of .grad were copied into the bucket and dropped, S − F; reduce
//            bucket R·g (the ipg buffer of reduce_bucket_size elements that backward allocates with
//            contiguous_gradients, two with overlap_comm), master and Adam over S
//   ZeRO-2   as ZeRO-1, but gradients S·g (grads_in_partition) plus the .grad autograd makes before DeepSpeed's
//            hook copies it into the bucket: one tensor at a time (a tied head's kept until the end of backward)
//   both     at step() DeepSpeed flattens the partition into a new buffer and casts it to fp32
//            (flatten(averaged_gradients).to(fp32)): S·g + S·g + S·4 at once, the gradients' peak when larger
//   ZeRO-3   every unit padded to N (P_u), partition P_u/N; parameters Σ P_u/N·p plus the units gathered at the
//            peak of a simulated step (fetch before use, release after, persistent units of at most
//            stage3_param_persistence_threshold elements kept, prefetch of following units while they fit in
//            stage3_prefetch_bucket_size and under stage3_max_live_parameters; a block kept from its forward to
//            its backward when the elements used in between, the later blocks and the final norm and LM head
//            (V·h, tied or not), each twice, are fewer than stage3_max_reuse_distance: DeepSpeed's
//            partitioned_param_coordinator.py __params_to_release, for the block's last module); gradients Σ P_u/N·g
//            plus the largest tensor's .grad (one at a time, copied into the ipg bucket and dropped), or at
//            step() (stage3.py, one sub-group at a time: tensors in registration order, each partitioned on its own
//            (⌈t/N⌉), until they hold sub_group_size partition elements) the largest sub-group's gradients flattened
//            and cast to fp32, S_g·(g + 4) (S_g·4 when g is 4), whichever is more; master and Adam over Σ P_u/N; the
//            ipg bucket R·g (stage3.py allocates one per communication dtype at set-up and keeps it, overlap_comm or
//            not)
//   FSDP1    one FlatParameter per unit padded to a multiple of the shard group M (world, 1, or a node); the fp32
//            sharded flat parameter is the master copy (4·Σ P_u/M), the gradient shard is fp32 in the mixed recipe,
//            Adam over Σ P_u/M, each gradient shard made by its unit's reduce-scatter (beside the unit's unsharded
//            gradients and the root's head part, whose embeddings' part comes last; a unit's parameters' gradients
//            are views' until its backward ends, then concatenated beside them into its FlatParameter's .grad, which
//            is reduce-scattered into a P_u/M output at the gradient dtype); parameters are
//            the low-precision unsharded units alive at the peak: the root (not resharded after forward) and two
//            blocks (BACKWARD_PRE), one without prefetch or with BACKWARD_POST (resharded before the next is
//            gathered), all for SHARD_GRAD_OP, none when M = 1; in the mixed recipe,
//            plus the low-precision shard FSDP makes for each all-gather and frees when it ends (_mp_shard: the shard
//            of the block completing the window, or the root's when the root is gathered alone and that is more), and
//            for NO_SHARD the low-precision copy FSDP keeps (it frees _mp_shard only for sharded strategies).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace emu::oracle {

enum class Family : uint8_t { kLlama, kGpt2 };

// The model, by its shapes alone.
struct Shapes {
  Family family = Family::kLlama;
  int64_t h = 0;           // hidden
  int64_t ffn = 0;         // F
  int64_t vocab = 0;       // V
  int64_t positions = 0;   // GPT-2's learned position rows
  int64_t layers = 0;      // L
  int64_t heads = 0;       // a
  int64_t kv_heads = 0;    // grouped-query attention (Llama); a for GPT-2
  bool tied_head = false;  // the head reuses the embedding (GPT-2)
};

// Tensor sizes of one unit, as the frameworks see them (unit 0 the root, then the blocks).
std::vector<uint64_t> root_tensors(const Shapes& shapes);
std::vector<uint64_t> block_tensors(const Shapes& shapes);
std::vector<uint64_t> unit_counts(const Shapes& shapes);  // [1 + L]
uint64_t parameter_count(const Shapes& shapes);
// Elements of the root's gradients that autograd makes only when backward reaches the embeddings, its last step:
// the token table (tied to the head too: autograd holds the head's part apart and makes the .grad from the sum of
// both uses' parts at the end), and GPT-2's learned positions. The rest (an untied head, the final norm) are made
// when backward begins.
uint64_t late_root_gradients(const Shapes& shapes);
// DeepSpeed's grads_in_partition for partition `rank` of a flat group of `order` (tensor sizes in registration order)
// cut into shards of `shard` elements: the numel of every tensor meeting [rank·shard, (rank + 1)·shard), summed.
inline uint64_t whole_tensors_meeting(const std::vector<uint64_t>& order, uint64_t shard, uint64_t rank) {
  const uint64_t lo = shard * rank, hi = lo + shard;
  uint64_t at = 0, whole = 0;
  for (const uint64_t t : order) {
    if (at < hi && at + t > lo) whole += t;
    at += t;
  }
  return whole;
}
// Every parameter tensor in the order the Hugging Face module registers them (DeepSpeed's flat groups' and
// sub-groups' order): the embeddings, the blocks, the final norm, an untied head.
std::vector<uint64_t> registration_order(const Shapes& shapes);
// Elements of DeepSpeed's ZeRO-1/2 gradient partition (stage_1_and_2.py copy_grads_in_partition's
// grads_in_partition) on `rank` of `n`: the numel of params_in_partition summed, every tensor that meets the rank's
// S elements whole, the tensors in registration order (the embeddings, the blocks, the final norm, an untied head)
// over the flat group padded to 2N.
uint64_t grads_in_partition(const Shapes& shapes, uint64_t n, uint64_t rank);
// The final norm and the LM head (V·h, tied or not): the elements the modules after the last block use.
uint64_t head_elements(const Shapes& shapes);

enum class Prefetch : uint8_t { kBackwardPre, kBackwardPost, kNone };

// The strategy and its knobs, as the frameworks state them (full scale), and the precision's bytes.
struct Knobs {
  std::string strategy;  // ddp, ddp-zero, zero0, zero1, zero2, zero3, fsdp, fsdp-grad-op, fsdp-no-shard, fsdp-hybrid
  int world = 1;
  int ranks_per_node = 1;  // HYBRID_SHARD's shard group
  int rank = 0;            // the rank estimated for (ddp-zero's ranks own different whole tensors)
  int64_t shrink = 1;      // k
  // Precision: bytes of the compute parameters and gradients; fp32 master weights or not; Adam moment bytes.
  uint64_t param_bytes = 2, grad_bytes = 2, moment_bytes = 4;
  bool master = true;
  // PyTorch DDP.
  bool gradient_as_bucket_view = false;
  // torch.optim.AdamW (DDP, FSDP): "foreach" (PyTorch's default), "single" or "fused".
  std::string adamw = "foreach";
  // DeepSpeed, in elements.
  uint64_t reduce_bucket_size = 500'000'000;
  bool overlap_comm = false;
  bool contiguous_gradients = true;
  uint64_t prefetch_bucket_size = 50'000'000;
  uint64_t param_persistence_threshold = 100'000;
  uint64_t max_live_parameters = 1'000'000'000;
  uint64_t max_reuse_distance = 1'000'000'000;
  uint64_t sub_group_size = 1'000'000'000;
  bool checkpoint = false;  // ZeRO-3: each block's forward runs again in its backward, its parameters fetched again
  // PyTorch FSDP.
  Prefetch backward_prefetch = Prefetch::kBackwardPre;
  bool forward_prefetch = false;
};

// One named contribution, for tables and for naming what makes a figure differ from the paper's.
struct Term {
  std::string category;  // "parameters", "gradients", "master_weights", "optimizer_state", "buckets"
  std::string name;
  uint64_t bytes = 0;
};

// Per-rank peak bytes by category (each category's own peak).
struct Estimate {
  uint64_t parameters = 0, gradients = 0, master_weights = 0, optimizer_state = 0, buckets = 0;
  std::vector<Term> terms;  // what each category is made of, by name
  uint64_t model_states() const { return parameters + gradients + master_weights + optimizer_state; }
  uint64_t by_category(const std::string& category) const;
};

Estimate estimate(const Shapes& shapes, const Knobs& knobs);

// A full-scale size divided by k², at least 1 (as every shrunk bucket and threshold is).
uint64_t per_k2(uint64_t full_scale, int64_t shrink);
// `count` rounded up to a multiple of `multiple`.
uint64_t round_up(uint64_t count, uint64_t multiple);

}  // namespace emu::oracle
