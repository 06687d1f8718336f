#include "tests/oracle/memory_oracle.h"

#include <algorithm>
#include <climits>
#include <deque>
#include <numeric>
#include <set>
#include <stdexcept>

namespace emu::oracle {

uint64_t per_k2(uint64_t full_scale, int64_t shrink) {
  const auto k = static_cast<uint64_t>(shrink);
  return std::max<uint64_t>(1, full_scale / (k * k));
}

uint64_t round_up(uint64_t count, uint64_t multiple) { return (count + multiple - 1) / multiple * multiple; }

uint64_t Estimate::by_category(const std::string& category) const {
  if (category == "parameters") return parameters;
  if (category == "gradients") return gradients;
  if (category == "master_weights") return master_weights;
  if (category == "optimizer_state") return optimizer_state;
  if (category == "buckets") return buckets;
  throw std::invalid_argument("unknown category " + category);
}

// Llama (Hugging Face LlamaForCausalLM): embed_tokens [V, h], norm [h], lm_head [V, h] unless tied.
// GPT-2 (GPT2LMHeadModel): wte [V, h], wpe [P, h], ln_f weight and bias [h]; the head is wte.
std::vector<uint64_t> root_tensors(const Shapes& s) {
  const auto h = static_cast<uint64_t>(s.h);
  const auto v = static_cast<uint64_t>(s.vocab);
  if (s.family == Family::kLlama) {
    std::vector<uint64_t> tensors = {v * h, h};
    if (!s.tied_head) tensors.push_back(v * h);
    return tensors;
  }
  std::vector<uint64_t> tensors = {v * h, static_cast<uint64_t>(s.positions) * h, h, h};
  if (!s.tied_head) tensors.push_back(v * h);
  return tensors;
}

// Llama: q and o [h, h], k and v [kv·d, h] with d = h/a (grouped-query attention), gate, up [F, h], down [h, F],
// two RMSNorm weights [h]: 2h² + 2h·kv·d + 3hF + 2h (4h² + 3hF + 2h when kv = a).
// GPT-2 (Conv1D, biases): ln_1 and ln_2 weight and bias, c_attn [h, 3h] + [3h], attn c_proj [h, h] + [h],
// c_fc [h, F] + [F], mlp c_proj [F, h] + [h].
std::vector<uint64_t> block_tensors(const Shapes& s) {
  const auto h = static_cast<uint64_t>(s.h);
  const auto f = static_cast<uint64_t>(s.ffn);
  if (s.family == Family::kLlama) {
    const uint64_t kv = static_cast<uint64_t>(s.kv_heads) * (h / static_cast<uint64_t>(s.heads));
    return {h * h, kv * h, kv * h, h * h, f * h, f * h, h * f, h, h};
  }
  return {h, h, h * 3 * h, 3 * h, h * h, h, h, h, h * f, f, f * h, h};
}

std::vector<uint64_t> unit_counts(const Shapes& s) {
  const auto sum = [](const std::vector<uint64_t>& tensors) {
    return std::accumulate(tensors.begin(), tensors.end(), uint64_t{0});
  };
  std::vector<uint64_t> counts = {sum(root_tensors(s))};
  counts.insert(counts.end(), static_cast<size_t>(s.layers), sum(block_tensors(s)));
  return counts;
}

uint64_t head_elements(const Shapes& s) {
  const auto h = static_cast<uint64_t>(s.h);
  return static_cast<uint64_t>(s.vocab) * h + (s.family == Family::kLlama ? h : 2 * h);
}

uint64_t parameter_count(const Shapes& s) {
  const std::vector<uint64_t> counts = unit_counts(s);
  return std::accumulate(counts.begin(), counts.end(), uint64_t{0});
}

namespace {

void add(Estimate& e, uint64_t Estimate::*field, const char* category, std::string name, uint64_t bytes) {
  e.*field += bytes;
  e.terms.push_back({category, std::move(name), bytes});
}

// Master weights (fp32) and Adam's m and v over the `elements` this rank updates.
void add_optimizer(Estimate& e, const Knobs& k, uint64_t elements, const std::string& what) {
  if (k.master) add(e, &Estimate::master_weights, "master_weights", "fp32 master weights of " + what, elements * 4);
  add(e, &Estimate::optimizer_state, "optimizer_state", "Adam m and v of " + what, elements * 2 * k.moment_bytes);
}

// torch.optim.AdamW's step temporaries over `tensors` (torch/optim/adam.py): _multi_tensor_adam's
// _foreach_sqrt(exp_avg_sqs), one per tensor; _single_tensor_adam's exp_avg_sq.sqrt() and its quotient, for one
// tensor at a time; the fused kernel none.
void add_step_temporaries(Estimate& e, const Knobs& k, const std::vector<uint64_t>& tensors) {
  if (k.adamw == "foreach") {
    add(e, &Estimate::optimizer_state, "optimizer_state", "foreach AdamW: a sqrt(v) per tensor",
        std::accumulate(tensors.begin(), tensors.end(), uint64_t{0}) * k.moment_bytes);
  } else if (k.adamw == "single") {
    add(e, &Estimate::optimizer_state, "optimizer_state", "single-tensor AdamW: sqrt(v) and its quotient",
        2 * *std::max_element(tensors.begin(), tensors.end()) * k.moment_bytes);
  }
}

// PyTorch DDP; with `zero`, under ZeroRedundancyOptimizer (torch/distributed/optim/zero_redundancy_optimizer.py):
// the optimizer keeps state for whole tensors only, given largest first to the rank with the fewest elements so
// far; this estimate speaks for k.rank. Mixed precision under DDP is torch.autocast over the fp32 model, as the
// Hugging Face Trainer's bf16=True runs it: fp32 parameters and gradients, AdamW on the parameters themselves.
Estimate ddp(const Shapes& s, const Knobs& k, bool zero) {
  const uint64_t psi = parameter_count(s);
  Knobs recipe = k;
  if (k.master) {  // autocast: 4 B parameters and gradients, no master copy, fp32 moments
    recipe.param_bytes = 4;
    recipe.grad_bytes = 4;
    recipe.master = false;
    recipe.moment_bytes = 4;
  }
  Estimate e;
  add(e, &Estimate::parameters, "parameters", "parameters (Ψ)", psi * recipe.param_bytes);
  add(e, &Estimate::gradients, "gradients", "gradients (Ψ), all alive at the step", psi * recipe.grad_bytes);
  if (!k.gradient_as_bucket_view) {
    add(e, &Estimate::buckets, "buckets", "DDP bucket copies of every gradient (25 MiB buckets, first 1 MiB)",
        psi * recipe.grad_bytes);
  }
  std::vector<uint64_t> tensors = root_tensors(s);
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::vector<uint64_t> block = block_tensors(s);
    tensors.insert(tensors.end(), block.begin(), block.end());
  }
  if (zero) {
    std::vector<uint64_t> sorted = tensors;
    std::stable_sort(sorted.begin(), sorted.end(), std::greater<>());
    std::vector<uint64_t> load(static_cast<size_t>(k.world), 0);
    std::vector<uint64_t> mine;  // rank 0's
    for (uint64_t t : sorted) {
      const auto least = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      load[least] += t;
      if (static_cast<int>(least) == k.rank) mine.push_back(t);
    }
    tensors = mine;
  }
  add_optimizer(e, recipe, std::accumulate(tensors.begin(), tensors.end(), uint64_t{0}),
                zero ? "the rank's whole tensors" : "all Ψ");
  if (!tensors.empty()) add_step_temporaries(e, recipe, tensors);
  return e;
}

// The root's and the largest block's gradients while backward makes them (the root's backward encloses the
// blocks'), each `padded` to the given multiple.
// Each unit's flat buffer padded to a multiple of the shard group's `ranks`, and the elements of one rank's shards
// over all units.
struct PaddedUnits {
  std::vector<uint64_t> padded;
  uint64_t shard_elements = 0;
};
PaddedUnits pad_units(const std::vector<uint64_t>& counts, uint64_t ranks) {
  PaddedUnits units;
  for (uint64_t c : counts) {
    units.padded.push_back(round_up(c, ranks));
    units.shard_elements += units.padded.back() / ranks;
  }
  return units;
}

}  // namespace

