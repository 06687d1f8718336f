// The decoder-only transformer: forward, loss and backward over units whose weights a strategy binds.
//
// The model owns no weights and knows nothing of strategies. Per unit (layout.h) a strategy binds the unit's flat
// weights at the compute dtype and a flat gradient buffer of the same dtype into which backward accumulates (+=);
// the strategy zeroes it. Around every use of a unit the model calls the strategy's hooks, in this order for one
// step of L blocks:
//
//   forward:   before_forward(0)                        embedding (and positions)
//              before_forward(l) .. after_forward(l)    for l = 1..L
//              final norm, LM head, loss                 (the root is used again: it stays in use)
//              after_forward(0)
//   backward:  before_backward(0)                       the root's gradients bound
//              gradient_made(0, p)                      an untied LM head's, once its backward has freed the logits'
//                                                        gradient; then the final norm's, once its backward has run
//              before_backward(l) .. after_backward(l)  for l = L..1; unit l's gradients are complete at its
//                                                        after_backward; gradient_made(l, p) in between as
//                                                        backward reaches each parameter p
//              before_embedding_backward()              embedding gradients (a tied table's: after its two
//                                                        parts are summed, below)
//              after_backward(0)                        the root's gradients are complete
//
// A head tied to the token table uses it twice: autograd keeps the head's part of its gradient ([V, h] at the
// gradients' dtype) in the input buffer of the table's AccumulateGrad from the head's backward on, the embedding's
// backward makes the second part, and the buffer sums them into a new tensor (input_buffer.cpp: in place only when
// nothing else references the first part, which the head's transposed weight gradient is not) before both parts are
// freed and AccumulateGrad takes the sum as the .grad. The model charges the two parts and the sum as temporaries,
// the strategy the .grad at before_embedding_backward, after the sum: for a moment three [V, h] tensors (four
// with a .grad kept from an earlier micro-batch, into which the sum is added).
//
// So the root is in use from the start to the end of forward, and from the start to the end of backward, as the
// root unit of PyTorch FSDP is. With activation checkpointing a block's forward is recomputed inside its own
// before_backward .. after_backward, with the weights bound for backward; no extra forward hooks fire. A hook may bind
// a unit's weights or gradients (e.g. ZeRO-3 gathers into a buffer in before_forward and binds it): the model reads a
// unit's bindings after calling its before_ hook, and has written all of that unit's gradients before calling
// after_backward.
//
// Every tensor a GPU would hold is allocated from the device (blocks.h lists the saved ones): the token ids, the
// rotary tables, each block's saved activations (released during backward as soon as they are used for the last
// time), the final norm's output, the logits, and the gradients of activations. The loss is computed in fp32 as the
// options say (config.h Loss): by default as Hugging Face's Trainer does (logits at the compute dtype, their fp32
// upcast and the fp32 log-softmax; 10·T·V bytes at its peak in bf16, 12·T·V in its backward), or fused, one fp32
// [T, V] buffer that the loss turns into its own gradient in place. With a shapes-only device the same allocations
// happen in the same order and no math is done, so a full-scale model is accounted in seconds.
//
// The math goes through the device's ops (emu/ops.h, Device::ops): the CPU kernels on the cpu backend, CUDA kernels on
// a CUDA device; the model names no backend. Ops may be asynchronous, so the model waits for them before each hook,
// and the strategy's host code never races them.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "emu/device.h"
#include "workloads/model/blocks.h"
#include "workloads/model/config.h"
#include "workloads/model/layout.h"

namespace emu::model {

class TensorParallel;  // tensor_parallel.h

// Implemented by a strategy. unit 0 is the root, 1..L the blocks.
class Hooks {
 public:
  virtual ~Hooks() = default;
  virtual void before_forward(int unit) {}
  virtual void after_forward(int unit) {}
  virtual void before_backward(int unit) {}
  virtual void after_backward(int unit) {}
  // Backward reaches the embeddings, its last step: autograd makes their gradients now (the token table's, GPT-2's
  // positions'), where the LM head's and the final norm's were made after the head's backward. The root's gradient
  // buffer is already bound; a strategy charges the embeddings' part here. With a tied head it comes once the
  // embedding's backward has run and autograd has summed the table's two parts (above).
  virtual void before_embedding_backward() {}
  // Inside a block's backward (between its before_backward and after_backward), or for the root (unit 0) after
  // before_backward(0), autograd has just made the gradient of the parameter at `offset` in the unit's layout: the op
  // that reads it ran its backward and released what it read (AccumulateGrad makes a parameter's .grad then, not
  // when the unit's backward begins). Called once per parameter and block backward, in the order backward reaches
  // them; for the root, for the tensors made at the head (an untied head's, the final norm's), not the embeddings'
  // (before_embedding_backward). The gradient is still in the model's own accumulator: the hook may charge its
  // bytes, not read them (they are in the bound buffer at after_backward).
  virtual void gradient_made(int unit, size_t offset) {}
};

class Model {
 public:
  // The config is validated (InputError on inconsistent shapes). Nothing is allocated until forward.
  Model(Device& device, ModelConfig config, ModelOptions options);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  Device& device() const { return device_; }
  DType compute_dtype() const { return options_.compute; }
  int num_units() const { return static_cast<int>(layouts_.size()); }  // L + 1
  const UnitLayout& layout(int unit) const;
  const std::vector<UnitLayout>& layouts() const { return layouts_; }

