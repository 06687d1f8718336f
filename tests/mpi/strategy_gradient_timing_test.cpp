// When each strategy makes and frees its gradients, against the frameworks' own order, from the tiny models' shapes
// by hand: the sequence of gradient allocations and frees of one step (mixed recipe, one micro-batch), as the
// device's timeline records them.
//
// What the frameworks do:
//   autograd (every PyTorch strategy, and DeepSpeed's .grad) makes a tensor's gradient when backward reaches the
//   tensor: the LM head's and then the final norm's first, after the loss's backward (the head's AccumulateGrad runs
//   once the head's backward has run, the final norm's once the norm's has), each block's tensor by
//   tensor as its backward reaches the op that reads it (AccumulateGrad; a linear's weight and bias from one addmm
//   backward), the embeddings' last (a head tied to the embedding is that tensor, used twice: autograd holds the
//   head's part in the input buffer of its AccumulateGrad, a temporary, and makes the .grad from the sum of both
//   parts at the end). zero_grad(set_to_none=True) frees them after the step.
//   DDP, ZeroRedundancyOptimizer, ZeRO-1: every .grad kept until the step or the reduction.
//   ZeRO-2 (stage_1_and_2.py, contiguous_gradients): the hook copies each .grad into the ipg bucket as soon as autograd
//   makes it and repoints .grad into the bucket: one tensor's at a time; a tied head makes none at the head (the final
//   norm's is the largest there). The partition (grads_in_partition) is made by the first reduction, freed at step().
//   FSDP1 (_flat_param.py's views, _runtime_utils.py _post_backward_hook, _reduce_grad): a unit's parameters are
//   views of its FlatParameter, so their gradients are made tensor by tensor as under DDP and held by autograd until
//   the unit's last; the views' split backward then concatenates them into the FlatParameter's .grad beside them
//   before they are freed; its reduce-scatter makes a bf16 output (the shard's size), cast into the fp32 sharded
//   gradient (_saved_grad_shard), and the output and the unsharded gradient are freed;
//   FSDP2 (foreach_reduce) likewise with per-parameter gradients, made tensor by tensor as under DDP, freed into the
//   reduce-scatter input (a bucket) before the sharded output is made.
// Frees that follow one another are compared as their sum (a unit's tensors freed together).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <string>
#include <vector>

#include "tests/mpi/strategy_harness.h"
#include "tests/oracle/memory_oracle.h"