uint64_t late_root_gradients(const Shapes& s) {
  const auto h = static_cast<uint64_t>(s.h);
  uint64_t late = static_cast<uint64_t>(s.vocab) * h;  // tied: AccumulateGrad makes it once both parts are summed
  if (s.family == Family::kGpt2) late += static_cast<uint64_t>(s.positions) * h;
  return late;
}

std::vector<uint64_t> registration_order(const Shapes& s) {
  const std::vector<uint64_t> root = root_tensors(s);
  const auto embeddings = static_cast<std::ptrdiff_t>(s.family == Family::kLlama ? 1 : 2);
  std::vector<uint64_t> order(root.begin(), root.begin() + embeddings);
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::vector<uint64_t> block = block_tensors(s);
    order.insert(order.end(), block.begin(), block.end());
  }
  order.insert(order.end(), root.begin() + embeddings, root.end());
  return order;
}

uint64_t grads_in_partition(const Shapes& s, uint64_t n, uint64_t rank) {
  return whole_tensors_meeting(registration_order(s), round_up(parameter_count(s), 2 * n) / n, rank);
}

namespace {

// ZeRO-2's gradients through backward (contiguous_gradients), in elements. DeepSpeed's hook copies each .grad into the
// ipg bucket as soon as autograd has made it and repoints .grad into the bucket, so autograd's own gradient tensors
// live one at a time: the head's, then each block's tensors, then the embeddings'. The hook first reduces the bucket
// when the tensor does not fit in it, and reduces a tensor larger than the bucket from its own storage
// (reduce_independent_p_g_buckets_and_remove_grads); the first reduction makes grads_in_partition (`partition`
// elements), alive from then on. Autograd makes an untied head's .grad first, then the final norm's (a head tied to
// the embedding makes none there: its part is held in the table's input buffer, not a gradient, until the table's
// .grad is made at the end of backward), each block's (the last block first, its tensors last first), then the
// embeddings'. A block is taken whole, as emu charges it: its largest
// .grad, beside the partition when a reduction has come by the end of its backward.
uint64_t zero2_backward_gradients(const Shapes& s, uint64_t bucket, uint64_t partition) {
  uint64_t in_bucket = 0;
  bool reduced = false;
  const auto hook = [&](uint64_t tensor) {
    if (tensor > bucket) {
      reduced = true;
    } else if (in_bucket + tensor > bucket) {
      reduced = true;
      in_bucket = tensor;
    } else {
      in_bucket += tensor;
    }
  };
  // The head's side of the root, last registered first: an untied head, the final norm (GPT-2: its bias, weight).
  const std::vector<uint64_t> root = root_tensors(s);
  const size_t embeddings = s.family == Family::kLlama ? 1 : 2;
  uint64_t peak = 0;
  for (size_t i = root.size(); i-- > embeddings;) {
    hook(root[i]);
    peak = std::max(peak, root[i] + (reduced ? partition : 0));
  }
  const std::vector<uint64_t> block = block_tensors(s);
  const uint64_t largest_block_tensor = *std::max_element(block.begin(), block.end());
  for (int64_t l = 0; l < s.layers; ++l) {
    for (auto t = block.rbegin(); t != block.rend(); ++t) hook(*t);
    peak = std::max(peak, largest_block_tensor + (reduced ? partition : 0));
  }
  for (size_t i = embeddings; i-- > 0;) hook(root[i]);
  return std::max(peak, late_root_gradients(s) + (reduced ? partition : 0));
}

// contiguous_gradients false at stage 1: the largest bucket of several tensors, which allreduce_bucket flattens into a
// new tensor for its all-reduce (a tensor larger than the bucket is all-reduced in place). Tensors in the oracle's
// stage-1 order: root first, or with overlap_comm in the boundary's backward, blocks last first and each block's
// tensors last first, then the root's.
uint64_t largest_flattened_bucket(const Shapes& s, uint64_t bucket, bool overlap_comm) {
  std::vector<uint64_t> order;
  const std::vector<uint64_t> root = root_tensors(s), block = block_tensors(s);
  if (!overlap_comm) {
    order = root;
    for (int64_t l = 0; l < s.layers; ++l) order.insert(order.end(), block.begin(), block.end());
  } else {
    for (int64_t l = 0; l < s.layers; ++l) order.insert(order.end(), block.rbegin(), block.rend());
    order.insert(order.end(), root.rbegin(), root.rend());
  }
  uint64_t largest = 0, in_bucket = 0, tensors = 0;
  for (uint64_t tensor : order) {
    if (tensor > bucket || in_bucket + tensor > bucket) {
      if (tensors > 1) largest = std::max(largest, in_bucket);
      in_bucket = tensors = 0;
    }
    if (tensor > bucket) continue;
    in_bucket += tensor;
    ++tensors;
  }
  return tensors > 1 ? std::max(largest, in_bucket) : largest;
}

Estimate zero12(const Shapes& s, const Knobs& k, int stage) {
  const uint64_t psi = parameter_count(s);
  const auto n = static_cast<uint64_t>(k.world);
  const uint64_t padded = round_up(psi, 2 * n);  // DeepSpeed: nccl_start_alignment_factor (2) × N
  const uint64_t shard = padded / n;
  const uint64_t bucket = per_k2(k.reduce_bucket_size, k.shrink);
  // grads_in_partition: the whole tensors meeting this rank's S elements.
  const uint64_t partition = grads_in_partition(s, n, static_cast<uint64_t>(k.rank));
  Estimate e;
  add(e, &Estimate::parameters, "parameters", "bit16 flat parameters, aligned to 2N", padded * k.param_bytes);
  // Stage 2's gradient hooks reduce in every backward; stage 1's only with overlap_comm, in the accumulation
  // boundary's (process_gradients), here the only micro-batch's: there it holds its gradients as stage 2 does.
  if (stage == 1 && !k.contiguous_gradients) {
    // contiguous_gradients false: no ipg buffer; every autograd .grad waits where it was made and is kept to step()
    // (reduce_ipg_grads -> buffered_reduce_fallback, and stage 1 copies nothing into a partition); buckets of several
    // tensors flattened for their all-reduce.
    add(e, &Estimate::gradients, "gradients", "autograd .grad of every parameter, kept to step()", psi * k.grad_bytes);
    const uint64_t largest = largest_flattened_bucket(s, bucket, k.overlap_comm);
    add(e, &Estimate::buckets, "buckets", "the largest bucket of several .grads, flattened for its all-reduce",
        largest * k.grad_bytes);
  } else if (stage == 1 && !k.overlap_comm) {
    add(e, &Estimate::gradients, "gradients", "autograd .grad of every parameter", psi * k.grad_bytes);
    // reduce_gradients() copies the tensors, in registration order, into the bucket (a tensor's .grad is dropped
    // once copied; the oracle frees whole units) and makes the partition (grads_in_partition) at the first
    // reduction: when the bucket first overflows, or a tensor larger than it comes.
    uint64_t freed = 0, in_bucket = 0;
    bool reduced = false;
    for (size_t unit = 0; unit < 1 + static_cast<size_t>(s.layers) && !reduced; ++unit) {
      for (uint64_t tensor : unit == 0 ? root_tensors(s) : block_tensors(s)) {
        if (in_bucket + tensor > bucket) {
          reduced = true;
          break;
        }
        in_bucket += tensor;
      }
      if (!reduced) freed += unit_counts(s)[unit];
    }
    if (partition > freed) {
      add(e, &Estimate::gradients, "gradients", "gradient partition made before enough .grad was freed",
          (partition - freed) * k.grad_bytes);
    }
  } else {
    add(e, &Estimate::gradients, "gradients", "gradient partition (2Ψ/N)", shard * k.grad_bytes);
    const uint64_t backward = zero2_backward_gradients(s, bucket, partition);
    add(e, &Estimate::gradients, "gradients",
        "the .grad being made, until its copy into the bucket (one tensor at a time), beside the partition (its "
        "tensors whole) once the first reduction has made it",
        (std::max(backward, shard) - shard) * k.grad_bytes);
  }
  // step(): the partition's S elements flattened into a new buffer and cast to fp32
  // (flatten(averaged_gradients).to(fp32)), the three alive at once; more than backward's gradients when S is large.
  const uint64_t at_step = (partition + shard) * k.grad_bytes + (k.master && k.grad_bytes != 4 ? shard * 4 : 0);
  if (at_step > e.gradients) {
    add(e, &Estimate::gradients, "gradients", "step: flattened partition and its fp32 copy, beyond backward's",
        at_step - e.gradients);
  }
  const int buffers = k.overlap_comm ? 2 : 1;
  if (stage == 1 && !k.contiguous_gradients) {
    add_optimizer(e, k, shard, "the partition (12Ψ/N)");
    return e;
  }
  add(e, &Estimate::buckets, "buckets",
      std::string("ipg reduce bucket (reduce_bucket_size elements)") + (buffers == 2 ? " x2, overlap_comm" : ""),
      bucket * k.grad_bytes * buffers);
  add_optimizer(e, k, shard, "the partition (12Ψ/N)");
  return e;
}

// What DeepSpeed's ZeRO-3 holds gathered, parameter by parameter: a parameter fetched for its use is gathered into
// its own buffer (or, in flight, waited on); a prefetch of several parameters that are not persistent is one
// coalesced all-gather, a flat buffer as large as all of them, held by the coordinator's in-flight registry until
// each of them has been waited on, the first wait copying every one of them out of it. Persistent parameters are
// gathered apart (after the optimizer step), never with the others. `all`: every element held, flat buffers
// included; `available`: the coordinator's count, persistent parameters left out.
struct CoordinatorHeld {
  CoordinatorHeld(const std::vector<uint64_t>& sizes, uint64_t persistence)
      : size(sizes), threshold(persistence), gathered(sizes.size(), false), in_flight(sizes.size(), -1) {}
  void fetch(int p) {
    if (in_flight[static_cast<size_t>(p)] < 0) {
      gather(p);
      return;
    }
    Flat& flat = flats[static_cast<size_t>(in_flight[static_cast<size_t>(p)])];
    in_flight[static_cast<size_t>(p)] = -1;
    if (!flat.copied) {
      flat.copied = true;
      for (int q : flat.pending) all += size[static_cast<size_t>(q)];
    }
    flat.pending.erase(p);
    if (flat.pending.empty()) all -= flat.elements;
  }
  void prefetch(const std::set<int>& params) {
    std::vector<int> coalesced;
    for (int q : params) {
      if (size[static_cast<size_t>(q)] <= threshold) {
        gather(q);
      } else {
        coalesced.push_back(q);
      }
    }
    if (coalesced.size() == 1) gather(coalesced.front());
    if (coalesced.size() < 2) return;
    Flat& flat = flats.emplace_back();
    for (int q : coalesced) {
      gathered[static_cast<size_t>(q)] = true;
      available += size[static_cast<size_t>(q)];
      in_flight[static_cast<size_t>(q)] = static_cast<int>(flats.size()) - 1;
      flat.pending.insert(q);
      flat.elements += size[static_cast<size_t>(q)];
    }
    all += flat.elements;
  }
  void free(int p) {
    gathered[static_cast<size_t>(p)] = false;
    all -= size[static_cast<size_t>(p)];
    available -= size[static_cast<size_t>(p)];
  }