  // `weights`: layout(unit).count elements at compute_dtype(); `grads` likewise, accumulated into by backward.
  // Either may be null on a shapes-only device. `dtype` (fp32 or the compute dtype) binds them at another dtype:
  // PyTorch autocast keeps fp32 weights and fp32 gradients around bf16 math (DDP's mixed recipe).
  void bind_weights(int unit, const void* weights);
  void bind_weights(int unit, const void* weights, DType dtype);
  void bind_grads(int unit, void* grads);
  void bind_grads(int unit, void* grads, DType dtype);

  // tokens and targets: [b, s] int32 token ids in [0, V); targets[i] is the token that should follow tokens[i]
  // (already shifted, unlike Hugging Face's labels). Returns the mean cross-entropy over the b·s tokens and keeps
  // what backward needs (0 on a shapes-only device). A forward while an earlier one's state is held drops it.
  float forward(const int32_t* tokens, const int32_t* targets, Hooks& hooks);
  // Accumulates the gradients of forward's mean loss into the bound gradient buffers, releasing the saved tensors.
  void backward(Hooks& hooks);
  // forward then backward.
  float step(const int32_t* tokens, const int32_t* targets, Hooks& hooks);
  // Drops what forward saved (after an evaluation-only forward).
  void discard();

  // Pipeline parallelism (strategies/pipeline.cpp): this rank's stage runs blocks [first, last] of 1..L only.
  // The stage that starts at block 1 runs the embedding, the one that ends at block L the final norm, the head
  // and the loss; only those two call the root's hooks. A stage that starts later takes its input from
  // set_stage_input before forward, and one that ends earlier hands its output to take_stage_output after forward
  // (forward then returns 0) and takes the gradient of that output from set_output_gradient before backward;
  // after backward, take_input_gradient hands back the gradient of its input. Default: blocks 1..L.
  void set_stage(int first_block, int last_block);
  int first_block() const { return first_block_; }
  int last_block() const { return last_block_; }
  // Whether the stage runs root tensors: the embeddings on the first, the final norm and head on the last.
  bool holds_root() const { return first_block_ == 1 || last_block_ == config_.layers; }
  // Each is [R, h] at the compute dtype, R = rows(): under sequence parallelism a stage hands on the TP rank's
  // slice of the sequence (Megatron's p2p_communication with sequence_parallel sends [s/t, b, h]).
  void set_stage_input(Buffer x);         // the previous stage's output
  Buffer take_stage_output();             // this stage's output
  void set_output_gradient(Buffer grad);  // the gradient of this stage's output, from the next stage
  Buffer take_input_gradient();           // the gradient of this stage's input, for the previous stage
  // The rows of the residual stream this rank holds: T = b·s, or T/t under sequence parallelism.
  size_t rows() const;

  // Tensor parallelism (strategies/tensor_parallel.cpp, tensor_parallel.h): from now on the model runs this rank's
  // slice of every layer, its config and layouts the slice's (tensor_parallel_config), its embedding and head the
  // rank's vocabulary rows, and it calls `tp` at Megatron's reduction points. InputError when the shapes cannot be
  // split. Before any weights are bound.
  void set_tensor_parallel(TensorParallel* tp);
  // The unsplit shapes and layouts (config() and layout() unless tensor-parallel), which initial values follow.
  const ModelConfig& full_config() const { return full_config_; }
  const UnitLayout& full_layout(int unit) const;

  // What one forward keeps for its backward, moved out of the model so that several micro-batches can be in
  // flight at once (a pipeline schedule keeps up to M); the tensors stay allocated and charged while held.
  struct InFlight {
    Buffer tokens, rope_cos, rope_sin;
    std::vector<BlockSaved> saved;
    Buffer final_x, final_stats, final_hat, final_plus_one, final_xn, logits;
    std::vector<uint8_t> tp_outside;  // TP: the micro-batch's tokens outside this rank's vocabulary slice
    bool has_forward = false;
  };
  InFlight take_in_flight();
  // Makes a held forward the current one, for its backward; the model must hold none.
  void restore_in_flight(InFlight state);

  // Initial fp32 values of elements [begin, begin + count) of `unit` in its full layout (full_layout), where every
  // strategy starts: the loaded
  // weights when set_initial_weights gave some, else the seeded initialisation (layout.h, init_unit_range).
  void initial_values(int unit, uint64_t seed, size_t begin, size_t count, float* out) const;
  // The same for the whole unit.
  void init_unit(int unit, uint64_t seed, float* out) const;
  // Weights to start from instead of the seeded initialisation: [units][layout(u).count] fp32, as
  // io::load_model_weights returns them. A check fails unless they match the layouts.
  void set_initial_weights(std::shared_ptr<const std::vector<std::vector<float>>> weights);

