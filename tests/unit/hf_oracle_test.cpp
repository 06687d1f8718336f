// emu's saved activations and loss against Hugging Face's, as recorded from the real modelling code by
// scripts/oracle/saved_activations.py (transformers and PyTorch on the CPU; versions in the fixture). The same tiny
// shapes run through emu's model with real math on the CPU device; every block's saved bytes and the loss's bytes
// must equal the recording, up to the differences named below with their reasons.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "emu/device.h"
#include "tests/support/paths.h"
#include "workloads/model/local_params.h"
#include "workloads/model/memory_terms.h"
#include "workloads/model/model.h"

namespace emu::model {
namespace {

using nlohmann::json;

json fixture() {
  std::ifstream in(std::string(EMU_SOURCE_DIR) + "/tests/data/oracle/hf_saved_activations.json");
  EXPECT_TRUE(in.good()) << "tests/data/oracle/hf_saved_activations.json is missing";
  return json::parse(in);
}

// The recording's model: its shapes, at the case's KV heads.
ModelConfig recorded_config(const json& shapes, const std::string& style, int64_t kv_heads) {
  ModelConfig c;
  c.name = "hf-oracle-" + style;
  c.batch = shapes["batch"];
  c.seq = shapes["seq"];
  if (style != "gpt2") {  // llama, and qwen2 and phi3 at Llama's shapes
    const json& l = shapes["llama"];
    c.qkv_bias = style == "qwen2";
    c.fused_projections = style == "phi3";
    c.gemma = style == "gemma" || style == "gemma2";
    if (style == "gemma2") {  // at Llama's shapes, with Gemma 2's own keys
      const json& g2 = shapes["gemma2"];
      c.head_size = g2["head_dim"];
      c.query_scale = g2["query_pre_attn_scalar"];
      c.attn_softcap = g2["attn_logit_softcapping"];
      c.final_softcap = g2["final_logit_softcapping"];
      c.sandwich_norms = true;
      c.sliding_window = g2["sliding_window"];
    }
    c.style = Style::kLlama;
    c.hidden = l["hidden_size"];
    c.ffn = l["intermediate_size"];
    c.heads = l["num_attention_heads"];
    c.kv_heads = kv_heads;
    c.vocab = l["vocab_size"];
    c.layers = l["num_hidden_layers"];
    c.max_positions = l["max_position_embeddings"];
  } else {
    const json& g = shapes["gpt2"];
    c.style = Style::kGpt2;
    c.hidden = g["n_embd"];
    c.ffn = g["n_inner"];
    c.heads = g["n_head"];
    c.kv_heads = c.heads;
    c.vocab = g["vocab_size"];
    c.layers = g["n_layer"];
    c.max_positions = g["n_positions"];
    c.tie_embeddings = true;
  }
  return c;
}

// Per block, the activation bytes its forward leaves allocated, and the loss's bytes above the final norm's output:
// at the peak of its forward, after it, and at the peak of its backward down to the head's input gradient.
struct Measured {
  std::vector<uint64_t> per_block;
  uint64_t loss_forward_peak = 0, loss_after_forward = 0, loss_backward_peak = 0;
};

// How many changes the final norm makes to the device's timeline before the head runs (model.cpp forward_root_end):
// an RMSNorm's fp32 copy of a bf16 input, its statistics, the normalised tensor, Gemma's (1 + w), its output (fp32
// under autocast, whose bf16 cast the head saves, counted with the loss), and the bf16 input freed once the copy is
// in its place; a LayerNorm's statistics and output.
size_t final_norm_points(const ModelConfig& config, const ModelOptions& options) {
  if (config.style != model::Style::kLlama) return 2;
  const bool narrow = options.residual() != DType::kF32;
  return 3 + (config.gemma ? 1 : 0) + (narrow ? 2 : 0);
}

class Probe final : public Hooks {
 public:
  Probe(const MemoryPool& pool, int layers, size_t norm_points)
      : pool_(pool), layers_(layers), norm_points_(norm_points) {}
  void before_forward(int unit) override {
    if (unit > 0) start_ = pool_.in_use(Category::kActivations);
  }
  void after_forward(int unit) override {
    if (unit > 0) m.per_block.push_back(pool_.in_use(Category::kActivations) - start_);
    if (unit == layers_) mark_ = pool_.timeline().size();  // the loss starts: final norm, head, loss
    if (unit == 0) {
      m.loss_forward_peak = peak_since(mark_) - base_after_norm();
      m.loss_after_forward = pool_.in_use() - base_after_norm();
    }
  }
  void before_backward(int unit) override {
    if (unit == 0) backward_mark_ = pool_.timeline().size();
    if (unit == layers_) m.loss_backward_peak = peak_since(backward_mark_) - (loss_base_);
  }
  Measured m;