  struct Flat {
    std::set<int> pending;  // its parameters not yet waited on
    uint64_t elements = 0;
    bool copied = false;
  };
  const std::vector<uint64_t>& size;  // [param]
  uint64_t threshold;
  std::vector<bool> gathered;  // [param] gathered or in flight
  std::vector<int> in_flight;  // [param] its flat buffer, or -1
  std::vector<Flat> flats;
  uint64_t all = 0, available = 0;

 private:
  void gather(int p) {
    if (gathered[static_cast<size_t>(p)]) return;
    gathered[static_cast<size_t>(p)] = true;
    all += size[static_cast<size_t>(p)];
    if (size[static_cast<size_t>(p)] > threshold) available += size[static_cast<size_t>(p)];
  }
};

// ZeRO-3: DeepSpeed's PartitionedParameterCoordinator over one micro-batch (the first after an optimizer step, its
// trace complete), parameter by parameter. The trace lists every module with parameters as its hooks fetch it:
// the embeddings, each block's modules as its forward runs them, the final norm, the head (a tied head: the table
// again); then, after the model's own pre-backward step, the head, the final norm, each block's modules in reverse
// (a checkpointed block's forward again first, then its layer's own pre-backward step), the embeddings. At each
// fetch the module's parameter is gathered and its queue entry taken; then, with a prefetch bucket, queue entries
// are taken while fewer than min(bucket, max_live − available) elements are being prefetched, each parameter not
// gathered is gathered, every taken entry marking its parameter as fetched up to that entry's step; after the use
// the parameter is freed unless persistent, marked for a later step, or met again within max_reuse_distance
// elements of the trace. Several parameters prefetched at once share one flat all-gather buffer that stays until
// each of them has been fetched (partition_parameters.py AllGatherCoalescedHandle, held by the coordinator's
// in-flight registry); their own copies are made at the first fetch of any of them. Returns the most elements
// gathered at once, flat buffers and persistent parameters included.
// zero3_gathered_peak's trace: each entry a parameter and the step it is used at.
struct Zero3Trace {
  struct Entry {
    int param;
    int64_t step;
  };
  std::vector<uint64_t> size;  // [param]
  std::vector<Entry> entries;
};

Zero3Trace zero3_trace(const Shapes& s, bool checkpoint) {
  Zero3Trace out;
  std::vector<uint64_t>& size = out.size;
  const auto add_param = [&](uint64_t n) {
    size.push_back(n);
    return static_cast<int>(size.size()) - 1;
  };
  const auto h = static_cast<uint64_t>(s.h), f = static_cast<uint64_t>(s.ffn), v = static_cast<uint64_t>(s.vocab);
  const bool llama = s.family == Family::kLlama;
  std::vector<int> embeddings = {add_param(v * h)};
  if (!llama) embeddings.push_back(add_param(static_cast<uint64_t>(s.positions) * h));
  std::vector<int> head = {add_param(h)};
  if (!llama) head.push_back(add_param(h));
  head.push_back(s.tied_head ? embeddings[0] : add_param(v * h));
  std::vector<std::vector<int>> blocks(static_cast<size_t>(s.layers));
  for (std::vector<int>& block : blocks) {
    if (llama) {
      const uint64_t kv = static_cast<uint64_t>(s.kv_heads) * (h / static_cast<uint64_t>(s.heads));
      for (uint64_t n : {h, h * h, kv * h, kv * h, h * h, h, f * h, f * h, h * f}) block.push_back(add_param(n));
    } else {  // each module's weight, then its bias
      for (uint64_t n : {h, h, h * 3 * h, 3 * h, h * h, h, h, h, h * f, f, f * h, h}) block.push_back(add_param(n));
    }
  }
  std::vector<Zero3Trace::Entry>& trace = out.entries;
  int64_t step = 0;
  const auto module = [&](int param) { trace.push_back({param, step++}); };
  for (int p : embeddings) module(p);
  for (const std::vector<int>& block : blocks) {
    for (int p : block) module(p);
  }
  for (int p : head) module(p);
  ++step;
  for (auto p = head.rbegin(); p != head.rend(); ++p) module(*p);
  for (auto block = blocks.rbegin(); block != blocks.rend(); ++block) {
    if (checkpoint) {
      for (int p : *block) module(p);
      ++step;
    }
    for (auto p = block->rbegin(); p != block->rend(); ++p) module(*p);
  }
  for (auto p = embeddings.rbegin(); p != embeddings.rend(); ++p) module(*p);
  return out;
}

// The coordinator over that trace, as above.
uint64_t zero3_gathered_peak(const Shapes& s, const Knobs& k) {
  using Entry = Zero3Trace::Entry;
  const Zero3Trace made = zero3_trace(s, k.checkpoint);
  const std::vector<uint64_t>& size = made.size;
  const std::vector<Entry>& trace = made.entries;
  const auto knob = [&](uint64_t full) { return full == 0 ? 0 : per_k2(full, k.shrink); };
  const uint64_t threshold = knob(k.param_persistence_threshold), bucket = knob(k.prefetch_bucket_size),
                 max_live = knob(k.max_live_parameters), reuse = knob(k.max_reuse_distance);
  std::vector<int64_t> fetched_for(size.size(), INT64_MIN);
  std::deque<Entry> queue(trace.begin(), trace.end());
  CoordinatorHeld held(size, threshold);
  uint64_t peak = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    const auto [p, at] = trace[i];
    const auto param = static_cast<size_t>(p);
    held.fetch(p);
    if (fetched_for[param] < at) {
      fetched_for[param] = queue.front().step;
      queue.pop_front();
    }
    if (bucket > 0) {
      const int64_t limit = std::min<int64_t>(static_cast<int64_t>(max_live) - static_cast<int64_t>(held.available),
                                              static_cast<int64_t>(bucket));
      int64_t prefetching = 0;
      std::set<int> prefetch;
      while (!queue.empty() && prefetching < limit) {
        const Entry next = queue.front();
        queue.pop_front();
        if (!held.gathered[static_cast<size_t>(next.param)] && prefetch.insert(next.param).second) {
          prefetching += static_cast<int64_t>(size[static_cast<size_t>(next.param)]);
        }
        fetched_for[static_cast<size_t>(next.param)] =
            std::max(fetched_for[static_cast<size_t>(next.param)], next.step);
      }
      held.prefetch(prefetch);
    }
    peak = std::max(peak, held.all);
    if (size[param] <= threshold || fetched_for[param] > at + 1) continue;
    bool again = false;
    uint64_t between = 0;
    for (size_t j = i + 1; j < trace.size() && between < reuse && !again; ++j) {
      again = trace[j].param == p;
      between += size[static_cast<size_t>(trace[j].param)];
    }
    if (!again) held.free(p);
  }
  return peak;
}