 private:
  struct UnitBindings {  // what a strategy bound to one unit
    const void* weights = nullptr;
    void* grads = nullptr;
    DType weights_dtype = DType::kF32;
    DType grads_dtype = DType::kF32;
  };
  // The unit's weights as fp32: the bound buffer itself in fp32, else a widened copy in `scratch`.
  const float* weights_f32(int unit, Scratch& scratch) const;
  // A zeroed fp32 gradient accumulator for the unit, in `scratch`.
  float* zeroed_grads(int unit, Scratch& scratch) const;
  // Adds the unit's accumulated fp32 gradients into its bound gradient buffer.
  void flush_grads(int unit, const float* grads);
  // Waits for the ops issued so far: before a hook hands control to the strategy, whose host code may read or
  // write what they touched.
  void sync() const;
  BlockEnv block_env(int unit) const;
  void forward_root_start(const int32_t* tokens);
  float embedding_scale() const;  // Gemma: √h at the weights' dtype
  int64_t vocab_begin() const;    // TP: the first vocabulary row of this rank's slice; 0 otherwise
  float forward_root_end(const int32_t* targets);
  // The gradient of the logits [T, V] the head's backward reads, made as the chosen loss makes it; releases logits_.
  Buffer logits_gradient();
  Buffer trainer_logits_gradient();  // logits_gradient for Loss::kTrainer, before any soft-cap
  void backward_root_start(Hooks& hooks);
  // The embeddings' backward; with a tied head, returns the embedding's part of the table's gradient (charged,
  // holding nothing: the math accumulates into the root's gradients), else nothing.
  Buffer backward_root_end();
  // The tied table's gradient as autograd makes it (the head uses it too, and this stage runs both): a part per use,
  // kept in the input buffer of its AccumulateGrad, as the root's gradients are bound.
  bool holds_tied_table() const;
  Buffer tied_table_part(std::string_view what) const;
  void backward_block(int unit, Hooks& hooks);
  // Sequence parallelism (tensor_parallel.h): on, and `slice` [T/t, h] all-gathered into a new [T, h] temporary.
  bool sequence_parallel() const;
  Buffer gather_rows(const Buffer& slice, std::string_view what);
  void allocate_rope_tables();

  Device& device_;
  ModelConfig config_;
  ModelOptions options_;
  std::vector<UnitLayout> layouts_;
  std::vector<UnitBindings> units_;
  bool math_ = true;
  bool has_forward_ = false;
  Ops* ops_ = nullptr;  // the device's ops (Device::ops); null on a shapes-only device

  // Backend scratch for the fp32 math, not charged (kernels reading bf16 directly would not need it): fp32 copies
  // of the root's and the current block's weights, their fp32 gradient accumulators, flushed into the bound
  // buffers, and the targets brought over from the caller's host memory.
  Scratch root_w_, block_w_, root_g_, block_g_;  // [unit count] each
  Scratch targets_;                              // [T] int32
  Scratch logits_grad_;  // [T, V] fp32: the logits' gradient for the head's backward when the charged one is bf16
  Scratch softcap_t_;    // [T, V] fp32: Gemma 2's tanh(logits / cap), what the math of its backward reads
  const float* root_weights_ = nullptr;
  float* root_grads_ = nullptr;
  std::shared_ptr<const std::vector<std::vector<float>>> initial_weights_;  // null: the seeded initialisation

  // Device tensors held between forward and backward.
  Buffer tokens_;                         // [T] int32 token ids (4 bytes, charged as fp32)
  Buffer rope_cos_, rope_sin_;            // [s, d/2] fp32 rotary tables (Llama), charged as HF's [1, s, d]
  std::vector<BlockSaved> saved_;         // [L]
  Buffer final_x_;                        // [T, h] output of block L, input of the final norm (Llama: in fp32)
  Buffer final_stats_;                    // [T] rstd (Llama) or [2, T] mean and rstd (GPT-2), fp32
  Buffer final_hat_;                      // Llama, charged only: [T, h] the final norm's normalised input
  Buffer final_plus_one_;                 // Gemma: [h] fp32, the final norm's (1 + weight)
  Buffer final_xn_;                       // [T, h] final norm output, input of the head
  Buffer softcap_tanh_;                   // Gemma 2, the Trainer's loss: [T, V] tanh(logits / cap), saved by tanh
  Buffer logits_;                         // [T, V] fp32: logits, then (after the loss) their gradient; charged as the
                                          // log-softmax the Trainer's loss saves, or as the fused loss's one buffer
  Buffer dres_;                           // [T, h] gradient of the residual stream during backward
  Buffer tied_head_part_;                 // [V, h] tied: the head's part of the table's gradient, charged only
  int first_block_ = 1, last_block_ = 0;  // this pipeline stage's blocks (set_stage); last_block_ = L by default
  TensorParallel* tp_ = nullptr;          // set_tensor_parallel
  ModelConfig full_config_;
  std::vector<UnitLayout> full_layouts_;
  std::vector<uint8_t> tp_outside_;  // [T] tokens outside this rank's vocabulary slice (their rows looked up as 0)
};

}  // namespace emu::model