namespace emu::testing {
namespace {

// The tiny models (strategy_harness.h tiny_config), by their shapes: h = 16, V = 37, two blocks.
struct Shapes {
  std::vector<int64_t> block_tensors;  // a block's tensors in the order backward makes their gradients
  std::vector<int64_t> head_tensors;   // likewise the root's tensors made at the head
  int64_t head;                        // root elements whose gradients are made at the head
  int64_t embeddings;                  // root elements whose gradients are made last
  int64_t block;                       // each block's elements
  int64_t largest_head;                // the largest tensor made at the head
  int64_t largest_block;               // the largest tensor of a block
  bool tied;
  std::vector<uint64_t> registration;  // every tensor in the module's registration order (DeepSpeed's flat group)
};
// Llama (untied): embed_tokens [37, 16] = 592, norm 16, lm_head 592 (root 1200: head 608, lm_head's then norm's,
// embeddings 592); a block
// q, o [16, 16], k, v [8, 16] (one KV head of 8), gate, up [44, 16], down [16, 44], two norms of 16: 2912. Backward
// order (modeling_llama.py, reversed): down_proj, up_proj (run after gate_proj in forward), gate_proj,
// post_attention_layernorm, o_proj, v_proj, k_proj, q_proj, input_layernorm.
// Registration order: embed_tokens, each block's q, k, v, o, gate, up, down, input_layernorm,
// post_attention_layernorm, then norm, lm_head.
const Shapes kLlama{
    {704, 704, 704, 16, 256, 128, 128, 256, 16}, {592, 16}, 608, 592, 2912, 592, 704, false, {592, 256, 128, 128, 256,
                                                                                              704, 704, 704, 16,  16,
                                                                                              256, 128, 128, 256, 704,
                                                                                              704, 704, 16,  16,  16,
                                                                                              592}};
// GPT-2 (tied): wte [37, 16] = 592 (the head), wpe [8, 16] = 128, ln_f 32 (root 752: head 32, the final norm's
// weight then bias, the largest 16; embeddings 720, wte's .grad made with wpe's at the end); a block
// ln_1 32, c_attn 768 + 48, attn c_proj 256 + 16, ln_2 32, c_fc 1024 + 64, mlp c_proj 1024 + 16: 3280. Backward
// order: mlp c_proj, c_fc, ln_2, attn c_proj, c_attn, ln_1, each weight then bias.
// Registration order: wte, wpe, each block's ln_1, c_attn, attn c_proj, ln_2, c_fc, mlp c_proj (weight, bias), ln_f.
const Shapes kGpt2{{1024, 16, 1024, 64, 16, 16, 256, 16, 768, 48, 16, 16},
                   {16, 16},
                   32,
                   720,
                   3280,
                   16,
                   1024,
                   true,
                   {592, 128, 16,  16, 768, 48, 256, 16, 16,   16, 1024, 64, 1024, 16,
                    16,  16,  768, 48, 256, 16, 16,  16, 1024, 64, 1024, 16, 16,   16}};

// DeepSpeed's grads_in_partition on `rank` of `n`, in elements (stage_1_and_2.py copy_grads_in_partition): every
// tensor that meets the rank's Ψ/N elements, whole (Ψ divides by 2N here).
int64_t grads_in_partition(const Shapes& s, int64_t n, int64_t rank) {
  const int64_t shard = (s.head + s.embeddings + 2 * s.block) / n;
  return static_cast<int64_t>(
      oracle::whole_tensors_meeting(s.registration, static_cast<uint64_t>(shard), static_cast<uint64_t>(rank)));
}

// The expected gradient-category changes of one step, in order, up to and including the embeddings' gradient (every
// unit here divides by 2 and 4 ranks: no padding). g: the gradient bytes; 4: the sharded gradients' (fp32).
std::vector<int64_t> expected_backward(const std::string& strategy, const Shapes& s, int64_t n) {
  const auto head = [&](int64_t bytes) {  // the head's tensors' gradients, one by one, at `bytes` per element
    std::vector<int64_t> d;
    for (const int64_t t : s.head_tensors) d.push_back(bytes * t);
    return d;
  };
  if (strategy == "ddp" || strategy == "ddp-zero") {  // autocast: fp32 .grad
    std::vector<int64_t> d = head(4);
    for (int b = 0; b < 2; ++b) {
      for (const int64_t t : s.block_tensors) d.push_back(4 * t);
    }
    d.push_back(4 * s.embeddings);
    return d;
  }
  if (strategy == "zero1") {
    std::vector<int64_t> d = head(2);
    d.insert(d.end(), {2 * s.block, 2 * s.block, 2 * s.embeddings});
    return d;
  }
  if (strategy == "zero2") {
    std::vector<int64_t> d = {2 * s.largest_head};
    d.push_back(-2 * s.largest_head);  // copied into the bucket within the head's backward
    for (int b = 0; b < 2; ++b) {
      d.push_back(2 * s.largest_block);
      d.push_back(-2 * s.largest_block);
    }
    d.push_back(2 * s.embeddings);
    d.push_back(-2 * s.embeddings);
    // The whole model fits in one bucket: its one reduction, after backward, makes the partition, sized for the
    // whole tensors meeting the rank's Ψ/N elements (a block's q_proj or ln_1 across a boundary counts on both sides).
    d.push_back(2 * grads_in_partition(s, n, world_rank()));
    return d;
  }
  if (strategy == "fsdp") {
    std::vector<int64_t> d = head(2);
    for (int b = 0; b < 2; ++b) {
      for (const int64_t t : s.block_tensors) d.push_back(2 * t);  // the views' gradients
      d.push_back(2 * s.block);                                    // their concatenation, the FlatParameter's .grad
      d.push_back(-2 * s.block);                                   // the views' freed
      d.push_back(2 * s.block / n);                                // the reduce-scatter's bf16 output
      d.push_back(4 * s.block / n);                                // cast into the fp32 shard
      d.push_back(-2 * s.block / n - 2 * s.block);                 // the output and the .grad freed
    }
    d.push_back(2 * s.embeddings);
    return d;
  }
  // fsdp2: the unsharded gradients freed into the reduce-scatter input before the output shard is made.
  std::vector<int64_t> d = head(2);
  for (int b = 0; b < 2; ++b) {
    for (const int64_t t : s.block_tensors) d.push_back(2 * t);
    d.push_back(-2 * s.block);
    d.push_back(4 * s.block / n);
  }
  d.push_back(2 * s.embeddings);
  return d;
}

class GradientTiming : public ::testing::TestWithParam<std::string> {};

TEST_P(GradientTiming, MadeWhenBackwardReachesThemAndFreedAfterTheStep) {
  const std::string& name = GetParam();
  const int64_t n = world_size();
  if (n != 2 && n != 4) GTEST_SKIP() << "the expected sizes assume units that divide by the ranks (2 or 4)";
  for (const auto& [style, shapes] : {std::pair{model::Style::kLlama, kLlama}, std::pair{model::Style::kGpt2, kGpt2}}) {
    const strategy::StrategyOptions options = test_options(name, optim::Recipe::kMixed);
    auto run = run_strategy(style, options, /*accumulation=*/1, /*steps=*/1);
    const MemoryPool& memory = run->device->memory();
    std::vector<int64_t> deltas;
    for (const TimelinePoint& point : memory.timeline()) {
      if (point.category != Category::kGradients || point.delta == 0) continue;
      if (point.delta < 0 && !deltas.empty() && deltas.back() < 0) {
        deltas.back() += point.delta;
      } else {
        deltas.push_back(point.delta);
      }
    }
    const std::vector<int64_t> want = expected_backward(name, shapes, n);
    ASSERT_GE(deltas.size(), want.size()) << name << ": " << fmt::format("{}", fmt::join(deltas, ", "));
    const std::vector<int64_t> got(deltas.begin(), deltas.begin() + static_cast<std::ptrdiff_t>(want.size()));
    EXPECT_EQ(got, want) << name << (shapes.tied ? " gpt2" : " llama") << ": got "
                         << fmt::format("{}", fmt::join(deltas, ", "));
    // Nothing is left after the step: zero_grad frees every .grad, DeepSpeed's step() ZeRO-1/2's partition.
    EXPECT_EQ(memory.in_use(Category::kGradients), 0u) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, GradientTiming,
                         ::testing::Values("ddp", "ddp-zero", "zero1", "zero2", "fsdp", "fsdp2"), [](const auto& test) {
                           std::string name = test.param;
                           for (char& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

}  // namespace
}  // namespace emu::testing