Estimate zero3(const Shapes& s, const Knobs& k) {
  const std::vector<uint64_t> counts = unit_counts(s);
  const auto n = static_cast<uint64_t>(k.world);
  const auto [padded, shards] = pad_units(counts, n);
  Estimate e;
  add(e, &Estimate::parameters, "parameters", "parameter partitions (2Ψ/N)", shards * k.param_bytes);
  if (k.world > 1) {
    add(e, &Estimate::parameters, "parameters",
        "gathered parameters: persistent, in use, prefetched and kept for reuse",
        zero3_gathered_peak(s, k) * k.param_bytes);
  }
  add(e, &Estimate::gradients, "gradients", "gradient partitions (2Ψ/N)", shards * k.grad_bytes);
  // One .grad at a time: autograd makes it, stage3.py copies it into the ipg bucket and drops it.
  const std::vector<uint64_t> root = root_tensors(s), block = block_tensors(s);
  const uint64_t backward = std::max(*std::max_element(root.begin(), root.end()),
                                     s.layers > 0 ? *std::max_element(block.begin(), block.end()) : 0) *
                            k.grad_bytes;
  // stage3.py _create_fp16_sub_groups: the module's parameters in order, each partitioned on its own (ds_tensor:
  // ⌈t/N⌉ elements), a sub-group closed once it holds sub_group_size partition elements.
  uint64_t sub_group = 0, largest_sub_group = 0;
  const uint64_t sub_group_limit = per_k2(k.sub_group_size, k.shrink);
  for (const uint64_t t : registration_order(s)) {
    sub_group += round_up(t, n) / n;
    if (sub_group >= sub_group_limit) {
      largest_sub_group = std::max(largest_sub_group, sub_group);
      sub_group = 0;
    }
  }
  largest_sub_group = std::max(largest_sub_group, sub_group);
  const uint64_t at_step = largest_sub_group * (k.grad_bytes == 4 ? 4 : k.grad_bytes + 4);
  if (at_step > backward) {
    add(e, &Estimate::gradients, "gradients", "step: the largest sub-group's flat and fp32 gradients", at_step);
  } else {
    add(e, &Estimate::gradients, "gradients", "the largest parameter's .grad being made, before the ipg bucket",
        backward);
  }
  add(e, &Estimate::buckets, "buckets", "ipg reduce bucket (reduce_bucket_size elements, one whatever overlap_comm)",
      per_k2(k.reduce_bucket_size, k.shrink) * k.grad_bytes);
  add_optimizer(e, k, shards, "the partitions (12Ψ/N)");
  return e;
}

