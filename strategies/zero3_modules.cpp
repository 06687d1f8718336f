// DeepSpeed ZeRO-3's fetch, prefetch and release of single parameter tensors (zero3_modules.h), replayed over one
// micro-batch's trace.
#include "strategies/zero3_modules.h"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <stdexcept>

namespace emu::strategy {
namespace {

// The stretches of a micro-batch the strategy's hooks bound (Zero3Phases).
enum class Stretch : uint8_t { kForward, kHeadForward, kHeadBackward, kBackward };
struct Use {
  size_t tensor = 0;  // global index: the units' tensors back to back
  // DeepSpeed's step id: the module's position in the trace, counting the modules without parameters of their
  // own that matter here (the model's pre-backward hook before the head's, a decoder layer's before its
  // recomputed forward's backward), so that two uses in a row are not next to each other there
  int64_t step = 0;
  Stretch stretch = Stretch::kForward;
  int unit = 0;
};

class Replay {
 public:
  Replay(const Zero3ModuleInput& input, bool persistent_gathered) : input_(input) {
    for (const std::vector<uint64_t>& unit : input.tensors) {
      first_.push_back(numel_.size());
      for (uint64_t n : unit) {
        numel_.push_back(n);
        persist_.push_back(n <= input.persistence);
      }
    }
    live_.assign(numel_.size(), false);
    handle_of_.assign(numel_.size(), kNoHandle);
    if (persistent_gathered) {
      for (size_t p = 0; p < numel_.size(); ++p) {
        if (persist_[p]) gather(p);
      }
    }
    build_trace();
  }

  Zero3Phases run() {
    const size_t units = input_.tensors.size();
    Zero3Phases phases;
    phases.forward.assign(units, 0);
    phases.backward.assign(units, 0);
    phases.kept.assign(units, false);
    std::vector<int64_t> used_until(numel_.size(), std::numeric_limits<int64_t>::min());
    size_t queue = 0;  // the next entry of the parameter queue
    for (size_t i = 0; i < trace_.size(); ++i) {
      const Use& use = trace_[i];
      const size_t p = use.tensor;
      if (handle_of_[p] != kNoHandle) {
        wait(p);
      } else {
        gather(p);
      }
      if (used_until[p] < use.step) {  // its own entry, not taken by a prefetch
        if (queue != i) throw std::logic_error("ZeRO-3 trace replay: the parameter queue is out of step");
        used_until[p] = trace_[queue++].step;
      }
      prefetch(queue, used_until);
      uint64_t& stretch = stretch_max(phases, use);
      stretch = std::max(stretch, live_elements_);
      release(p, i + 1, use.step + 1, used_until);
      // A block's forward ends with its last tensor: what of it is still gathered stays until its backward.
      if (use.stretch == Stretch::kForward && use.unit > 0 &&
          (i + 1 == trace_.size() || trace_[i + 1].unit != use.unit || trace_[i + 1].stretch != Stretch::kForward)) {
        bool all = true;
        for (size_t t = 0; t < input_.tensors[static_cast<size_t>(use.unit)].size(); ++t) {
          all = all && live_[first_[static_cast<size_t>(use.unit)] + t];
        }
        phases.kept[static_cast<size_t>(use.unit)] = all;
      }
    }
    // The end of backward (reset_step) waits on every handle still in flight and drops it.
    for (size_t p = 0; p < numel_.size(); ++p) {
      if (handle_of_[p] != kNoHandle) wait(p);
    }
    phases.after = live_elements_;
    return phases;
  }