 private:
  // The in-use total at the highest point of the timeline from `from` on.
  uint64_t peak_since(size_t from) const {
    uint64_t peak = 0;
    for (size_t i = from; i < pool_.timeline().size(); ++i) peak = std::max(peak, pool_.timeline()[i].in_use);
    return peak;
  }
  // In use once the final norm's saved tensors and output (the first changes of the loss phase) exist: the recording
  // starts from the final hidden states.
  uint64_t base_after_norm() {
    loss_base_ = pool_.timeline()[mark_ + norm_points_ - 1].in_use;
    return loss_base_;
  }
  const MemoryPool& pool_;
  int layers_;
  size_t norm_points_;
  uint64_t start_ = 0, loss_base_ = 0;
  size_t mark_ = 0, backward_mark_ = 0;
};

Measured measure(const ModelConfig& config, const ModelOptions& options) {
  auto device = make_cpu_device({});
  Model model(*device, config, options);
  LocalParams params(model, 5);
  Probe probe(device->memory(), int(config.layers), final_norm_points(config, options));
  std::vector<int32_t> tokens(size_t(config.tokens()));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 11 + 5) % size_t(config.vocab));
  model.step(tokens.data(), tokens.data(), probe);
  return probe.m;
}

Attention attention_of(const std::string& name) { return name == "eager" ? Attention::kEager : Attention::kSdpa; }

// The recording's dtypes: float32, bfloat16 (parameters in bf16) and autocast (fp32 parameters under
// torch.autocast(bfloat16), PyTorch DDP's mixed recipe).
ModelOptions options_of(const std::string& dtype, Attention attention, bool checkpoint) {
  ModelOptions options{dtype == "float32" ? DType::kF32 : DType::kBF16, attention, checkpoint};
  options.autocast = dtype == "autocast";
  return options;
}

// Autocast's bf16 casts of one block's linear weights, which autograd saves with the block and emu's ddp strategy
// charges (strategies/ddp.cpp), not the model: Llama's q, k, v, o, gate, up and down projections (q and o [qd, h],
// qd = h but for Gemma 2's own head_dim); GPT-2's c_attn, attn.c_proj, c_fc and mlp.c_proj weights (addmm saves no
// bias).
int64_t weight_casts_per_block(const ModelConfig& c) {
  const auto h = int64_t(c.hidden), F = int64_t(c.ffn), kvd = int64_t(c.kv_dim()), qd = int64_t(c.q_dim());
  if (c.style == Style::kGpt2) return 2 * (4 * h * h + 2 * h * F);
  return 2 * (2 * h * qd + 2 * h * kvd + 3 * h * F);
}

TEST(HfOracle, SavedActivationsPerBlockEqualTheRecording) {
  const json doc = fixture();
  std::printf("recorded with torch %s, transformers %s\n", doc["versions"]["torch"].get<std::string>().c_str(),
              doc["versions"]["transformers"].get<std::string>().c_str());
  int cases = 0;
  for (const json& c : doc["blocks"]) {
    const std::string style = c["style"], dtype = c["dtype"], attention = c["attention"];
    const bool checkpoint = c["checkpoint"];
    const ModelConfig config = recorded_config(doc["shapes"], style, c["kv_heads"]);
    const ModelOptions options = options_of(dtype, attention_of(attention), checkpoint);
    const uint64_t e = dtype_size(options.compute);
    const uint64_t stream = dtype_size(options.residual());  // the residual stream's bytes: fp32 under autocast
    const uint64_t T = uint64_t(config.tokens()), h = uint64_t(config.hidden), F = uint64_t(config.ffn);
    // The differences, each with its reason; everything else must agree to the byte.
    int64_t named = 0;
    if (style == "gpt2" && !checkpoint) {
      // PyTorch's CPU layer norm keeps mean and rstd at the input's dtype; CUDA's (which emu follows) in fp32:
      // two norms, two [T] statistics each. Under autocast the input is the fp32 residual stream.
      named -= int64_t(2 * 2 * T * (4 - stream));
    }
    if (options.autocast && !checkpoint) {
      named += weight_casts_per_block(config);
      // CPU autocast runs pow in bf16, CUDA's (autocast_mode.h AT_FORALL_FP32, which emu follows) in fp32: on the
      // CPU gelu_new saves c_fc's bf16 output, tanh and 1 + tanh in bf16 (6TF); on a GPU pow's fp32 cast of it,
      // tanh and 1 + tanh in fp32 (12TF).
      if (style == "gpt2") named -= int64_t(6 * T * F);
    }
    if (style == "phi3" && !checkpoint && attention == "sdpa") {
      // Phi-3's q comes out of rotary embedding through torch.cat, contiguous as [b, a, s, d]; the CPU's flash
      // kernel writes its output in q's layout, so transpose(1, 2).contiguous() copies it and o_proj saves the
      // copy [T, h]. A GPU's flash and memory-efficient kernels write [b, s, a, d] (as for Llama's q, a transposed
      // view), where that .contiguous() is a no-op.
      named += int64_t(e * T * h);
      // Not yet in emu: trained without the cache (use_cache=False, as the Trainer trains), Phi-3's v reaches SDPA
      // as a view of qkv_proj's output, so SDPA keeps that whole [T, h + 2·kvd] output where emu keeps v [T, kvd].
      named += int64_t(e * T * (h + uint64_t(config.kv_dim())));
    }
    const Measured measured = measure(config, options);
    const std::vector<uint64_t> recorded = c["saved_per_block"];
    ASSERT_EQ(measured.per_block.size(), recorded.size());
    for (size_t b = 0; b < recorded.size(); ++b) {
      EXPECT_EQ(int64_t(measured.per_block[b]) + named, int64_t(recorded[b]))
          << style << " kv " << config.kv_heads << " " << dtype << " " << attention
          << (checkpoint ? " checkpointed" : "") << " block " << b + 1 << " (named differences " << named << " B)";
      EXPECT_EQ(measured.per_block[b], saved_activation_bytes_per_block(config, options)) << "closed form";
    }
    // Storages every block saves (Llama's rotary cos and sin [s, d] at the compute dtype, once per model; GPT-2's
    // eager attention mask [b, 1, s, s] when checkpointing passes it to every block) are not per block; emu
    // keeps its own fp32 rotary tables [s, d/2] (2·4·s·d/2 B) in the root and charges no eager mask.
    const uint64_t shared = c["shared_by_blocks"];
    const uint64_t s = uint64_t(config.seq), d = uint64_t(config.head_dim()), bsz = uint64_t(config.batch);
    // Under autocast the tables and the mask are made at the fp32 embeddings' dtype.
    if (style != "gpt2" && !checkpoint) {
      EXPECT_EQ(shared, 2 * stream * s * d);
    }
    if (style == "gpt2" && checkpoint && attention == "eager") {
      EXPECT_EQ(shared, stream * bsz * s * s);
    }
    ++cases;
  }
  EXPECT_EQ(cases, 96);  // 72 + gemma2's 8 + autocast's 16 (llama, gpt2 and gemma2)
}