Estimate fsdp(const Shapes& s, const Knobs& k) {
  const std::vector<uint64_t> counts = unit_counts(s);
  int group = k.world;
  if (k.strategy == "fsdp-no-shard") group = 1;
  if (k.strategy == "fsdp-hybrid") group = k.ranks_per_node;
  const auto m = static_cast<uint64_t>(group);
  const auto [padded, shards] = pad_units(counts, m);
  Estimate e;
  if (group > 1) {
    // Blocks alive at once besides the root: all of them (SHARD_GRAD_OP keeps each from its forward to its
    // backward), else the one in use and, with BACKWARD_PRE or forward prefetch, the next.
    const std::vector<uint64_t> blocks(padded.begin() + 1, padded.end());
    uint64_t window = 0;
    if (k.strategy == "fsdp-grad-op") {
      window = std::accumulate(blocks.begin(), blocks.end(), uint64_t{0});
    } else {
      // BACKWARD_POST: FSDP1's post-backward hook reshards the unit before it prefetches the next.
      const bool prefetch = k.backward_prefetch == Prefetch::kBackwardPre || k.forward_prefetch;
      for (size_t b = 0; b < blocks.size(); ++b) {
        window = std::max(window, blocks[b] + (prefetch && b + 1 < blocks.size() ? blocks[b + 1] : 0));
      }
    }
    add(e, &Estimate::parameters, "parameters", "unsharded low-precision units: root and blocks in use",
        (padded[0] + window) * k.param_bytes);
    if (k.master) {
      // FSDP1 keeps no low-precision shard: each all-gather makes one (_mp_shard) and frees it when the
      // all-gather completes, so the block whose gather completes the window adds its shard; the root's, gathered
      // alone at the start of forward, when that is more.
      const uint64_t largest_block = *std::max_element(blocks.begin(), blocks.end());
      const uint64_t at_peak = std::max(padded[0] / m, window + largest_block / m);  // beyond the root
      add(e, &Estimate::parameters, "parameters", "low-precision shard being all-gathered (_mp_shard)",
          (at_peak - window) * k.param_bytes);
    }
  }
  // The sharded flat parameter is fp32 in the mixed recipe (the master copy); its gradient too.
  const uint64_t shard_grad_bytes = k.master ? 4 : k.grad_bytes;
  if (!k.master) add(e, &Estimate::parameters, "parameters", "sharded flat parameters", shards * k.param_bytes);
  // NO_SHARD with mixed precision: FSDP1 frees _mp_shard only for sharded strategies, so the bf16 copy stays.
  if (k.master && group == 1) {
    add(e, &Estimate::parameters, "parameters", "low-precision copy kept (NO_SHARD's _mp_shard)",
        shards * k.param_bytes);
  }
  // Backward, unit by unit (blocks L..1, then the root), as FSDP1 without use_orig_params makes a FlatParameter's
  // gradient: every parameter is a view of the flat parameter, so autograd holds the views' gradients (n_u in all)
  // until the unit's last one, then concatenates them into the .grad (n_u more, for a moment); the post-backward hook
  // reduce-scatters that into a new P_u/M tensor at the gradient dtype, which is the sharded gradient
  // (_saved_grad_shard) unless the mixed recipe casts it to fp32 (its F.pad copy when n_u < P_u: not counted, as
  // emu does not, the shrunk units padding where full-scale ones do not). Beside a block: the
  // root's head and final-norm gradients (its padding with them), made by the head's backward; the root's embeddings'
  // part comes last. Sharded gradients stay until the step.
  const uint64_t root_head = padded[0] - late_root_gradients(s);
  uint64_t sharded = 0, backward = 0;
  const auto unit_backward = [&, &p = padded](size_t u, uint64_t views, uint64_t beside) {
    const uint64_t own = p[u] / m * shard_grad_bytes;
    const uint64_t output = m > 1 && shard_grad_bytes != k.grad_bytes ? p[u] / m : 0;
    const uint64_t concatenated = (views + counts[u]) * k.grad_bytes;
    const uint64_t reduced = (counts[u] + output) * k.grad_bytes + own;
    backward = std::max(backward, beside + sharded + std::max(concatenated, reduced));
    sharded += own;
  };
  for (size_t b = padded.size() - 1; b >= 1; --b) unit_backward(b, counts[b], root_head * k.grad_bytes);
  unit_backward(0, padded[0], 0);
  add(e, &Estimate::gradients, "gradients",
      "sharded flat gradients made so far beside a unit's views' gradients and their concatenation, or its "
      "reduce-scatter",
      backward);
  add_optimizer(e, k, shards, "the flat shards");
  std::vector<uint64_t> flat_shards(padded.size());
  std::transform(padded.begin(), padded.end(), flat_shards.begin(), [m](uint64_t p) { return p / m; });
  add_step_temporaries(e, k, flat_shards);
  return e;
}