 private:
  void gather(size_t p) {
    if (live_[p]) return;
    live_[p] = true;
    live_elements_ += numel_[p];
    if (!persist_[p]) available_ += numel_[p];
  }
  // A coalesced all-gather (AllGatherCoalescedHandle, partition_parameters.py all_gather_coalesced): one flat
  // buffer of every tensor's elements, all-gathered at once; the tensors are in flight (not available, not to be
  // gathered again) but none has its own copy yet. The coordinator's registry of in-flight tensors holds the handle,
  // so the flat buffer lives until the last of its tensors has been waited on. (DeepSpeed pads each tensor's
  // partition to a whole share per rank; the flat buffer here is the tensors' elements as charged.)
  void gather_coalesced(const std::vector<size_t>& tensors) {
    Handle& handle = handles_.emplace_back();
    handle.tensors = tensors;
    handle.pending = tensors.size();
    for (size_t p : tensors) {
      live_[p] = true;
      available_ += numel_[p];
      handle_of_[p] = handles_.size() - 1;
      handle.flat += numel_[p];
    }
    live_elements_ += handle.flat;
  }
  // A fetch waits on p's handle: the first wait copies every tensor of the handle out of the flat buffer (each its
  // own tensor, torch.cat of its pieces); p leaves the registry, and with the handle's last tensor the flat buffer
  // goes.
  void wait(size_t p) {
    Handle& handle = handles_[handle_of_[p]];
    if (!handle.waited) {
      handle.waited = true;
      for (size_t q : handle.tensors) live_elements_ += numel_[q];
    }
    handle_of_[p] = kNoHandle;
    if (--handle.pending == 0) live_elements_ -= handle.flat;
  }
  void free(size_t p) {
    live_[p] = false;
    live_elements_ -= numel_[p];
    available_ -= numel_[p];
  }

  // Pops entries off the queue while fewer elements than the limit are being prefetched, gathering those not
  // available (DeepSpeed checks the limit before each entry, so the entry that crosses it is fetched too).
  void prefetch(size_t& queue, std::vector<int64_t>& used_until) {
    if (input_.prefetch_bucket == 0) return;
    const int64_t room = static_cast<int64_t>(input_.max_live) - static_cast<int64_t>(available_);
    const int64_t limit = std::min(room, static_cast<int64_t>(input_.prefetch_bucket));
    int64_t prefetching = 0;
    std::vector<size_t> fetched;
    while (queue < trace_.size() && prefetching < limit) {
      const size_t p = trace_[queue].tensor;
      const bool fetch = !live_[p] && std::find(fetched.begin(), fetched.end(), p) == fetched.end();
      used_until[p] = std::max(used_until[p], trace_[queue].step);
      ++queue;
      if (fetch) {
        fetched.push_back(p);
        prefetching += static_cast<int64_t>(numel_[p]);
      }
    }
    // One tensor is gathered into its own buffer (all_gather_coalesced's sequential path); more, coalesced.
    // Persistent tensors on their own: DeepSpeed gathers them apart (stage3.py _post_step, after the optimizer
    // step), never in the coordinator's prefetch.
    std::vector<size_t> coalesced;
    for (size_t p : fetched) {
      if (persist_[p]) {
        gather(p);
      } else {
        coalesced.push_back(p);
      }
    }
    if (coalesced.size() == 1) gather(coalesced.front());
    if (coalesced.size() > 1) gather_coalesced(coalesced);
  }

  // After the use ending at trace position `next` − 1, DeepSpeed's step id now `step_id`: p freed unless
  // persistent, taken by a prefetch for a later use, or used again within the reuse distance.
  void release(size_t p, size_t next, int64_t step_id, const std::vector<int64_t>& used_until) {
    if (persist_[p] || used_until[p] > step_id) return;
    uint64_t traversed = 0;
    for (size_t j = next; j < trace_.size(); ++j) {
      if (traversed >= input_.max_reuse) break;
      if (trace_[j].tensor == p) return;
      traversed += numel_[trace_[j].tensor];
    }
    free(p);
  }

  static uint64_t& stretch_max(Zero3Phases& phases, const Use& use) {
    switch (use.stretch) {
      case Stretch::kForward: return phases.forward[static_cast<size_t>(use.unit)];
      case Stretch::kHeadForward: return phases.head_forward;
      case Stretch::kHeadBackward: return phases.head_backward;
      case Stretch::kBackward: break;
    }
    return phases.backward[static_cast<size_t>(use.unit)];
  }

