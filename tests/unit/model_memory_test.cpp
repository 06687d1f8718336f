// What the allocator sees: saved activations per block against the closed form, shapes-only accounting of
// full-scale models, the 13B shrink check (shrunk peak × k² against the full-scale peak), and OOM phases.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "emu/device.h"
#include "emu/units.h"
#include "tests/support/paths.h"
#include "workloads/model/local_params.h"
#include "workloads/model/memory_terms.h"
#include "workloads/model/model.h"
#include "workloads/model/shrink.h"

namespace emu::model {
namespace {

// Measures, per block, how many activation bytes its forward leaves allocated.
class ActivationProbe final : public Hooks {
 public:
  explicit ActivationProbe(const MemoryPool& pool) : pool_(pool) {}
  void before_forward(int unit) override {
    if (unit > 0) start_ = pool_.in_use(Category::kActivations);
  }
  void after_forward(int unit) override {
    if (unit > 0) per_block.push_back(pool_.in_use(Category::kActivations) - start_);
  }
  std::vector<uint64_t> per_block;

 private:
  const MemoryPool& pool_;
  uint64_t start_ = 0;
};

std::vector<int32_t> tokens_for(const ModelConfig& c) {
  std::vector<int32_t> t(size_t(c.tokens()));
  for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t((i * 7 + 3) % size_t(c.vocab));
  return t;
}

// What each block's forward leaves allocated as activations over one training step: full scale on the shapes-only
// device, or with real math on the CPU. A block's net forward allocation is what it saves (its input was charged
// by the block before it and its output is the next block's input, both T·h at the compute dtype).
std::vector<uint64_t> measured_per_block(const ModelConfig& config, const ModelOptions& options, bool shapes_only) {
  auto device = shapes_only ? make_shapes_device({}) : make_cpu_device({});
  Model model(*device, config, options);
  LocalParams params(model, 1);
  ActivationProbe probe(device->memory());
  const std::vector<int32_t> tokens = tokens_for(config);
  model.step(tokens.data(), tokens.data(), probe);
  EXPECT_EQ(probe.per_block.size(), size_t(config.layers));
  return probe.per_block;
}

void expect_closed_form(const ModelConfig& config, const ModelOptions& options, bool shapes_only) {
  for (uint64_t measured : measured_per_block(config, options, shapes_only)) {
    EXPECT_EQ(measured, saved_activation_bytes_per_block(config, options))
        << config.name << " " << dtype_name(options.compute) << (options.autocast ? " autocast " : " ")
        << attention_name(options.attention) << (options.checkpoint ? " checkpointed" : "");
  }
}

TEST(ModelMemory, SavedActivationsPerBlockMatchTheClosedForm) {
  for (const char* name : {"llama2-7b", "llama2-70b", "gpt2-xl"}) {
    ModelConfig full = preset(name);
    full.batch = 2;
    // With real math too, on a shrunk copy cut to 3 layers to keep the test quick.
    ModelConfig small = shrink(full, 32);
    small.layers = 3;
    for (DType dt : {DType::kBF16, DType::kF32}) {
      for (bool autocast : {false, true}) {  // autocast: fp32 parameters under bf16 math (DDP's mixed recipe)
        if (autocast && dt == DType::kF32) continue;
        for (Attention attention : {Attention::kEager, Attention::kSdpa, Attention::kFlash}) {
          for (bool checkpoint : {false, true}) {
            ModelOptions options{dt, attention, checkpoint};
            options.autocast = autocast;
            expect_closed_form(full, options, true);
            expect_closed_form(small, options, false);
          }
        }
      }
    }
  }
}

// Gemma 2 under autocast (PyTorch DDP's mixed recipe), the 9B as its repository publishes it, at s 4096 (its
// sliding window) and b 1: every block's measured bytes against the closed form, at full scale on the shapes device
// and with real math on a shrunk copy cut to 3 layers, eager (transformers' default for Gemma 2) and flash, with and
// without checkpointing.
TEST(ModelMemory, Gemma2UnderAutocastMatchesTheClosedForm) {
  ModelConfig full = load_hf_config(std::filesystem::path(EMU_SOURCE_DIR) / "tests/data/hf/gemma-2-9b.json");
  full.batch = 1;
  full.seq = 4096;
  ModelConfig small = shrink(full, valid_shrink_factors(full).back());
  small.layers = 3;
  for (Attention attention : {Attention::kEager, Attention::kFlash}) {
    for (bool checkpoint : {false, true}) {
      ModelOptions options{DType::kBF16, attention, checkpoint};
      options.autocast = true;
      expect_closed_form(full, options, true);
      expect_closed_form(small, options, false);
    }
  }
  // By hand, per block (h 3584, F 14336, 16 heads of 256: qd 4096, 8 kv heads: eager's repeat_kv copies of k and v
  // [T, qd]; T 4096): the fp32 block input and residual after attention 2·4Th, input_layernorm's and
  // pre_feedforward_layernorm's fp32 normalised tensors 2·4Th, the five linears' bf16 casts of their fp32 outputs
  // 5·2Th, q and the attention output 2·2·T·qd, k and v 2·2·T·qd, gate, gelu(gate), up and the product 4·2TF, two
  // rstd 2·4T and two (1 + w) 2·4h; the sandwich norms 2·(4Th fp32 input copy + 4Th normalised + 4T + 4h); eager
  // attention b·a·s² × (2 tanh + 4 fp32 softmax + 2 its bf16 cast).
  const uint64_t T = 4096, h = 3584, F = 14336, qd = 4096, scores = 16 * T * T;
  const uint64_t expected = 8 * T * h + 8 * T * h + 10 * T * h + 4 * T * qd + 4 * T * qd + 8 * T * F + 8 * T + 8 * h +
                            2 * (8 * T * h + 4 * T + 4 * h) + 8 * scores;
  EXPECT_EQ(expected, uint64_t{3'368'148'992});  // README's figure (--model): 3.37 GB per block
  ModelOptions eager{DType::kBF16, Attention::kEager, false};
  eager.autocast = true;
  EXPECT_EQ(saved_activation_bytes_per_block(full, eager), expected);
  eager.checkpoint = true;
  EXPECT_EQ(saved_activation_bytes_per_block(full, eager), 4 * T * h);  // the fp32 block input
}

// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Section 4.1: the
// activations one GPT-style layer stores (16-bit activations, F = 4h, dropout, no recomputation, no tensor or
// sequence parallelism), term by term as the paper lists them, in bytes: `sbh` multiplies s·b·h, `as2b` a·s²·b.
struct PaperTerm {
  const char* what;
  double sbh;
  double as2b;
};
constexpr PaperTerm kKorthikanti[] = {
    // Attention block, 11sbh + 5as²b.
    {"QKV matmul input", 2, 0},
    {"QK^T: Q and K", 4, 0},
    {"softmax output", 0, 2},
    {"softmax dropout mask (1 byte)", 0, 1},
    {"attention over values: dropout output", 0, 2},
    {"attention over values: V", 2, 0},
    {"output projection input", 2, 0},
    {"attention dropout mask (1 byte)", 1, 0},
    // MLP, 19sbh.
    {"first linear input", 2, 0},
    {"GeLU input", 8, 0},
    {"second linear input (GeLU output)", 8, 0},
    {"MLP dropout mask (1 byte)", 1, 0},
    // Layer norms, 4sbh.
    {"attention layer-norm input", 2, 0},
    {"MLP layer-norm input", 2, 0},
};
// The paper's terms emu's GPT-2 block does not have: it runs Hugging Face's block without dropout, so no masks and
// no dropout output (attention multiplies the softmax output itself by V).
constexpr const char* kNotInEmu[] = {
    "softmax dropout mask (1 byte)",
    "attention over values: dropout output",
    "attention dropout mask (1 byte)",
    "MLP dropout mask (1 byte)",
};

TEST(ModelMemory, Gpt2MeasuredActivationsAreKorthikantiWithoutDropout) {
  // The sum of the listed terms is the paper's Eq. 1, s·b·h·(34 + 5·a·s/h).
  double sbh = 0, as2b = 0;
  for (const PaperTerm& term : kKorthikanti) sbh += term.sbh, as2b += term.as2b;
  ASSERT_EQ(sbh, 34);
  ASSERT_EQ(as2b, 5);
  ModelConfig full = preset("gpt2-xl");
  full.batch = 4;
  ModelConfig small = shrink(full, 32);
  small.layers = 2;
  for (const bool shapes_only : {true, false}) {
    const ModelConfig& c = shapes_only ? full : small;
    ASSERT_EQ(c.ffn, 4 * c.hidden) << "the paper's layer has F = 4h";
    const double s = double(c.seq), b = double(c.batch), h = double(c.hidden), a = double(c.heads);
    double expected = s * b * h * sbh + a * s * s * b * as2b;
    for (const char* removed : kNotInEmu) {
      const PaperTerm* term = std::find_if(std::begin(kKorthikanti), std::end(kKorthikanti),
                                           [&](const PaperTerm& t) { return std::string_view(t.what) == removed; });
      ASSERT_NE(term, std::end(kKorthikanti)) << removed;
      const double bytes = s * b * h * term->sbh + a * s * s * b * term->as2b;
      std::printf("%s: - %s: %.0f B\n", c.name.c_str(), removed, bytes);
      expected -= bytes;
    }
    // What Hugging Face's block keeps beyond the paper: each layer norm's mean and 1/std per token in fp32,
    // 2 × 2 × 4 B per token (the paper neglects them), and gelu_new (NewGELUActivation, Python arithmetic) saves
    // three more [T, F] tensors than one GeLU: tanh(...), 0.5·x and 1 + tanh(...), 3 × 2 × 4 = 24 B per s·b·h.
    // Per token, the statistics scale by k only: a model shrunk by k is charged their full-scale bytes ÷ k²,
    // 2 × 2 × 4 B × s·b / k (DESIGN.md §1).
    const double norm_statistics = 2 * 2 * 4 * s * b / double(c.shrink);
    const double gelu_new = 3 * 2 * s * b * double(c.ffn);
    std::printf("%s: + fp32 layer-norm mean and rstd: %.0f B\n", c.name.c_str(), norm_statistics);
    std::printf("%s: + gelu_new's tanh, 0.5x and 1 + tanh: %.0f B\n", c.name.c_str(), gelu_new);
    expected += norm_statistics + gelu_new;
    // Measured: what the block's forward leaves allocated as activations, bf16, classic attention, no
    // checkpointing; full scale on the shapes-only device, the shrunk copy with real math on the CPU.
    const ModelOptions options{DType::kBF16, Attention::kEager, false};  // GPT-2's eager softmax: 2 B per score
    const std::vector<uint64_t> per_block = measured_per_block(c, options, shapes_only);
    ASSERT_FALSE(per_block.empty());
    const double paper = s * b * h * (34 + 5 * a * s / h);
    std::printf(
        "%s s=%lld b=%lld: Korthikanti %.0f B, adjusted %.0f B, emu (HF) measured %llu B per block, %.3fx the "
        "paper\n",
        c.name.c_str(), (long long)c.seq, (long long)c.batch, paper, expected, (unsigned long long)per_block.front(),
        double(per_block.front()) / paper);
    for (uint64_t measured : per_block) EXPECT_EQ(double(measured), expected) << c.name;
  }
}

// Watches block 1's backward under checkpointing: every byte charged from its before_backward to its first gradient
// (c_proj's weight: the recomputation, then c_proj's input gradient), and the most in use between that gradient and
// c_fc's weight gradient (gelu_new's backward) above what was in use at the first.
class RecomputeProbe final : public Hooks {
 public:
  RecomputeProbe(MemoryPool& pool, const Model& model) : pool_(pool), model_(model) {}
  void before_backward(int unit) override {
    if (unit == 1) mark_ = pool_.timeline().size();
  }
  void gradient_made(int unit, size_t offset) override {
    if (unit != 1) return;
    const std::vector<ParamInfo>& params = model_.layout(1).params;
    if (offset == params[kMlpProjWeight].offset) {
      const std::vector<TimelinePoint>& timeline = pool_.timeline();
      for (size_t i = mark_; i < timeline.size(); ++i) {
        if (timeline[i].delta > 0) allocated += static_cast<uint64_t>(timeline[i].delta);
      }
      pool_.reset_peaks();
      base_ = pool_.in_use();
    }
    if (offset == params[kFcWeight].offset) gelu_rise = pool_.peak() - base_;
  }
  uint64_t allocated = 0, gelu_rise = 0;

 private:
  MemoryPool& pool_;
  const Model& model_;
  size_t mark_ = 0;
  uint64_t base_ = 0;
};

TEST(ModelMemory, Gpt2RecomputationAndGeluBackwardAsAutogradRunsThem) {
  const ModelConfig c = preset("gpt2");
  const uint64_t T = uint64_t(c.tokens()), h = uint64_t(c.hidden), F = uint64_t(c.ffn);
  const uint64_t heads = uint64_t(c.batch * c.heads * c.seq);  // logsumexp rows (s = 1024: no padding to 32)
  for (const DType dt : {DType::kF32, DType::kBF16}) {
    auto device = make_shapes_device({});
    Model model(*device, c, ModelOptions{dt, Attention::kSdpa, true});
    LocalParams params(model, 1);
    RecomputeProbe probe(device->memory(), model);
    const std::vector<int32_t> tokens = tokens_for(c);
    model.step(tokens.data(), tokens.data(), probe);
    const uint64_t e = dtype_size(dt);
    // torch.utils.checkpoint's recomputation (non-reentrant, early stop) makes the block's saved tensors again and
    // stops once c_proj has saved its input: ln_1's and ln_2's fp32 mean and rstd (8T each), ln_1's output, qkv
    // (3h), the attention output and its fp32 logsumexp, x + attention, ln_2's output; c_fc's output and gelu_new's
    // 0.5·x, x³, its product by 0.044715 (then x + that, √(2/π)·that and tanh reuse their memory), tanh, 1 + tanh and
    // the product (7 [T, F]). Then c_proj's backward makes its input gradient [T, F]. Not the MLP's or the block's
    // output.
    const uint64_t recomputed = 16 * T + e * T * (h + 3 * h + h + h + h) + 4 * heads + 7 * e * T * F;
    EXPECT_EQ(probe.allocated, recomputed + e * T * F) << dtype_name(dt);
    // gelu_new's backward (autograd's nodes of the Python expression): at the product's backward x, 0.5·x, tanh,
    // 1 + tanh, c_proj's input gradient and both factors' gradients (7 [T, F]), against 6 when c_proj's weight
    // gradient was made (c_proj's saved input then still alive, freed by its backward); as many at pow's backward.
    EXPECT_EQ(probe.gelu_rise, e * T * F) << dtype_name(dt);
  }
}

// Marks where block 1's backward ends and what the device holds then, for the tied table's test below.
class EmbeddingPhaseProbe final : public Hooks {
 public:
  explicit EmbeddingPhaseProbe(const MemoryPool& pool, int layers) : pool_(pool), layers_(layers) {}
  void before_backward(int unit) override {
    if (unit == layers_) blocks_begin = pool_.timeline().size();
  }
  void after_backward(int unit) override {
    if (unit != 1) return;
    blocks_end = pool_.timeline().size();
    in_use_after_blocks = pool_.in_use();
  }
  size_t blocks_begin = 0, blocks_end = 0;
  uint64_t in_use_after_blocks = 0;

 private:
  const MemoryPool& pool_;
  int layers_;
};

// GPT-2's head is its token table (tie_word_embeddings): autograd makes the head's part of the table's gradient
// ([V, h] at the gradients' dtype) in the head's backward and keeps it in the input buffer of the table's
// AccumulateGrad; the embedding's backward makes the second part beside the residual's gradient [T, h], which is then
// freed; the buffer sums the two into a new tensor (not in place: the head's part, a transposed matmul output, is
// referenced twice), frees them, and AccumulateGrad takes the sum as the .grad. Three [V, h] temporaries, the first
// made before any block's backward, the others after block 1's; at the sum the device holds 2·e·V·h − e·T·h − 4·T
// more than when block 1's backward ended (the token ids, 4 B each, are freed with the residual's gradient). An
// untied Llama makes none.
TEST(ModelMemory, TiedTableGradientHeldInPartsAndSummedAsAutogradDoes) {
  for (const bool tied : {true, false}) {
    ModelConfig c = preset(tied ? "gpt2" : "llama2-7b");
    c.seq = 128;
    c.batch = 1;
    c.layers = 2;
    const uint64_t T = 128, V = uint64_t(c.vocab), h = uint64_t(c.hidden);
    for (const DType dt : {DType::kF32, DType::kBF16}) {
      auto device = make_shapes_device({});
      Model model(*device, c, ModelOptions{dt, Attention::kSdpa, false});
      LocalParams params(model, 1);
      EmbeddingPhaseProbe probe(device->memory(), 2);
      const std::vector<int32_t> tokens = tokens_for(c);
      model.step(tokens.data(), tokens.data(), probe);
      const int64_t part = int64_t(dtype_size(dt) * V * h);
      std::vector<std::pair<size_t, int64_t>> parts;  // (timeline index, delta)
      const std::vector<TimelinePoint>& timeline = device->memory().timeline();
      for (size_t i = 0; i < timeline.size(); ++i) {
        if (timeline[i].category == Category::kTemporaries && std::abs(timeline[i].delta) == part) {
          parts.emplace_back(i, timeline[i].delta);
        }
      }
      const std::string what = fmt::format("{} {}", c.name, dtype_name(dt));
      if (!tied) {
        EXPECT_TRUE(parts.empty()) << what;
        continue;
      }
      ASSERT_EQ(parts.size(), 6u) << what;
      EXPECT_LT(parts[0].first, probe.blocks_begin) << what;
      EXPECT_GE(parts[1].first, probe.blocks_end) << what;
      const std::vector<int64_t> deltas = {parts[0].second, parts[1].second, parts[2].second,
                                           parts[3].second, parts[4].second, parts[5].second};
      EXPECT_EQ(deltas, (std::vector<int64_t>{part, part, part, -part, -part, -part})) << what;
      const uint64_t at_sum = timeline[parts[2].first].in_use;
      EXPECT_EQ(at_sum - probe.in_use_after_blocks, 2 * uint64_t(part) - dtype_size(dt) * T * h - 4 * T) << what;
    }
  }
}

// The peak of one training step (weights, gradients, activations, temporaries) on a device.
uint64_t step_peak(Device& device, const ModelConfig& config, const ModelOptions& options) {
  Model model(device, config, options);
  LocalParams params(model, 3);
  NoHooks hooks;
  const std::vector<int32_t> tokens = tokens_for(config);
  model.step(tokens.data(), tokens.data(), hooks);
  EXPECT_EQ(device.memory().in_use(Category::kActivations), 0u);
  return device.memory().peak();
}

TEST(ModelMemory, ShrunkPeakTimesKSquaredMatchesFullScaleLlama2_13b) {
  ModelConfig full = preset("llama2-13b");
  full.seq = 1024;  // shrunk by k = 32 to 32 tokens, so the real-math run takes a fraction of a second
  const int64_t k = 32;
  for (const ModelOptions& options :
       {ModelOptions{DType::kBF16, Attention::kEager, false}, ModelOptions{DType::kBF16, Attention::kFlash, true}}) {
    auto shapes = make_shapes_device({});
    const uint64_t full_peak = step_peak(*shapes, full, options);
    auto cpu = make_cpu_device({});
    const uint64_t shrunk_peak = step_peak(*cpu, shrink(full, k), options);
    const double ratio = double(shrunk_peak) * double(k * k) / double(full_peak);
    std::printf("llama2-13b s=1024 %s %s%s: full-scale peak %s, shrunk k=%lld peak %s, x k^2 = %s (%+.3f%%)\n",
                dtype_name(options.compute).data(), attention_name(options.attention).data(),
                options.checkpoint ? " checkpointed" : "", format_bytes(full_peak).c_str(), (long long)k,
                format_bytes(shrunk_peak).c_str(), format_bytes(uint64_t(double(shrunk_peak) * k * k)).c_str(),
                100 * (ratio - 1));
    EXPECT_NEAR(ratio, 1.0, 0.01);
  }
}

// The shapes-only device sees exactly the allocations the CPU device sees, in the same order.
TEST(ModelMemory, ShapesOnlyAllocatesExactlyAsTheCpuDevice) {
  for (const char* name : {"llama3-8b", "gpt2"}) {
    const ModelConfig config = shrink(preset(name), 64);
    for (const ModelOptions& options :
         {ModelOptions{DType::kBF16, Attention::kEager, false}, ModelOptions{DType::kF32, Attention::kFlash, true}}) {
      auto cpu = make_cpu_device({});
      auto shapes = make_shapes_device({});
      step_peak(*cpu, config, options);
      step_peak(*shapes, config, options);
      const std::vector<TimelinePoint>& a = cpu->memory().timeline();
      const std::vector<TimelinePoint>& b = shapes->memory().timeline();
      ASSERT_EQ(a.size(), b.size()) << name;
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(a[i].delta, b[i].delta) << name << " change " << i;
        ASSERT_EQ(a[i].category, b[i].category) << name << " change " << i;
      }
      EXPECT_EQ(cpu->memory().peak(), shapes->memory().peak());
    }
  }
}

TEST(ModelMemory, ShapesOnlyAccountsLlama2_70bInSeconds) {
  const auto start = std::chrono::steady_clock::now();
  auto device = make_shapes_device({});
  const ModelConfig config = preset("llama2-70b");
  const uint64_t peak = step_peak(*device, config, {DType::kBF16, Attention::kEager, false});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("llama2-70b s=4096 b=1 bf16 classic: peak %s, accounted in %.4f s\n", format_bytes(peak).c_str(),
              seconds);
  EXPECT_LT(seconds, 5.0);
  const uint64_t model_state = 4 * parameter_count(config);
  EXPECT_GT(peak, model_state + uint64_t(config.layers) * saved_activation_bytes_per_block(config, {}));
}

TEST(ModelMemory, OutOfMemoryNamesTheBlockAndPhase) {
  const ModelConfig config = shrink(preset("llama2-7b"), 32);
  MemoryPool::Options options;
  const uint64_t state = 4 * parameter_count(config);
  options.cap = state + 10 * saved_activation_bytes_per_block(config, {}) + 4 * uint64_t(config.tokens());
  auto device = make_shapes_device(options);
  Model model(*device, config, {});
  LocalParams params(model, 0);
  NoHooks hooks;
  const std::vector<int32_t> tokens = tokens_for(config);
  try {
    model.step(tokens.data(), tokens.data(), hooks);
    FAIL() << "expected an out-of-memory error";
  } catch (const OutOfMemoryError& error) {
    EXPECT_EQ(error.event().phase, "forward, block 10") << error.what();
    EXPECT_NE(error.event().what.find("block 10 "), std::string::npos) << error.what();
  }
}

// Backward needs more than forward ever held (gradients of activations, the loss's 12·T·V against its forward's
// 10·T·V); with a cap between the two, the first out-of-memory is recorded in a backward phase.
TEST(ModelMemory, OutOfMemoryInBackwardNamesTheBackwardPhase) {
  const ModelConfig config = shrink(preset("gpt2"), 16);
  const std::vector<int32_t> tokens = tokens_for(config);
  NoHooks hooks;
  uint64_t forward_peak = 0, peak = 0;
  {
    auto device = make_shapes_device({});
    Model model(*device, config, {});
    LocalParams params(model, 0);
    model.forward(tokens.data(), tokens.data(), hooks);
    forward_peak = device->memory().peak();
    model.backward(hooks);
    peak = device->memory().peak();
  }
  ASSERT_GT(peak, forward_peak);
  MemoryPool::Options options;
  options.cap = forward_peak + (peak - forward_peak) / 2;
  options.mode = OomMode::kRecord;
  auto device = make_shapes_device(options);
  Model model(*device, config, {});
  LocalParams params(model, 0);
  model.step(tokens.data(), tokens.data(), hooks);
  ASSERT_TRUE(device->memory().first_oom().has_value());
  EXPECT_EQ(device->memory().first_oom()->phase.rfind("backward, ", 0), 0u) << device->memory().first_oom()->phase;
}

}  // namespace
}  // namespace emu::model