// DeepSpeed without ZeRO (a config's stage 0; runtime/engine.py, runtime/fp16/unfused_optimizer.py) over a client
// torch AdamW: the module in the recipe's bytes (no autocast), FP16_UnfusedOptimizer's fp32 copy of every tensor as
// the master, and at step() an fp32 .grad for every copy beside the module's gradients (none when they are fp32
// already). After backward the engine flattens the gradients, tensors in order, into one bucket at a time, closed
// once it holds more than 500,000,000 elements / k²: the largest such flat copy.
Estimate zero0(const Shapes& s, const Knobs& k) {
  const uint64_t psi = parameter_count(s);
  Estimate e;
  add(e, &Estimate::parameters, "parameters", "parameters (Ψ)", psi * k.param_bytes);
  add(e, &Estimate::gradients, "gradients", "gradients (Ψ), all alive at the step", psi * k.grad_bytes);
  if (k.grad_bytes != 4) {
    add(e, &Estimate::gradients, "gradients", "FP16_UnfusedOptimizer's fp32 .grad of every copy at step()", psi * 4);
  }
  std::vector<uint64_t> tensors = root_tensors(s);
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::vector<uint64_t> block = block_tensors(s);
    tensors.insert(tensors.end(), block.begin(), block.end());
  }
  const uint64_t limit = per_k2(500'000'000, k.shrink);
  uint64_t open = 0, largest = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    open += tensors[i];
    if (open > limit || i + 1 == tensors.size()) {
      largest = std::max(largest, open);
      open = 0;
    }
  }
  add(e, &Estimate::buckets, "buckets", "the largest flat copy of DeepSpeed's all-reduce buckets",
      largest * k.grad_bytes);
  add_optimizer(e, k, psi, "all Ψ");
  add_step_temporaries(e, k, tensors);
  return e;
}

}  // namespace

Estimate estimate(const Shapes& shapes, const Knobs& knobs) {
  if (knobs.strategy == "zero0") return zero0(shapes, knobs);
  if (knobs.strategy == "ddp") return ddp(shapes, knobs, false);
  if (knobs.strategy == "ddp-zero") return ddp(shapes, knobs, true);
  if (knobs.strategy == "zero1") return zero12(shapes, knobs, 1);
  if (knobs.strategy == "zero2") return zero12(shapes, knobs, 2);
  if (knobs.strategy == "zero3") return zero3(shapes, knobs);
  if (knobs.strategy.rfind("fsdp", 0) == 0) return fsdp(shapes, knobs);
  throw std::invalid_argument("unknown strategy " + knobs.strategy);
}

}  // namespace emu::oracle