  void build_trace() {
    const int blocks = static_cast<int>(input_.tensors.size()) - 1;
    const std::vector<uint64_t>& root = input_.tensors.empty() ? empty_ : input_.tensors[0];
    std::vector<size_t> embedding, head;  // the root's tensors by module, forward order
    for (size_t t = 0; t < root.size(); ++t) {
      (t < input_.embedding.size() && input_.embedding[t] ? embedding : head).push_back(t);
    }
    if (input_.tied && !root.empty()) head.push_back(0);
    int64_t step = 0;
    const auto use = [&](size_t tensor, Stretch stretch, int u) { trace_.push_back({tensor, step++, stretch, u}); };
    const auto block = [&](int u, Stretch stretch, bool reverse) {
      const size_t n = input_.tensors[static_cast<size_t>(u)].size();
      for (size_t k = 0; k < n; ++k) use(first_[static_cast<size_t>(u)] + (reverse ? n - 1 - k : k), stretch, u);
    };
    for (size_t t : embedding) use(t, Stretch::kForward, 0);
    for (int u = 1; u <= blocks; ++u) block(u, Stretch::kForward, false);
    for (size_t t : head) use(t, Stretch::kHeadForward, 0);
    ++step;  // the model's own pre-backward hook: the loss is its output
    for (auto t = head.rbegin(); t != head.rend(); ++t) use(*t, Stretch::kHeadBackward, 0);
    for (int u = blocks; u >= 1; --u) {
      if (input_.checkpoint) {
        block(u, Stretch::kBackward, false);
        ++step;  // the recomputed layer's own pre-backward hook
      }
      block(u, Stretch::kBackward, true);
    }
    for (auto t = embedding.rbegin(); t != embedding.rend(); ++t) use(*t, Stretch::kBackward, 0);
  }

  const Zero3ModuleInput& input_;
  const std::vector<uint64_t> empty_;
  std::vector<size_t> first_;  // [unit] its first tensor's global index
  std::vector<uint64_t> numel_;
  std::vector<bool> persist_, live_;
  std::vector<Use> trace_;
  struct Handle {
    std::vector<size_t> tensors;
    uint64_t flat = 0;   // the flat buffer's elements
    size_t pending = 0;  // its tensors not yet waited on
    bool waited = false;
  };
  static constexpr size_t kNoHandle = std::numeric_limits<size_t>::max();
  std::vector<Handle> handles_;
  std::vector<size_t> handle_of_;  // [tensor] the handle it is in flight in, or kNoHandle
  uint64_t live_elements_ = 0;     // every tensor's own copy now, and the flat buffers of handles in flight
  uint64_t available_ = 0;         // the coordinator's count: the non-persistent ones
};

}  // namespace

Zero3ModuleInput zero3_module_input(const StrategyOptions& options, const AnalyticInput& input) {
  Zero3ModuleInput modules;
  for (size_t u = 0; u < input.unit_counts.size(); ++u) {
    const std::vector<uint64_t> tensors =
        input.unit_tensors_charged.empty() ? input.tensors_of(u) : input.unit_tensors_charged[u];
    if (u == 0 || u >= input.forward_order.size()) {
      modules.tensors.push_back(tensors);
      continue;
    }
    std::vector<uint64_t>& ordered = modules.tensors.emplace_back();
    for (size_t t : input.forward_order[u]) ordered.push_back(tensors.at(t));
  }
  modules.embedding = input.root_at_end;
  // Without a separate embedding (embedding_elements 0) the head reads the token table.
  modules.tied = input.embedding_elements == 0 && input.head_elements > 0;
  modules.checkpoint = input.checkpoint;
  // ÷ k², a knob of 0 kept at 0 (a prefetch bucket of 0 turns prefetching off).
  const auto knob = [&](uint64_t full_scale) { return full_scale == 0 ? 0 : options.scaled(full_scale); };
  modules.prefetch_bucket = knob(options.zero.prefetch_bucket_elements);
  modules.max_live = knob(options.zero.max_live_parameters);
  modules.max_reuse = knob(options.zero.max_reuse_distance);
  modules.persistence = knob(options.zero.param_persistence_threshold);
  return modules;
}

uint64_t Zero3Phases::max() const {
  uint64_t most = std::max({head_forward, head_backward, after});
  for (uint64_t v : forward) most = std::max(most, v);
  for (uint64_t v : backward) most = std::max(most, v);
  return most;
}

Zero3Phases zero3_module_phases(const Zero3ModuleInput& input, bool persistent_gathered) {
  return Replay(input, persistent_gathered).run();
}

}  // namespace emu::strategy