TEST(HfOracle, TrainerLossBytesEqualTheRecording) {
  const json doc = fixture();
  for (const json& c : doc["loss"]) {
    const std::string style = c["style"], dtype = c["dtype"];
    const ModelConfig config = recorded_config(doc["shapes"], style, doc["shapes"]["llama"]["num_attention_heads"]);
    const ModelOptions options = options_of(dtype, Attention::kSdpa, false);
    const Measured m = measure(config, options);
    const uint64_t T = uint64_t(config.tokens()), th = T * uint64_t(config.hidden);
    // The recording holds what emu keeps on the host: HF's int64 labels padded by one ([b, s + 1]) and their
    // shifted contiguous copy [T], and the scalar loss (fp32).
    const uint64_t labels = 8 * uint64_t(config.batch) * uint64_t(config.seq + 1) + 8 * T;
    // Under autocast: the head's bf16 weight cast [V, h], which emu's ddp strategy charges, held from the head's
    // forward to its backward. After forward, the recording froze the head's weight, so nothing saves the head's
    // bf16 input cast (emu keeps it for the weight gradient), and it holds its fp32 input, the final hidden state
    // (the model's last_hidden_state, which emu frees when forward returns).
    const uint64_t weight_cast = options.autocast ? 2 * uint64_t(config.vocab * config.hidden) : 0;
    const uint64_t after = options.autocast ? weight_cast - 2 * th + 4 * th : 0;
    EXPECT_EQ(m.loss_forward_peak + labels + 8 + weight_cast, uint64_t(c["forward_peak"])) << style << " " << dtype;
    EXPECT_EQ(m.loss_after_forward + 8 * T + 8 + after, uint64_t(c["after_forward"])) << style << " " << dtype;
    EXPECT_EQ(m.loss_backward_peak + 8 + after, uint64_t(c["backward_peak"])) << style << " " << dtype;
    EXPECT_EQ(m.loss_forward_peak, loss_forward_peak_bytes(config, options));
    EXPECT_EQ(m.loss_backward_peak + (options.autocast ? 4 * th - 2 * th : 0),
              loss_backward_peak_bytes(config, options));
    EXPECT_EQ(m.loss_after_forward + (options.autocast ? 4 * th - 2 * th : 0), logits_bytes(config, options));
  }
}

// The fused loss keeps one fp32 [T, V] buffer from the head's output to its gradient.
TEST(HfOracle, FusedLossKeepsOneFp32Buffer) {
  const json doc = fixture();
  const ModelConfig config = recorded_config(doc["shapes"], "llama", 4);
  const uint64_t tv = uint64_t(config.tokens()) * uint64_t(config.vocab);
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const Measured m = measure(config, {dt, Attention::kSdpa, false, Loss::kFused});
    EXPECT_EQ(m.loss_forward_peak, 4 * tv);
    EXPECT_EQ(m.loss_after_forward, 4 * tv);
    // and, in backward, the head's input gradient [T, h] beside it
    EXPECT_EQ(m.loss_backward_peak, 4 * tv + dtype_size(dt) * uint64_t(config.tokens() * config.hidden));
  }
}

}  // namespace
}  // namespace emu::model
