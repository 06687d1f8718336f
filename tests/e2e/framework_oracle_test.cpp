// emu against recorded reality: numbers that real PyTorch and DeepSpeed produced, checked in as fixtures under
// tests/data/oracle/ by scripts/oracle/ (the versions, configs and commands are in each file).
//
// PyTorch cases: small Hugging Face Llama and GPT-2 models trained on CPU with gloo at 2 and 4 ranks under DDP,
// DDP + ZeroRedundancyOptimizer, FSDP1 (FULL_SHARD) and FSDP2 (fully_shard), fp32 and mixed, tracked over the
// second optimizer step by PyTorch's own MemTracker / FSDPMemTracker. For each case emu runs the same config,
// micro-batch, sequence length and ranks under its matching strategy (ddp; ddp-zero for ZeroRedundancyOptimizer;
// fsdp for FSDP1; fsdp2 for FSDP2, tracked by FSDPMemTracker) and every category's peak — measured and
// predicted — must equal the recorded one within 3% once the named differences below are added. Each named
// difference is one line with its reason and its bytes computed from the shapes, so that the fix that removes
// it deletes that line. Activations and temporaries are compared as their sum at the two totals' peaks, and with
// the total checked, at the moment the recorded total peaked (the loss's backward; with checkpointing the optimizer
// step or a block's backward, read from the recorded breakdown), which emu's peak must be too; the category peaks of
// activations and temporaries alone, which fall at different moments, are printed as OPEN and not checked.
//
// DeepSpeed cases: its own model-state estimators (estimate_zero2/zero3_model_states_mem_needs) for emu's presets
// at 1-64 GPUs against emu's --plan, with the estimator's assumptions and emu's extra buffers named; and DeepSpeed
// ZeRO-3 itself (tests/data/oracle/deepspeed/, scripts/oracle/deepspeed_run.py: the tiny Llama on CPU, tracked by
// MemTracker) against emu's zero3 run from the same zero_optimization keys as a DeepSpeed config, DeepSpeed ZeRO-1
// and ZeRO-2 (stage_1_and_2.py) against emu's zero1 and zero2 likewise, and DeepSpeed without ZeRO (stage 0:
// FP16_UnfusedOptimizer over the torch AdamW) against emu's zero0.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "tests/oracle/memory_oracle.h"
#include "tests/support/emu_process.h"
#include "tests/support/paths.h"

namespace emu {
namespace {

using nlohmann::json;
using testing::kEmu;
using testing::mpiexec;
using testing::read_json;
using testing::run_process;

const std::string kData = std::string(EMU_SOURCE_DIR) + "/tests/data/oracle";
constexpr double kTolerance = 0.03;
// A checked total, once its differences are named, is held closer: every recorded case agrees within 0.07% (1.5 KB
// here), so a buffer made at the wrong moment (a 40,000-byte ipg bucket alive at the loss's backward, 1.4% of the
// ZeRO-1 total) fails it though the issue's 3% would let it through.
constexpr double kTotalTolerance = 0.001;

// A fixture's "parameters"-style bytes, scaled by EMU_ORACLE_PLANT (tests only: a planted bug that mis-scales
// what emu reports for one category must fail the comparison).
double planted_scale(const std::string& category) {
  const char* plant = std::getenv("EMU_ORACLE_PLANT");
  return plant != nullptr && category == plant ? 1.5 : 1.0;
}

oracle::Shapes shapes_of(const json& config) {
  oracle::Shapes s;
  if (config.value("model_type", "") == "gpt2") {
    s.family = oracle::Family::kGpt2;
    s.h = config["n_embd"];
    s.ffn = config["n_inner"].is_null() ? 4 * s.h : config["n_inner"].get<int64_t>();
    s.vocab = config["vocab_size"];
    s.positions = config["n_positions"];
    s.layers = config["n_layer"];
    s.heads = config["n_head"];
    s.kv_heads = s.heads;
    s.tied_head = true;
    return s;
  }
  s.family = oracle::Family::kLlama;
  s.h = config["hidden_size"];
  s.ffn = config["intermediate_size"];
  s.vocab = config["vocab_size"];
  s.positions = config["max_position_embeddings"];
  s.layers = config["num_hidden_layers"];
  s.heads = config["num_attention_heads"];
  s.kv_heads = config.value("num_key_value_heads", s.heads);
  s.tied_head = config.value("tie_word_embeddings", false);
  return s;
}

// The emu strategy that reproduces a recorded framework, or "" when emu has none yet.
std::string emu_strategy(const std::string& framework) {
  if (framework == "ddp") return "ddp";
  if (framework == "ddp-zero") return "ddp-zero";
  if (framework == "fsdp1") return "fsdp";
  if (framework == "fsdp2") return "fsdp2";
  return "";
}

// The fixtures of one folder under tests/data/oracle/, in name order, each with its file name as "file".
std::vector<json> load_fixtures(const std::string& folder) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(kData + "/" + folder)) {
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<json> fixtures;
  for (const auto& file : files) {
    fixtures.push_back(read_json(file.string()));
    fixtures.back()["file"] = file.filename().string();
  }
  return fixtures;
}

std::vector<json> load_pytorch_cases(const std::string& model) {
  std::vector<json> cases;
  for (json& c : load_fixtures("pytorch")) {
    if (c["model"] == model) cases.push_back(std::move(c));
  }
  return cases;
}

// One emu run per (recipe, attention, checkpointing, tokens, ranks): the strategies of all its cases at once.
std::string run_key(const json& c) {
  return fmt::format("{}-{}-{}-s{}b{}-n{}", c["recipe"].get<std::string>(), c["attention"].get<std::string>(),
                     c["gradient_checkpointing"].get<bool>() ? "ckpt" : "nockpt", c["seq_len"].get<int>(),
                     c["micro_batch"].get<int>(), c["ranks"].get<int>());
}

json run_emu(const json& c, const std::set<std::string>& strategies, const std::string& json_path) {
  std::vector<std::string> names(strategies.begin(), strategies.end());
  const std::string command =
      mpiexec(c["ranks"]) + kEmu +
      fmt::format(
          " --model {}/{}-tiny.json --shrink 1 --seq-len {} --micro-batch {} --reserve 0"
          " --steps 1 --clip 0 --precision {} --attention {} {} --strategies {}"
          " --json {}",
          kData, c["model"].get<std::string>(), c["seq_len"].get<int>(), c["micro_batch"].get<int>(),
          c["recipe"].get<std::string>(), c["attention"].get<std::string>(),
          c["gradient_checkpointing"].get<bool>() ? "--checkpoint" : "--no-checkpoint", fmt::join(names, ","),
          json_path);
  const auto run = run_process(command, 120);
  EXPECT_EQ(run.exit_code, 0) << command << "\n" << run.err;
  return run.exit_code == 0 ? read_json(json_path) : json();
}

const json* strategy_in(const json& root, const std::string& name) {
  if (!root.contains("strategies")) return nullptr;
  for (const json& s : root["strategies"]) {
    if (s["name"] == name) return &s;
  }
  return nullptr;
}

// A difference between what the framework allocates (as recorded) and what emu allocates, by name, in bytes
// (emu minus the record), computed from the shapes.
struct Named {
  std::string reason;
  int64_t bytes = 0;
  bool in_total = true;  // false: a difference of the recorded category peaks alone, not of one moment's bytes
};

struct Line {
  std::string category;
  int64_t framework = 0;
  int64_t measured = 0;
  int64_t predicted = -1;             // -1: emu predicts no such figure
  int64_t predicted_rank_offset = 0;  // the predicted rank's bytes minus the measured rank's (ddp-zero's partition)
  std::vector<Named> named;
  bool open = false;       // the gap is not yet named from the shapes: checked only in direction
  bool unchecked = false;  // printed, not checked: the frameworks differ by design (said where it is set)
};

// Carries the named differences of the `lines` that `carried` chooses into `total`, those that count in a total
// (Named::in_total), each with its line's category.
template <typename Carried>
void carry_into_total(const std::vector<Line>& lines, Line& total, Carried carried) {
  for (const Line& line : lines) {
    if (!carried(line)) continue;
    for (const Named& n : line.named) {
      if (n.in_total) total.named.push_back({fmt::format("{} ({})", n.reason, line.category), n.bytes});
    }
  }
}

int64_t sum_named(const Line& line) {
  return std::accumulate(line.named.begin(), line.named.end(), int64_t{0},
                         [](int64_t a, const Named& n) { return a + n.bytes; });
}

bool within(int64_t got, int64_t want) {
  return std::abs(static_cast<double>(got - want)) <= kTolerance * std::max<double>(static_cast<double>(want), 1.0);
}

// What one case is: the shapes and the recorded rank compared (the one that peaked highest).
struct CaseFacts {
  oracle::Shapes shapes;
  int64_t psi = 0;        // Ψ parameters
  int64_t tensors = 0;    // parameter tensors
  int64_t n = 1;          // ranks
  bool mixed = false;     // PyTorch (and emu's ddp): autocast over fp32; emu's fsdp: bf16 gathered units
  int64_t emu_bytes = 4;  // emu's compute bytes per element
  int recorded_rank = 0;
  int emu_rank = 0;             // the rank emu reports its peak for; its predictor speaks for rank 0
  bool peaked_in_step = false;  // the recorded total peaked in the optimizer step (8 tokens: the -s8b1 cases)
};

// PyTorch's rotary embedding keeps inv_freq and original_inv_freq (head_dim / 2 fp32 each) as buffers; GPT-2's
// learned positions are a parameter. emu keeps no buffers.
int64_t rope_buffers(const CaseFacts& f, int64_t bytes) {
  if (f.shapes.family != oracle::Family::kLlama) return 0;
  return 2 * (f.shapes.h / f.shapes.heads / 2) * bytes;
}

// ZeroRedundancyOptimizer's partition (torch/distributed/optim/zero_redundancy_optimizer.py,
// _partition_parameters): whole tensors, largest first, each to the rank with the fewest elements so far.
std::pair<int64_t, int64_t> zero_redundancy_partition(const CaseFacts& f, int rank) {
  std::vector<uint64_t> sorted = oracle::registration_order(f.shapes);
  std::stable_sort(sorted.begin(), sorted.end(), std::greater<>());
  std::vector<int64_t> elements(static_cast<size_t>(f.n), 0), count(static_cast<size_t>(f.n), 0);
  for (uint64_t t : sorted) {
    const auto least = static_cast<size_t>(std::min_element(elements.begin(), elements.end()) - elements.begin());
    elements[least] += static_cast<int64_t>(t);
    ++count[least];
  }
  return {elements[static_cast<size_t>(rank)], count[static_cast<size_t>(rank)]};
}

// The named differences of one category for DDP against emu's ddp, and for DDP + ZeroRedundancyOptimizer against
// emu's ddp-zero. Both keep PyTorch's recipe: under autocast fp32 weights, gradients and buckets, no master copy.
// Under ZeroRedundancyOptimizer MemTracker learns of the wrapped AdamW's moments only at that AdamW's step
// post-hook: they were made in the first step, before tracking began, and the wrapper's own `state` does not hold
// them. So the recorded Optstate peak is the moments alone (foreach's temporaries, made earlier in the step, were
// freed by then), and the recorded total, whose peak is in forward, holds no optimizer state at all.
void name_ddp(const std::string& category, const CaseFacts& f, Line& line, bool zero) {
  const auto [owned, owned_tensors] =
      zero ? zero_redundancy_partition(f, f.recorded_rank) : std::pair{f.psi, f.tensors};
  // A total that peaked in forward holds no optimizer state; one that peaked in the step (the -s8b1 cases), at the
  // wrapped AdamW's post-hook, holds the moments and counters but not foreach's temporaries, freed by then: emu's
  // peak, inside the step, holds them (as a GPU would: the temporaries are made beside the moments).
  const bool in_total = !zero || f.peaked_in_step;
  if (category == "optimizer_state") {
    line.named.push_back(
        {"AdamW's step counters: one fp32 tensor per parameter tensor the rank updates", -4 * owned_tensors, in_total});
  }
  if (category == "optimizer_state" && zero) {
    const int64_t measured = zero_redundancy_partition(f, f.emu_rank).first;
    line.named.push_back({fmt::format("the whole tensors of emu's rank {} ({} elements) against the recorded rank {}'s "
                                      "({}): Adam's m and v",
                                      f.emu_rank, measured, f.recorded_rank, owned),
                          8 * (measured - owned), in_total});
    line.named.push_back(
        {"foreach AdamW's step temporaries (4 B per owned element), freed before MemTracker "
         "registered the moments",
         4 * measured, in_total});
    line.predicted_rank_offset = 12 * (zero_redundancy_partition(f, 0).first - measured);
  }
  // The Reducer's fp32 buckets (one here: the model is under the first bucket's 1 MiB cap) are made again in the
  // second iteration's forward, when DDP rebuilds them in the order the gradients came (Reducer::rebuild_buckets,
  // called from DistributedDataParallel.forward): through the dispatcher, so MemTracker sees them, and files them
  // under activations. The recorded step is the second, so its total holds them; only the category differs.
  if (category == "buckets") {
    line.named.push_back(
        {"the Reducer's fp32 buckets, rebuilt in the second forward: filed by MemTracker as "
         "activations",
         4 * f.psi, false});
  }
  if (category == "activations") {
    line.named.push_back({"the Reducer's fp32 buckets (MemTracker's activations, emu's buckets)", -4 * f.psi, false});
  }
  if (category == "buffers") line.named.push_back({"RoPE inv_freq buffers (emu keeps none)", -rope_buffers(f, 4)});
}

// FSDP1 FULL_SHARD (one FlatParameter per unit: the root and each block) against emu's fsdp.
void name_fsdp1(const std::string& category, const CaseFacts& f, Line& line) {
  const std::vector<uint64_t> units = oracle::unit_counts(f.shapes);
  const auto root = static_cast<int64_t>(units.at(0));
  if (category == "parameters" && f.mixed) {
    // FSDP1 makes the low-precision shard of a unit for its all-gather and frees it after (_mp_shard); emu
    // charges it as a parameter, MemTracker files it elsewhere. At the parameters' peak it is the root's.
    const auto root_shard = static_cast<int64_t>(
        oracle::round_up(static_cast<uint64_t>(root), static_cast<uint64_t>(f.n)) / static_cast<uint64_t>(f.n));
    // Only there: at the totals' peaks (the loss's or a block's backward) no all-gather is in flight.
    line.named.push_back({"FSDP1's bf16 shard of the root made for its all-gather (_mp_shard)", 2 * root_shard, false});
  }
  if (category == "gradients") {
    // MemTracker's gradient peak is one unit's FlatParameter.grad, the largest (the root's is made at the end of
    // backward, when its split backward gathers the views' gradients into it). emu's moments (fsdp.cpp), per unit in
    // backward order: the end of its backward, its parameters' (views') gradients beside their concatenation, the
    // FlatParameter's .grad; then its reduce-scatter, that .grad beside the reduce-scatter output (bf16 in the mixed
    // recipe; in fp32 the output is the sharded gradient itself) and its fp32 sharded gradient. Beside each block's:
    // the root's head and final-norm part (made when backward begins; in PyTorch autograd holds it for the root's
    // split backward, not a .grad to MemTracker) and the sharded gradients of the units reduced before it.
    const auto n = static_cast<uint64_t>(f.n);
    const int64_t g = f.emu_bytes;
    std::vector<int64_t> counts(units.size()), padded(units.size());  // n_u, P_u
    std::transform(units.begin(), units.end(), counts.begin(), [](uint64_t u) { return static_cast<int64_t>(u); });
    std::transform(units.begin(), units.end(), padded.begin(),
                   [n](uint64_t u) { return static_cast<int64_t>(oracle::round_up(u, n)); });
    const int64_t largest = *std::max_element(padded.begin(), padded.end());
    const int64_t head = padded[0] - static_cast<int64_t>(oracle::late_root_gradients(f.shapes));
    struct Moment {
      int64_t flat = 0, head = 0, beside = 0, sharded = 0;  // beside: the views', or the reduce-scatter output
      int64_t bytes() const { return flat + head + beside + sharded; }
    };
    Moment peak;
    int64_t sharded = 0;
    const auto consider = [&](size_t u, int64_t views, int64_t held_head) {
      const int64_t own = 4 * padded[u] / f.n;
      const int64_t output = f.mixed ? g * padded[u] / f.n : 0;
      for (const Moment m : {Moment{g * counts[u], held_head, views, sharded},
                             Moment{g * counts[u], held_head, output, sharded + own}}) {
        if (m.bytes() > peak.bytes()) peak = m;
      }
      sharded += own;
    };
    for (size_t u = padded.size() - 1; u >= 1; --u) consider(u, g * counts[u], g * head);
    consider(0, g * padded[0], 0);  // the root's parts (charged at its padded count) beside their concatenation
    // emu's gradient peak is in backward, its total's at backward's start (before any sharded gradient), so these
    // lines do not carry over to the total (compare() names what emu's total holds).
    line.named.push_back(
        {"fp32 gradient shards made by emu's peak: FSDP1 sets FlatParameter.grad in its post-backward hook, past "
         "MemTracker's gradient hook",
         peak.sharded, false});
    line.named.push_back(
        {"the head's and final norm's gradients (a tied head's: the final norm's alone; its part of the table's "
         "is a temporary on both sides) beside a block's, held by autograd for the root's FlatParameter until the "
         "end of backward: not a .grad to MemTracker",
         peak.head, false});
    line.named.push_back(
        {"the views' gradients beside their concatenation into the FlatParameter's .grad (split backward), or the "
         "reduce-scatter's output beside it: autograd's and the post-backward hook's tensors, Temp to MemTracker",
         peak.beside, false});
    line.named.push_back(
        {"the unit whose unsharded gradient is at emu's peak against the largest unit's, MemTracker's peak",
         peak.flat - g * largest, false});
  }
  if (category == "optimizer_state") {
    line.named.push_back(
        {"AdamW's step counters: one fp32 tensor per FlatParameter", -4 * static_cast<int64_t>(units.size())});
  }
  if (category == "buffers") {
    line.named.push_back({"RoPE inv_freq buffers (emu keeps none; bf16 under MixedPrecision's buffer_dtype)",
                          -rope_buffers(f, f.mixed ? 2 : 4)});
  }
}

// FSDP2 (fully_shard per block and on the root) against emu's fsdp2. Every parameter is sharded on dim 0: the
// shapes of these models divide by N, so unit u's shard is n_u/N and its all-gather output, unsharded parameters
// and reduce-scatter input n_u. FSDPMemTracker records each of its categories' peak on its own and files a unit's
// unsharded gradients as such when its post-backward takes them, one unit at a time: its Unsharded Grad peak is
// the largest unit's, its Sharded Grad peak every shard (at the step), its All Gather peak two consecutive units'
// outputs (forward keeps one for overlap), its Reduce Scatter peak the largest unit's input. emu has one category,
// and so one moment, for each pair; those lines name the difference between emu's moment and the sum of the two
// recorded peaks, and do not carry over to the total.
void name_fsdp2(const std::string& category, const CaseFacts& f, Line& line) {
  std::vector<int64_t> n;  // n_u
  for (uint64_t u : oracle::unit_counts(f.shapes)) n.push_back(static_cast<int64_t>(u));
  const int64_t p = f.emu_bytes;  // param_dtype: bf16 in mixed
  const int64_t g = f.emu_bytes;  // autograd's unsharded gradients, at the param dtype
  const int64_t r = 4;            // reduce_dtype fp32 (mixed) or fp32: the sharded gradients and reduce-scatter input
  const size_t last = n.size() - 1;
  const int64_t largest = *std::max_element(n.begin(), n.end());
  int64_t pair = 0;  // the largest two consecutive units (forward order: the root, then the blocks)
  for (size_t u = 0; u < last; ++u) pair = std::max(pair, n[u] + n[u + 1]);
  if (category == "gradients") {
    // emu's moments: a block's backward (the root's head and final-norm gradients, made when backward begins,
    // beside the block's and the sharded gradients reduced so far), the root's reduce-scatter (its whole unsharded
    // gradients, the embeddings' made last, beside the blocks' sharded ones), the optimizer step (every sharded
    // gradient).
    const auto head = n[0] - static_cast<int64_t>(oracle::late_root_gradients(f.shapes));
    int64_t reduced = 0, moment = 0;
    for (size_t u = last; u >= 1; --u) {
      moment = std::max(moment, g * head + g * n[u] + reduced);
      reduced += r * n[u] / f.n;
    }
    const int64_t all_shards = reduced + r * n[0] / f.n;
    moment = std::max({moment, reduced + g * n[0], all_shards});
    line.named.push_back(
        {"one moment of emu's gradients where FSDPMemTracker's Sharded Grad peak (every shard) and "
         "Unsharded Grad peak (the largest unit's) are summed",
         moment - (all_shards + g * largest), false});
  }
  if (category == "buckets") {
    // emu's moments: forward, a unit's all-gather output kept beside the next one's (FSDPCommContext
    // all_gather_state); backward, a block's fp32 reduce-scatter input kept beside the next block's prefetched
    // all-gather output; the root's reduce-scatter input alone.
    int64_t moment = std::max(r * n[0], p * pair);
    for (size_t u = last; u >= 2; --u) moment = std::max(moment, r * n[u] + p * n[u - 1]);
    line.named.push_back(
        {"one moment of emu's buckets where FSDPMemTracker's All Gather peak (two consecutive units' "
         "outputs in forward) and Reduce Scatter peak (the largest unit's input) are summed",
         moment - (p * pair + r * largest), false});
  }
  if (category == "optimizer_state") {
    line.named.push_back({"AdamW's step counters: one fp32 tensor per parameter tensor", -4 * f.tensors});
  }
  if (category == "buffers") {
    line.named.push_back(
        {"RoPE inv_freq buffers (emu keeps none; MixedPrecisionPolicy leaves buffers fp32)", -rope_buffers(f, 4)});
  }
}

using RecordedCategories = std::map<std::string, int64_t>;

// MemTracker's categories folded into emu's.
int64_t recorded(const RecordedCategories& r, const std::string& category) {
  // MemTracker's names, then FSDPMemTracker's (FSDP2), which splits parameters and gradients into their sharded
  // and unsharded tensors and adds the all-gather and reduce-scatter buffers.
  static const std::map<std::string, std::vector<std::string>> kFrom = {
      {"parameters", {"Parameter", "Sharded Param", "Unsharded Param"}},
      {"gradients", {"Gradient", "Sharded Grad", "Unsharded Grad"}},
      {"optimizer_state", {"Optstate", "OptState"}},
      {"buckets", {"All Gather", "Reduce Scatter"}},
      {"buffers", {"Buffer"}},
      {"activations", {"Activation"}},
      {"temporaries", {"Temp"}}};
  int64_t bytes = 0;
  for (const std::string& key : kFrom.at(category)) {
    if (r.contains(key)) bytes += r.at(key);
  }
  return bytes;
}

int64_t emu_category(const json& peaks, const std::string& category) {
  if (category == "parameters") return peaks["parameters"].get<int64_t>() + peaks["master_weights"].get<int64_t>();
  if (category == "buffers") return 0;
  return peaks[category].get<int64_t>();
}

// One line per category in `states` and for activations and temporaries — the framework's peak, emu's measured and
// predicted, named by `name(category, line)` — then activations + temporaries as one line. MemTracker files a
// tensor made in a module's forward as an activation and anything else as a temporary; emu files what is saved for
// backward as an activation and the rest of the work as temporaries. The two split the same bytes differently (a
// recomputed block's tensors, the loss's upcasts), so each is printed and their sum is what is compared. Their
// category peaks fall at different moments (the activations' at the end of forward, the temporaries' in the loss's
// backward), so where the recording has the breakdown at its total's peak (`at_peak`) the act+temp line is the
// sum at the two totals' peaks, named by the caller; else it is the sum of the category peaks, open.
template <typename Name>
std::vector<Line> category_lines(const std::vector<std::string>& states, const RecordedCategories& peaks,
                                 const json& emu, Name&& name, const RecordedCategories* at_peak = nullptr) {
  const json& measured = emu["peak"]["category_peaks"];
  const json& predicted = emu["predicted"]["by_category"];
  std::vector<std::string> categories = states;
  categories.insert(categories.end(), {"activations", "temporaries"});
  std::vector<Line> lines;
  for (const std::string& category : categories) {
    Line line;
    line.category = category;
    line.framework = recorded(peaks, category);
    line.measured =
        static_cast<int64_t>(static_cast<double>(emu_category(measured, category)) * planted_scale(category));
    if (category != "activations" && category != "temporaries") {
      line.predicted =
          static_cast<int64_t>(static_cast<double>(emu_category(predicted, category)) * planted_scale(category));
    } else {
      line.open = line.unchecked = true;
      if (category == "activations") line.predicted = emu["predicted"]["activation_bytes"];
    }
    name(category, line);
    lines.push_back(std::move(line));
  }
  Line work;
  work.category = at_peak != nullptr ? "act+temp@peak" : "act+temp";
  work.open = at_peak == nullptr;
  for (const Line& line : lines) {
    if (line.category != "activations" && line.category != "temporaries") continue;
    if (at_peak != nullptr) {
      work.framework += recorded(*at_peak, line.category);
      work.measured +=
          static_cast<int64_t>(static_cast<double>(emu["peak"]["at_peak_by_category"][line.category].get<int64_t>()) *
                               planted_scale(line.category));
    } else {
      work.framework += line.framework;
      work.measured += line.measured;
    }
  }
  lines.push_back(std::move(work));
  return lines;
}

// The recorded rank with the highest peak (the first of equals): the rank a cap would stop first.
const json& highest_peak(const json& ranks) {
  const json* top = &ranks.at(0);
  for (const json& r : ranks) {
    if (r["peak_bytes"].get<int64_t>() > (*top)["peak_bytes"].get<int64_t>()) top = &r;
  }
  return *top;
}

// Where in the step the recorded total peaked, read from the breakdown MemTracker took there: before autograd made
// any parameter's gradient (the loss's backward, or forward), inside a block's backward (some gradients made, the
// block's temporaries alive), or at the optimizer step (every gradient made, no temporary but the optimizer's, which
// MemTracker files as optimizer state).
// kRootReduceScatter: FSDP2's root reduce-scatter, after backward, outside every module (the -s8b1 case).
enum class Moment : uint8_t { kBeforeGradients, kBlockBackward, kRootReduceScatter, kOptimizerStep };

// FSDP1's units get a .grad only when their backward ends, and their sharded gradients are set past MemTracker's
// gradient hook, so inside a block's backward its breakdown holds no gradient: there the moment is read from the
// module peaks, a block's equal to the total's (`in_block`).
Moment recorded_moment(const RecordedCategories& at_peak, bool in_block) {
  int64_t gradients = 0;
  for (const char* key : {"Gradient", "Sharded Grad", "Unsharded Grad"}) {
    if (at_peak.contains(key)) gradients += at_peak.at(key);
  }
  if (gradients == 0) return in_block ? Moment::kBlockBackward : Moment::kBeforeGradients;
  return at_peak.contains("Temp") && at_peak.at("Temp") > 0 ? Moment::kBlockBackward : Moment::kOptimizerStep;
}

// Whether a recording peaked in step(), outside the engine's forward and backward: deepspeed_run.py records each
// module's peak (MemTracker's local_peak) since the -s8 recordings, and DeepSpeedEngine's, over the whole forward and
// backward, is then below the total's.
bool peaked_in_step(const json& rank) {
  return rank.contains("module_peaks") &&
         rank["module_peaks"].value("DeepSpeedEngine", int64_t{0}) < rank["peak_bytes"].get<int64_t>();
}

// The act+temp line at the two totals' peaks: what the framework holds there and emu does not, or the reverse, by
// name with its bytes from the shapes. emu's peak must be the recorded moment: a different moment shows here.
void name_work_at_peak(const json& c, const CaseFacts& f, const std::string& strategy, Moment moment, Line& line) {
  if (line.open) return;
  const oracle::Shapes& s = f.shapes;
  const int64_t T = c["micro_batch"].get<int64_t>() * c["seq_len"].get<int64_t>();
  const bool llama = s.family == oracle::Family::kLlama;
  const bool ddp = strategy == "ddp" || strategy == "ddp-zero";
  if (ddp) {  // in the total under buckets on both sides
    line.named.push_back({"the Reducer's fp32 buckets (MemTracker's activations, emu's buckets)", -4 * f.psi, false});
  }
  if (moment != Moment::kBeforeGradients) {
    // With checkpointing the peak is elsewhere: Llama DDP's at the optimizer step (every fp32 gradient and foreach
    // AdamW's temporaries beside the buckets and the moments), Llama FSDP2 fp32's in the first block's backward, in
    // the MLP product's backward (two [T, F] gradients beside the recomputed block's tensors), where emu's is too now
    // that it makes each parameter's gradient when backward reaches it (flat.h BlockGradients) and frees the MLP's
    // saved tensors in autograd's order (blocks.cpp llama_backward). GPT-2's, DDP's and FSDP2's alike, in the first
    // block's gelu_new backward, after its recomputation: at the product's backward (x, 0.5·x, tanh and 1 + tanh
    // saved; c_proj's input gradient and both factors' gradients, 7 [T, F] tensors) or, as much, at pow's
    // (blocks.cpp gelu_new_backward).
    line.named.push_back(
        {"the loss, a 0-d fp32 tensor the recording's train_step holds through backward and step()", -4});
    if (moment == Moment::kBlockBackward && ddp && f.mixed && !llama) {
      // At the product's backward under CUDA's autocast (pow in fp32, autocast_mode.h): x's fp32 cast for pow, tanh,
      // 1 + tanh, c_proj's input gradient cast back to fp32 and both factors' fp32 gradients (4 B each), 0.5·x and
      // its gradient's bf16 cast (2 B each): 28 B per [T, F] element. The CPU's autocast, recorded here, runs all of
      // gelu_new in bf16: 7 tensors of 2 B, 14 B.
      line.named.push_back(
          {"gelu_new's backward under CUDA's autocast, its tanh branch in fp32 (28 B per [T, F] element at the "
           "product's backward, the CPU's autocast, recorded here, 14 B)",
           (28 - 14) * T * s.ffn});
    }
    if (moment == Moment::kRootReduceScatter) {
      // FSDP2's root group reduces in the backward's final callback, outside every module. Its fp32 reduce-scatter
      // output, the root's sharded gradient, is FSDPMemTracker's Temp there and emu's gradients (made whole when
      // backward began); gloo's _reduce_scatter_base copies its input (a CPU-only temporary: NCCL works from its
      // own buffers, which emu charges as its collective staging, named in the total).
      const auto root = static_cast<int64_t>(
          oracle::round_up(oracle::unit_counts(s).at(0), static_cast<uint64_t>(f.n)) / static_cast<uint64_t>(f.n));
      line.named.push_back(
          {"the root's fp32 reduce-scatter output (its sharded gradient): FSDPMemTracker's Temp, emu's gradients",
           -4 * root, false});
      line.named.push_back({"gloo's copy of the root's fp32 reduce-scatter input (CPU only)", -4 * root * f.n});
      line.named.push_back(
          {"a second 0-d fp32 tensor of the loss the recording holds (FSDP2: 8 B of activations)", -4});
    }
    if (moment == Moment::kOptimizerStep && strategy == "fsdp") {
      // FSDP1 sets each FlatParameter's sharded gradient past MemTracker's gradient hook (_post_backward_hook's
      // reduce-scatter output), so at the step MemTracker files the fp32 sharded gradients (each unit's flat space
      // padded to N) as Temp and emu as gradients.
      int64_t sharded = 0;
      for (const uint64_t unit : oracle::unit_counts(s)) {
        sharded +=
            static_cast<int64_t>(oracle::round_up(unit, static_cast<uint64_t>(f.n)) / static_cast<uint64_t>(f.n));
      }
      line.named.push_back(
          {"the FlatParameters' fp32 sharded gradients, set past MemTracker's gradient hook: its Temp, emu's "
           "gradients",
           -4 * sharded, false});
    }
    if (moment == Moment::kBlockBackward && strategy == "fsdp") {
      // FSDP1 without use_orig_params: the block's parameters are views of its FlatParameter, and the views'
      // gradients made so far (the final norm's; the block's first, the MLP's c_proj weight and bias, GPT-2's gelu_new
      // backward coming next) are autograd's tensors until the block's split backward concatenates them.
      const uint64_t root = oracle::round_up(oracle::unit_counts(s).at(0), static_cast<uint64_t>(f.n));
      const auto head = static_cast<int64_t>(root - oracle::late_root_gradients(s));
      const int64_t down = s.h * s.ffn + (llama ? 0 : s.h);
      line.named.push_back(
          {"the views' gradients made by the peak (the final norm's, the block's c_proj's), which MemTracker files "
           "as Temp until the FlatParameter's .grad is formed and emu as gradients",
           -f.emu_bytes * (head + down), false});
    }
    if (moment == Moment::kBlockBackward && strategy == "fsdp2") {
      const uint64_t root = oracle::unit_counts(s).at(0);
      const auto head = static_cast<int64_t>(root - oracle::late_root_gradients(s));
      // The block's first gradients made: down_proj's (GPT-2: the MLP's c_proj weight and bias).
      const int64_t down = s.h * s.ffn + (llama ? 0 : s.h);
      line.named.push_back(
          {"the unsharded gradients made by the peak (an untied head's, the final norm's, the first block's "
           "down_proj's), "
           "which FSDPMemTracker files as Temp until the block's post-backward and emu as gradients",
           -f.emu_bytes * (head + down), false});
    }
    return;
  }
  if (ddp && f.mixed && !llama) {
    // gelu_new's pow: fp32 under CUDA's autocast (ATen autocast_mode.h, AT_FORALL_FP32), which emu follows; bf16
    // under the CPU's, where the recording ran.
    line.named.push_back(
        {"gelu_new under CUDA's autocast keeps c_fc's output, tanh and 1 + tanh in fp32 (the CPU's "
         "autocast, recorded here, in bf16): 6 B per [T, F] element per block",
         6 * T * s.ffn * s.layers});
  }
}

// What emu's collectives stage at its peak: on a GPU NCCL's own buffers, outside the framework's allocator.
Named staging_at_peak(const json& emu) {
  return {
      "emu's collective staging in use at its peak (NCCL's own buffers on a GPU, outside the framework's "
      "allocator)",
      emu["peak"]["at_peak_by_category"]["comm_buffers"].get<int64_t>()};
}

// Whether the recorded rank's total peaked inside a block: a transformer block's module peak (MemTracker's, over
// forward and backward) equals the total's.
bool peaked_in_block(const json& rank) {
  if (!rank.contains("module_peaks")) return false;
  for (const auto& [module, bytes] : rank["module_peaks"].items()) {
    const bool block = module.find(".h.") != std::string::npos || module.find(".layers.") != std::string::npos;
    if (block && bytes.get<int64_t>() == rank["peak_bytes"].get<int64_t>()) return true;
  }
  return false;
}

// Whether the recorded rank's total peaked outside every module's forward and backward (MemTracker's module peaks
// all below it): in the optimizer step.
bool peaked_outside_modules(const json& rank) {
  if (!rank.contains("module_peaks") || rank["module_peaks"].empty()) return false;
  int64_t most = 0;
  for (const auto& [module, bytes] : rank["module_peaks"].items()) most = std::max(most, bytes.get<int64_t>());
  return most < rank["peak_bytes"].get<int64_t>();
}

std::vector<Line> compare(const json& c, const json& emu, const std::string& strategy) {
  CaseFacts f;
  f.shapes = shapes_of(c["model_config"]);
  f.psi = static_cast<int64_t>(oracle::parameter_count(f.shapes));
  f.tensors = static_cast<int64_t>(oracle::registration_order(f.shapes).size());
  f.n = c["ranks"];
  f.mixed = c["recipe"] == "mixed";
  f.emu_bytes = f.mixed ? 2 : 4;
  const json* top = &highest_peak(c["per_rank"]);
  f.recorded_rank = (*top)["rank"];
  f.emu_rank = emu["peak"]["rank"];
  const auto peaks = (*top)["category_peaks"].get<RecordedCategories>();
  const RecordedCategories at_peak =
      top->contains("at_peak") ? (*top)["at_peak"].get<RecordedCategories>() : RecordedCategories();
  // FSDP1's breakdown shows no gradient in the step either (its sharded gradients are Temp there): a peak outside
  // every module's forward and backward says it.
  const bool outside_modules = peaked_outside_modules(*top);
  Moment moment = recorded_moment(at_peak, strategy == "fsdp" && peaked_in_block(*top));
  if (strategy == "fsdp" && outside_modules) moment = Moment::kOptimizerStep;
  if (strategy == "fsdp2" && outside_modules && at_peak.contains("Reduce Scatter") &&
      at_peak.at("Reduce Scatter") > 0) {
    moment = Moment::kRootReduceScatter;
  }
  f.peaked_in_step = moment == Moment::kOptimizerStep;

  std::vector<Line> lines = category_lines(
      {"parameters", "gradients", "optimizer_state", "buckets", "buffers"}, peaks, emu,
      [&](const std::string& category, Line& line) {
        if (strategy == "ddp" || strategy == "ddp-zero") name_ddp(category, f, line, strategy == "ddp-zero");
        if (strategy == "fsdp") name_fsdp1(category, f, line);
        if (strategy == "fsdp2") name_fsdp2(category, f, line);
      },
      at_peak.empty() ? nullptr : &at_peak);
  name_work_at_peak(c, f, strategy, moment, lines.back());
  Line total;
  total.category = "total";
  total.framework = (*top)["peak_bytes"];
  total.measured = emu["peak"]["bytes"];
  // Checked where the act+temp line at the peaks is (the recording has its breakdown at the peak).
  total.open = lines.back().open;
  // The model states' named differences carry over to the total (their peaks coincide at the optimizer step), and
  // those of the activations and temporaries at the peaks; the buckets' are replaced by what emu's buckets hold at
  // its peak, below.
  carry_into_total(lines, total, [](const Line& line) {
    return line.category != "buckets" && (!line.open || line.category == "act+temp@peak");
  });
  total.named.push_back(staging_at_peak(emu));
  if (moment == Moment::kRootReduceScatter) {
    // Without the tracker every unsharded gradient is freed by the copy-in, before the reduce-scatter (checked with
    // weak references to them); with it, the group's last (the head's) is still referenced from a closure.
    total.named.push_back(
        {"the root's last unsharded gradient (the head's), which FSDPMemTracker's instrumentation keeps past the "
         "copy-in",
         -f.emu_bytes * static_cast<int64_t>(oracle::registration_order(f.shapes).back())});
  }
  if (strategy == "ddp-zero" && !f.peaked_in_step) {
    total.named.push_back(
        {"ZeroRedundancyOptimizer's AdamW moments of emu's rank, not yet known to MemTracker at the "
         "recorded peak in forward",
         8 * zero_redundancy_partition(f, f.emu_rank).first});
  }
  lines.push_back(std::move(total));
  return lines;
}

std::string percent(int64_t got, int64_t want) {
  if (want == 0) return got == 0 ? "0.0%" : "n/a";
  return fmt::format("{:+.1f}%", 100.0 * static_cast<double>(got - want) / static_cast<double>(want));
}

// Checks one case's lines and prints them; returns the table row for the README.
std::string check_case(const json& c, const std::vector<Line>& lines, const std::string& strategy) {
  const std::string name = c["case"];
  for (const Line& line : lines) {
    const int64_t want = line.framework + sum_named(line);
    const bool measured_ok = line.open ? line.measured <= static_cast<int64_t>(static_cast<double>(want) * 1.03)
                                       : within(line.measured, want);
    const bool predicted_ok =
        line.predicted < 0 || line.open || within(line.predicted, want + line.predicted_rank_offset);
    fmt::print("{} {} {:<15} framework {:>9} named {:>+9} emu {:>9} ({}) predicted {:>9} {}\n", name, strategy,
               line.category, line.framework, sum_named(line), line.measured, percent(line.measured, want),
               line.predicted, line.open ? "OPEN" : (measured_ok && predicted_ok ? "ok" : "DIFFERS"));
    for (const Named& n : line.named) {
      if (n.bytes != 0) fmt::print("    {:>+9}  {}\n", n.bytes, n.reason);
    }
    if (line.predicted_rank_offset != 0) {
      fmt::print("    {:>+9}  predicted only: rank 0's whole tensors, as emu's predictor speaks for rank 0\n",
                 line.predicted_rank_offset);
    }
    if (line.unchecked) continue;
    if (line.open) {
      EXPECT_TRUE(measured_ok) << name << " " << line.category << ": emu " << line.measured
                               << " exceeds the framework's " << line.framework << " + named " << sum_named(line)
                               << " (emu's known gap here is below the framework)";
    } else {
      EXPECT_TRUE(measured_ok) << name << " " << line.category << ": emu measured " << line.measured << ", framework "
                               << line.framework << " + named " << sum_named(line) << " = " << want;
      EXPECT_TRUE(predicted_ok) << name << " " << line.category << ": emu predicted " << line.predicted
                                << ", framework " << line.framework << " + named " << sum_named(line) << " = " << want;
    }
  }
  const Line& total = lines.back();
  if (total.category == "total" && !total.open && !total.unchecked) {
    const int64_t want = total.framework + sum_named(total);
    EXPECT_LE(std::abs(static_cast<double>(total.measured - want)), kTotalTolerance * static_cast<double>(want))
        << name << " total: emu measured " << total.measured << ", framework " << total.framework << " + named "
        << sum_named(total) << " = " << want << " (more than " << 100 * kTotalTolerance << "% apart)";
  }
  int64_t predicted_total = 0;
  for (const Line& line : lines) {
    if (line.category != "total" && line.category != "act+temp" && line.predicted > 0) {
      predicted_total += line.predicted;
    }
  }
  return fmt::format("| {} | {} | {} | {} | {} |", name, total.framework, total.measured, predicted_total,
                     percent(total.measured, total.framework));
}

void compare_model(const std::string& model) {
  const std::vector<json> cases = load_pytorch_cases(model);
  ASSERT_FALSE(cases.empty()) << "no fixtures for " << model << " under " << kData << "/pytorch";
  std::map<std::string, std::set<std::string>> runs;
  std::map<std::string, const json*> first;
  for (const json& c : cases) {
    ASSERT_TRUE(c.contains("per_rank")) << c["case"] << ": " << c.value("error", "no per_rank");
    for (const char* key : {"versions", "command", "date", "model_config", "ranks", "recipe"}) {
      EXPECT_TRUE(c.contains(key)) << c["case"] << " lacks " << key;
    }
    const std::string strategy = emu_strategy(c["framework"]);
    if (strategy.empty()) continue;
    runs[run_key(c)].insert(strategy);
    first.emplace(run_key(c), &c);
  }
  testing::TempDir dir("oracle");
  std::map<std::string, json> emu;
  for (const auto& [key, strategies] : runs) emu[key] = run_emu(*first.at(key), strategies, dir.file(key + ".json"));

  std::vector<std::string> rows;
  for (const json& c : cases) {
    const std::string strategy = emu_strategy(c["framework"]);
    if (strategy.empty()) {
      int64_t peak = 0;
      for (const json& r : c["per_rank"]) peak = std::max(peak, r["peak_bytes"].get<int64_t>());
      fmt::print("{}: no emu strategy yet ({} is PyTorch fully_shard): PyTorch peak {} bytes\n",
                 c["case"].get<std::string>(), c["framework"].get<std::string>(), peak);
      rows.push_back(fmt::format("| {} | {} | no emu strategy yet | | |", c["case"].get<std::string>(), peak));
      continue;
    }
    const json* s = strategy_in(emu.at(run_key(c)), strategy);
    ASSERT_NE(s, nullptr) << c["case"] << ": emu did not run " << strategy;
    rows.push_back(check_case(c, compare(c, *s, strategy), strategy));
  }
  fmt::print("\n| case | framework peak | emu measured | emu predicted | difference |\n|---|---:|---:|---:|---:|\n");
  for (const std::string& row : rows) fmt::print("{}\n", row);
}

oracle::Shapes preset_shapes(const std::string& name, const json& full) {
  oracle::Shapes s;
  s.family = full["style"] == "gpt2" ? oracle::Family::kGpt2 : oracle::Family::kLlama;
  s.h = full["hidden"];
  s.ffn = full["ffn"];
  s.vocab = full["vocab"];
  s.positions = full["seq_len"];
  s.layers = full["layers"];
  s.heads = full["heads"];
  s.kv_heads = full["kv_heads"];
  s.tied_head = s.family == oracle::Family::kGpt2;
  EXPECT_EQ(oracle::parameter_count(s), full["parameters"].get<uint64_t>()) << name;
  return s;
}

// DeepSpeed's estimator (estimate_zero2/zero3_model_states_mem_needs) against emu's --plan model states
// (parameters + gradients + master + optimizer + buckets), per GPU, no offload. The estimator's assumptions:
// ZeRO-2 2Ψ + 18Ψ/N, ZeRO-3 4·largest layer + 18Ψ/N, where 18 = 2 (bf16 gradients) + 4 (an fp32 copy of the
// gradient partition, made at step()) + 4 (fp32 master) + 8 (Adam); no reduce bucket, no unit being gathered or
// reduced; its 1.5 buffer factor applies to the CPU figure only. emu's extra terms come from the independent
// estimator (tests/oracle/) at DeepSpeed's default knobs.
// `rank`: the rank whose figures the plan reports (ranks differ in ZeRO-2's grads_in_partition).
std::vector<Named> estimator_differences(const oracle::Shapes& s, int stage, int64_t gpus, int64_t largest_layer,
                                         int rank) {
  oracle::Knobs knobs;
  knobs.strategy = stage == 2 ? "zero2" : "zero3";
  knobs.world = static_cast<int>(gpus);
  knobs.rank = rank;
  const auto n = static_cast<uint64_t>(gpus);
  const oracle::Estimate e = oracle::estimate(s, knobs);
  const auto psi = static_cast<int64_t>(oracle::parameter_count(s));
  const auto shard = static_cast<int64_t>(stage == 2 ? oracle::round_up(static_cast<uint64_t>(psi), 2 * n) / n : 0);
  std::vector<Named> named;
  if (stage == 2) {
    named.push_back(
        {"emu's ipg reduce bucket (reduce_bucket_size elements, two with overlap_comm), which the "
         "estimator leaves out",
         static_cast<int64_t>(e.buckets)});
    named.push_back(
        {"gradients beyond the estimator's 6 B per partition element (bf16 + its fp32 copy): the units "
         "being made before their reduce, and step()'s flattened copy beside the fp32 one, on the rank whose "
         "grads_in_partition (the whole tensors meeting its partition) holds the most",
         static_cast<int64_t>(e.gradients) - 6 * shard});
    named.push_back({"partitions padded to 2N, the estimator's Ψ/N unpadded", 18 * shard - 18 * psi / gpus});
  } else {
    named.push_back({"emu's ipg reduce bucket (reduce_bucket_size elements), which the estimator leaves out",
                     static_cast<int64_t>(e.buckets)});
    named.push_back(
        {"the estimator's fp32 copy of the whole gradient partition, where DeepSpeed's step() makes one sub-group's "
         "(sub_group_size elements) at a time (in the gradients line below)",
         -4 * psi / gpus});
    uint64_t partitions = 0;
    for (uint64_t u : oracle::unit_counts(s)) partitions += oracle::round_up(u, n) / n;
    const auto p3 = static_cast<int64_t>(partitions);
    named.push_back({"the bf16 parameter partition, which the estimator's 18 B/param leaves out at stage 3", 2 * p3});
    named.push_back({"units gathered at the peak, where the estimator counts 4 B x its largest layer",
                     static_cast<int64_t>(e.parameters) - 2 * p3 - 4 * largest_layer});
    named.push_back(
        {"gradients beyond the partitions: the units being made before their reduce-scatter, or step()'s "
         "flat and fp32 copies of the largest sub-group, whichever peaks",
         static_cast<int64_t>(e.gradients) - 2 * p3});
    named.push_back({"each unit padded to N, the estimator's Ψ/N unpadded", 14 * p3 - 14 * psi / gpus});
  }
  return named;
}

// The rank whose figures a plan's JSON reports under "peak": its role's accounted rank.
int reported_rank(const json& strategy) {
  const int first = strategy["peak"]["rank"];
  for (const json& role : strategy["plan_roles"]) {
    if (role["first_rank"] == first) return role["accounted_rank"];
  }
  ADD_FAILURE() << "no plan role starts at rank " << first;
  return first;
}

TEST(DeepSpeedEstimator, ZeroModelStatesAgainstPlan) {
  const json fixture = read_json(kData + "/deepspeed_estimators.json");
  ASSERT_TRUE(fixture.contains("versions") && fixture.contains("rows"));
  testing::TempDir dir("ds-estimator");
  std::map<std::pair<std::string, int64_t>, json> plans;
  for (const json& row : fixture["rows"]) {
    const std::string model = row[0];
    const int64_t gpus = row[1];
    const int stage = row[2];
    if (row[3].get<bool>() || row[4].get<bool>()) continue;  // offload rows: recorded, not compared yet
    if (gpus != 2 && gpus != 8 && gpus != 64) continue;      // the test's time: three counts of the six
    auto& plan = plans[{model, gpus}];
    if (plan.is_null()) {
      const std::string out = dir.file(fmt::format("{}-{}.json", model, gpus));
      const auto run = run_process(kEmu + fmt::format(" --plan {} --model {} --strategies zero2,zero3 --reserve 0"
                                                      " --json {}",
                                                      gpus, model, out));
      ASSERT_EQ(run.exit_code, 0) << run.err;
      plan = read_json(out);
    }
    const oracle::Shapes shapes = preset_shapes(model, plan["model"]["full_scale"]);
    const int64_t largest = fixture["models"][model]["largest_layer_parameters"];
    const json* s = strategy_in(plan, stage == 2 ? "zero2" : "zero3");
    ASSERT_NE(s, nullptr);
    int64_t measured = 0, predicted = 0;
    for (const char* category : {"parameters", "gradients", "master_weights", "optimizer_state", "buckets"}) {
      measured +=
          static_cast<int64_t>(s->at("peak").at("category_peaks").at(category).get<double>() * planted_scale(category));
      predicted += s->at("predicted").at("by_category").at(category).get<int64_t>();
    }
    Line line;
    line.category = fmt::format("{} zero{} on {}", model, stage, gpus);
    line.framework = row[5];
    line.measured = measured;
    line.predicted = predicted;
    line.named = estimator_differences(shapes, stage, gpus, largest, reported_rank(*s));
    const int64_t want = line.framework + sum_named(line);
    fmt::print("{:<26} DeepSpeed {:>14} named {:>+14} emu plan {:>14} ({}) predicted {:>14}\n", line.category,
               line.framework, sum_named(line), measured, percent(measured, want), predicted);
    EXPECT_TRUE(within(measured, want)) << line.category << ": emu " << measured << ", DeepSpeed " << line.framework
                                        << " + named " << sum_named(line) << " = " << want;
    // emu's predictor from the shapes alone equals its own plan to the byte (at full scale, many blocks: the
    // prefetch window that small test models never fill).
    EXPECT_EQ(predicted, measured) << line.category;
  }
}

// What MemTracker sees of DeepSpeed ZeRO-3 and what it does not, against emu's zero3, per category, from the shapes.
// MemTracker follows tensors made while it tracks, the module's parameters and .grad, and the inner AdamW's states;
// DeepSpeed's flat buffers made at deepspeed.initialize() back none of those (the bit16 partitions, the gradient
// partitions, the inner AdamW's own fp32 parameter, the master), so they are named with their bytes. The ipg bucket
// is seen only through the .grad views DeepSpeed points into it, so MemTracker files it under gradients.
struct DeepSpeedFacts {
  int64_t partitions = 0;         // Σ_u P_u/N: this rank's partition elements (each unit padded to N)
  int64_t bucket = 0;             // reduce_bucket_size elements
  int64_t largest_tensor = 0;     // the largest parameter tensor, elements
  int64_t sub_groups = 1;         // the fp32 flat partitions the inner AdamW steps over (one per sub-group)
  int64_t largest_sub_group = 0;  // partition elements of the largest
  // A V·h table (the head, the embedding) DeepSpeed holds gathered while MemTracker files it as an activation: 0,
  // or V·h when the tables are not persistent (stage3_param_persistence_threshold below V·h) and nothing is
  // prefetched (stage3_prefetch_bucket_size 0). The head is then gathered for its forward and kept to its backward
  // (none of the trace between its two uses; any reuse distance above 0), the loss runs between, and the most
  // gathered at once is one table beside the persistent norms. The all-gather makes the table's data inside the
  // forward, not as a module parameter, so MemTracker counts it with the activations; emu with the parameters.
  int64_t gathered_table = 0;
  // Elements DeepSpeed holds gathered at the loss with a prefetch bucket that MemTracker files as activations (emu:
  // parameters). MemTracker's pre-forward hook of a module (its first call; global hooks run before DeepSpeed's own)
  // files as parameters the storages its parameters, its submodules' included, point at then: a tensor whose copy a
  // prefetch's wait made before its module, or one around it, began is a parameter; one whose copy its own fetch
  // made, and every coalesced flat buffer, are activations. Counted by hand for the tiny Llama with
  // stage3_param_persistence_threshold 100, stage3_prefetch_bucket_size 40,000 and stage3_max_reuse_distance
  // 40,000 (the recording's knobs; 2 blocks, h 64, kv 32, ffn 176, V 512; the queue as the coordinator
  // logged it, scripts/oracle/deepspeed_zero3_trace.py): the prefetches are {embed, q0, k0, v0} (at the root's
  // fetch), {o0, gate0, up0, down0, q1} (the model's), {k1, v1, o1, gate1, up1, down1} (the embedding's), and
  // {embed, head} (the rotary embedding's: the embedding's backward use; its copy made at the head's fetch). At the
  // loss every tensor is gathered; activations are the head and the embedding (V·h each), their flat buffer
  // (2·V·h, alive until the embedding's backward fetch), o0 (h·h: its prefetch waited at its own fetch) and k1
  // (kv·h, likewise). 0 for other knobs, where the parameters and activations lines stay as they are.
  int64_t prefetched_as_activations = 0;
};

DeepSpeedFacts deepspeed_facts(const oracle::Shapes& s, int64_t n, const json& zero) {
  DeepSpeedFacts f;
  const int64_t table = s.vocab * s.h;
  if (zero.value("stage3_param_persistence_threshold", int64_t{100'000}) < table &&
      zero.value("stage3_prefetch_bucket_size", int64_t{50'000'000}) == 0 &&
      zero.value("stage3_max_reuse_distance", int64_t{1'000'000'000}) > 0) {
    f.gathered_table = table;
  }
  if (s.family == oracle::Family::kLlama && s.layers == 2 &&
      zero.value("stage3_param_persistence_threshold", int64_t{100'000}) == 100 &&
      zero.value("stage3_prefetch_bucket_size", int64_t{50'000'000}) == 40'000 &&
      zero.value("stage3_max_reuse_distance", int64_t{1'000'000'000}) == 40'000) {
    const int64_t kv = s.kv_heads * (s.h / s.heads);
    f.prefetched_as_activations = 2 * table + 2 * table + s.h * s.h + kv * s.h;
  }
  const std::vector<uint64_t> units = oracle::unit_counts(s);
  const int64_t sub_group_size = zero.value("sub_group_size", int64_t{1'000'000'000});
  for (const uint64_t unit : units) {
    f.partitions += static_cast<int64_t>(oracle::round_up(unit, static_cast<uint64_t>(n)) / static_cast<uint64_t>(n));
  }
  f.bucket = zero.value("reduce_bucket_size", int64_t{500'000'000});
  const std::vector<uint64_t> tensors = oracle::registration_order(s);
  f.largest_tensor = static_cast<int64_t>(*std::max_element(tensors.begin(), tensors.end()));
  // stage3.py _create_fp16_sub_groups: tensors in order, a sub-group closed once it holds sub_group_size elements.
  // Each tensor partitioned on its own (⌈t/N⌉), in the module's order: the embeddings, the blocks, then the final
  // norm and the head (Hugging Face's parameter order).
  const std::vector<uint64_t> order = oracle::registration_order(s);
  f.sub_groups = 0;
  int64_t held = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    held += static_cast<int64_t>(oracle::round_up(order[i], static_cast<uint64_t>(n)) / static_cast<uint64_t>(n));
    if (held >= sub_group_size || i + 1 == order.size()) {
      ++f.sub_groups;
      f.largest_sub_group = std::max(f.largest_sub_group, held);
      held = 0;
    }
  }
  return f;
}

void name_deepspeed_zero3(const std::string& category, const DeepSpeedFacts& f, Line& line) {
  if (category == "parameters" && f.gathered_table > 0) {
    line.named.push_back(
        {"one V·h table gathered (the head through the loss, the embedding for its backward), which "
         "MemTracker files under activations",
         2 * f.gathered_table, false});
  }
  if (category == "parameters" && f.prefetched_as_activations > 0) {
    line.named.push_back(
        {"tensors gathered at the loss whose copies their own fetch made (the head, the embedding, o_proj of block "
         "0, k_proj of block 1) and the flat buffer of the head's and embedding's coalesced prefetch, which "
         "MemTracker files under activations",
         2 * f.prefetched_as_activations, false});
  }
  if (category == "parameters") {
    line.named.push_back(
        {"the bit16 partitions (stage3.py's flat lp_param_buffer): unseen by MemTracker", 2 * f.partitions});
    line.named.push_back(
        {"the fp32 master partition (the inner AdamW's own parameter): unseen by MemTracker", 4 * f.partitions});
  }
  if (category == "gradients") {
    line.named.push_back(
        {"the bit16 gradient partitions (stage3.py's grad_partitions_flat_buffer): unseen by MemTracker",
         2 * f.partitions});
    line.named.push_back(
        {"the ipg bucket, which MemTracker files under gradients (the .grad views into it) and emu "
         "under buckets",
         -2 * f.bucket, false});
    // emu's gradient peak beyond the partitions is the more of backward's and step()'s; DeepSpeed's, as MemTracker
    // files it, one .grad being copied into the bucket (step()'s copies go under temporaries and optimizer state).
    line.named.push_back(
        {"emu's transient gradients, the more of the largest .grad (as DeepSpeed's) and step()'s flat and "
         "fp32 copies of the largest sub-group, beyond DeepSpeed's largest .grad",
         std::max(2 * f.largest_tensor, 6 * f.largest_sub_group) - 2 * f.largest_tensor, false});
  }
  if (category == "optimizer_state") {
    // MemTracker files what the inner AdamW's step makes as optimizer state: foreach's exp_avg_sq.sqrt() of one
    // sub-group's flat partition at a time, which emu makes too (the config's torch_adam, run_emu_deepspeed).
    line.named.push_back({"AdamW's step counters, one fp32 tensor per sub-group's flat partition", -4 * f.sub_groups});
  }
  if (category == "buckets") {
    line.named.push_back({"the ipg bucket (reduce_bucket_size elements, bf16), filed by MemTracker under gradients",
                          2 * f.bucket, false});
  }
}

// emu's zero<stage> from the fixture's DeepSpeed config (the stage, bf16, its zero_optimization keys, no clipping:
// the script sets none, and DeepSpeed's default is 0) for `steps` steps, with `flags` added to the command line. The
// script hands deepspeed.initialize a torch.optim.AdamW(foreach=True): in a config that is torch_adam, torch's AdamW
// stepping DeepSpeed's partitions, with --adamw foreach, emu's default.
json run_emu_deepspeed(const json& fixture, const testing::TempDir& dir, int stage, int steps = 1,
                       const std::string& flags = "") {
  json config = {{"train_micro_batch_size_per_gpu", fixture["micro_batch"]},
                 {"gradient_accumulation_steps", fixture.value("gradient_accumulation_steps", 1)},
                 {"bf16", {{"enabled", fixture["precision"] == "bf16"}}},
                 {"zero_optimization", fixture.value("zero_optimization", json::object())},
                 {"optimizer", {{"type", "AdamW"}, {"params", {{"torch_adam", true}}}}}};
  if (fixture.contains("data_types")) config["data_types"] = fixture["data_types"];
  config["zero_optimization"]["stage"] = stage;
  EXPECT_NE(fixture.value("optimizer", "").find("torch.optim.AdamW(lr=1e-3, foreach=True)"), std::string::npos)
      << fixture["file"] << ": recorded with another optimizer than the one emu is run with";
  const std::string config_path = dir.file(fmt::format("{}.{}.ds.json", fixture["file"].get<std::string>(), stage));
  {
    std::ofstream out(config_path);
    out << config.dump();
  }
  const std::string out = dir.file(fmt::format("{}.{}.emu.json", fixture["file"].get<std::string>(), stage));
  const std::string command =
      mpiexec(fixture["ranks"]) + kEmu +
      fmt::format(
          " --model {}/{}-tiny.json --shrink 1 --seq-len {} --reserve 0 --steps {} --clip 0 --deepspeed {}"
          " --json {} {}",
          kData, fixture["model"].get<std::string>(), fixture["seq_len"].get<int>(), steps, config_path, out, flags);
  const auto run = run_process(command, 120);
  EXPECT_EQ(run.exit_code, 0) << command << "\n" << run.err;
  if (run.exit_code != 0) return json();
  const json root = read_json(out);
  const json* s = strategy_in(root, fmt::format("zero{}", stage));
  return s != nullptr ? *s : json();
}

// A DeepSpeed recording's facts: the module cast to bf16 (its parameters, .grad and math), as in every recording.
CaseFacts deepspeed_case(const json& fixture) {
  CaseFacts f;
  f.shapes = shapes_of(fixture["model_config"]);
  f.psi = static_cast<int64_t>(oracle::parameter_count(f.shapes));
  f.tensors = static_cast<int64_t>(oracle::registration_order(f.shapes).size());
  f.n = fixture["ranks"];
  f.mixed = true;
  f.emu_bytes = 2;
  return f;
}

// emu's bytes sent per step by collective kind (its JSON's traffic_per_step, every group).
std::map<std::string, int64_t> emu_sent(const json& emu) {
  std::map<std::string, int64_t> sent;
  for (const json& entry : emu["traffic_per_step"]) {
    sent[entry["collective"].get<std::string>()] += entry["sent_bytes"].get<int64_t>();
  }
  return sent;
}

// DeepSpeed's collective calls over the tracked step (deepspeed_run.py's "collectives"), summed by kind: each call's
// payload, the tensor a rank sends from (all_reduce's and broadcast's one tensor; reduce_scatter_fn's and
// all_gather_into_tensor's input, the second). All-reduces of at most 8 bytes (a norm, a flag) are summed apart, as
// kScalarAllReduce.
constexpr const char* kScalarAllReduce = "all_reduce of a scalar";
std::map<std::string, int64_t> deepspeed_payloads(const json& rank) {
  std::map<std::string, int64_t> payload;
  for (const json& call : rank["collectives"]) {
    const std::string kind = call["kind"];
    const auto bytes = call["bytes"].get<std::vector<int64_t>>();
    const bool input_second = kind == "reduce_scatter_fn" || kind == "all_gather_into_tensor";
    const int64_t sent = bytes.at(input_second ? 1 : 0);
    payload[kind == "all_reduce" && sent <= 8 ? kScalarAllReduce : kind] += sent;
  }
  return payload;
}

// DeepSpeed's collectives against emu's ledger, as ring volumes of the same payloads. ZeRO-1 and ZeRO-2: the
// gradients all-reduced (average_tensor, at its defaults, all-reduces each bucket's slices, one per owner, together:
// allreduce_and_scatter), every gradient once a micro-batch (stage 1: the sum of them once) at bf16, 2Ψ bytes; the
// norm's all-reduce (4 B); the updated partitions all-gathered (all_gather_into_tensor's input, P/N elements a rank);
// and a 1-byte all-reduce that emu does not make (step()'s overflow flag), named; with use_multi_rank_bucket_allreduce
// false the gradients are reduced to their owners instead (dist.reduce, 2Ψ bytes of payload). ZeRO-3: the gradients
// reduce-scattered (reduce_scatter_fn's inputs, 2Ψ bytes), the gathered tensors all-gathered (all_gather_into_tensor's
// inputs, the ranks' partitions of them), the norm all-reduced (DeepSpeed's 8 B, emu's 4), and broadcasts of a few
// hundred bytes emu does not make, named. Stage 0: the engine's all-reduce of the flat bf16 gradients (2Ψ), and
// nothing else on either side (unclipped, neither all-reduces a norm).
void check_collectives(const json& fixture, const json& rank, const json& emu, const CaseFacts& c, int stage) {
  if (!rank.contains("collectives")) return;  // recorded before deepspeed_run.py logged them
  const std::map<std::string, int64_t> ds = deepspeed_payloads(rank);
  const std::map<std::string, int64_t> sent = emu_sent(emu);
  const int64_t n = c.n;
  const auto at = [](const std::map<std::string, int64_t>& m, const std::string& key) {
    const auto it = m.find(key);
    return it == m.end() ? int64_t{0} : it->second;
  };
  if (stage == 3) {
    EXPECT_EQ(at(ds, "reduce_scatter_fn"), 2 * c.psi) << fixture["file"] << ": DeepSpeed's gradient reduce-scatters";
    EXPECT_EQ(at(sent, "reduce_scatter"), (n - 1) * at(ds, "reduce_scatter_fn") / n) << fixture["file"];
    EXPECT_EQ(at(sent, "all_gather"), (n - 1) * at(ds, "all_gather_into_tensor")) << fixture["file"];
    EXPECT_EQ(at(ds, "all_reduce"), 0) << fixture["file"];
    EXPECT_EQ(at(ds, kScalarAllReduce), 8) << fixture["file"] << ": DeepSpeed's norm all-reduce";
    EXPECT_EQ(at(sent, "all_reduce"), 2 * (n - 1) * 4 / n) << fixture["file"] << ": emu's norm, 4 B";
    EXPECT_LT(at(ds, "broadcast"), 2000) << fixture["file"]
                                         << ": DeepSpeed's small broadcasts, which emu does not make";
  } else if (stage == 0) {
    EXPECT_EQ(at(ds, "all_reduce"), 2 * c.psi) << fixture["file"] << ": the engine's gradient all-reduce";
    EXPECT_EQ(at(ds, kScalarAllReduce), 0) << fixture["file"];
    EXPECT_EQ(at(sent, "all_reduce"), 2 * (n - 1) * at(ds, "all_reduce") / n) << fixture["file"];
  } else {
    // Stage 2 reduces every micro-batch, stage 1 once a step.
    const int64_t passes = stage == 2 ? fixture.value("gradient_accumulation_steps", 1) : 1;
    // use_multi_rank_bucket_allreduce false: each owner's slices reduced to it (dist.reduce) instead.
    // (contiguous_gradients false all-reduces every bucket whole: buffered_reduce_fallback.)
    const json zero = fixture.value("zero_optimization", json::object());
    const bool by_owner =
        !zero.value("use_multi_rank_bucket_allreduce", true) && zero.value("contiguous_gradients", true);
    const std::string reduction = by_owner ? "reduce" : "all_reduce";
    EXPECT_EQ(at(ds, reduction), 2 * c.psi * passes) << fixture["file"] << ": DeepSpeed's gradient " << reduction;
    EXPECT_EQ(at(ds, by_owner ? "all_reduce" : "reduce"), 0) << fixture["file"];
    EXPECT_EQ(at(ds, kScalarAllReduce), 4 + 1) << fixture["file"] << ": the norm's 4 B and the overflow flag's 1 B";
    EXPECT_EQ(sent.count("reduce_scatter"), 0u)
        << fixture["file"] << ": emu reduce-scatters where DeepSpeed all-reduces";
    const int64_t overflow_flag = 1;  // DeepSpeed's, not emu's
    EXPECT_EQ(at(sent, "all_reduce"),
              2 * (n - 1) * (at(ds, "all_reduce") + at(ds, kScalarAllReduce) - overflow_flag) / n)
        << fixture["file"];
    // A reduce's root sends nothing, every other rank its whole payload: emu's JSON holds rank 0's traffic, so it
    // sent every slice that another rank owns.
    int64_t to_others = 0;
    for (const json& call : rank["collectives"]) {
      if (call["kind"] == "reduce" && call["root"] != 0) to_others += call["bytes"][0].get<int64_t>();
    }
    EXPECT_EQ(at(sent, "reduce"), to_others) << fixture["file"] << ": rank 0's gradient reduces";
    EXPECT_EQ(at(sent, "all_gather"), (n - 1) * at(ds, "all_gather_into_tensor")) << fixture["file"];
    EXPECT_EQ(at(ds, "reduce_scatter_fn") + at(ds, "broadcast"), 0)
        << fixture["file"] << ": DeepSpeed called collectives emu's zero1 and zero2 do not";
  }
  for (const auto& [kind, bytes] : ds) {
    const bool known = kind == "all_reduce" || kind == kScalarAllReduce || kind == "reduce_scatter_fn" ||
                       kind == "all_gather_into_tensor" || kind == "broadcast" || kind == "reduce";
    EXPECT_TRUE(known) << fixture["file"] << ": DeepSpeed called " << kind << " (" << bytes << " B)";
  }
}

// A DeepSpeed recording's total against emu's: every named difference of `lines` that counts in a total, and emu's
// collective staging at its peak.
Line deepspeed_total(const std::vector<Line>& lines, const json& rank, const json& emu) {
  Line total;
  total.category = "total";
  total.framework = rank["peak_bytes"];
  total.measured = emu["peak"]["bytes"];
  carry_into_total(lines, total, [](const Line&) { return true; });
  total.named.push_back(staging_at_peak(emu));
  return total;
}

std::vector<Line> compare_deepspeed(const json& fixture, const json& rank, const json& emu) {
  const CaseFacts c = deepspeed_case(fixture);
  const oracle::Shapes& shapes = c.shapes;
  const DeepSpeedFacts f =
      deepspeed_facts(shapes, fixture["ranks"], fixture.value("zero_optimization", json::object()));
  check_collectives(fixture, rank, emu, c, 3);
  const bool breakdown = rank.contains("at_peak");
  const RecordedCategories at_peak = breakdown ? rank["at_peak"].get<RecordedCategories>() : RecordedCategories{};
  std::vector<Line> lines = category_lines(
      {"parameters", "gradients", "optimizer_state", "buckets", "buffers"},
      rank["category_peaks"].get<RecordedCategories>(), emu,
      [&](const std::string& category, Line& line) {
        name_deepspeed_zero3(category, f, line);
        if (category == "buffers")
          line.named.push_back({"RoPE inv_freq buffers (emu keeps none)", -rope_buffers(c, 4)});
      },
      breakdown ? &at_peak : nullptr);
  const Moment moment = !breakdown             ? Moment::kBeforeGradients
                        : peaked_in_step(rank) ? Moment::kOptimizerStep
                                               : recorded_moment(at_peak, false);
  name_work_at_peak(fixture, c, "zero3", moment, lines.back());
  if (f.gathered_table > 0) {
    lines.back().named.push_back({"the head gathered through the loss, MemTracker's activation, emu's parameters",
                                  -2 * f.gathered_table, false});
  }
  if (f.prefetched_as_activations > 0) {
    lines.back().named.push_back(
        {"gathered tensors and the coalesced flat buffer at the loss, MemTracker's activations, emu's parameters",
         -2 * f.prefetched_as_activations, false});
  }
  // MemTracker sees the ipg bucket only while a .grad points into it. A bucket larger than all else (DeepSpeed's
  // default, 500,000,000 elements) puts MemTracker's peak where it is seen, in a block's backward, while emu's (and
  // the device's: the bucket is alive all run) is at the loss's backward: the work at the two peaks is of two
  // moments, printed, not checked. The total holds either way.
  if (moment != Moment::kBeforeGradients) lines.back().unchecked = true;
  // The total: DeepSpeed's peak as MemTracker saw it plus the buffers it does not see, all alive all run. Without
  // the breakdown at the peak (an older recording) it stays open.
  Line total = deepspeed_total(lines, rank, emu);
  total.open = !breakdown;
  total.named.push_back({"the ipg bucket, seen by MemTracker only while a .grad points into it",
                         2 * f.bucket - (breakdown ? at_peak.at("Gradient") : 0)});
  lines.push_back(std::move(total));
  return lines;
}

// The table of a DeepSpeedRun test's cases, one row each from check_case.
void print_deepspeed_rows(const std::vector<std::string>& rows) {
  fmt::print("\n| case | DeepSpeed peak | emu measured | emu predicted | difference |\n|---|---:|---:|---:|---:|\n");
  for (const std::string& row : rows) fmt::print("{}\n", row);
}

// One recorded stage of `fixture` (`key`, as deepspeed_run.py names it: zero<stage>-<precision>) against emu's
// zero<stage> run as the recording ran: SDPA attention, no checkpointing, two steps (MemTracker tracked the second).
// The rank with the highest peak is compared, by compare(rank, emu); DeepSpeed must have run `optimizer_class`, the
// wrapper whose recipe emu's strategy follows, and the recording must hold its breakdown at the peak. The case's
// table row is appended to `rows`.
template <typename Compare>
void compare_recorded_stage(const json& fixture, const std::string& key, int stage, const std::string& optimizer_class,
                            const testing::TempDir& dir, Compare compare, std::vector<std::string>& rows) {
  const json& ranks = fixture["stages"][key];
  for (const json& r : ranks) ASSERT_FALSE(r.contains("error")) << fixture["file"] << ": " << r["error"];
  const json& top = highest_peak(ranks);
  ASSERT_EQ(top.value("optimizer_class", ""), optimizer_class) << fixture["file"];
  ASSERT_TRUE(top.contains("at_peak")) << fixture["file"];
  // A recording that peaked in step() is compared with emu on MPI's own collectives: the staging emu's ring
  // algorithms charge (NCCL's own buffers on a GPU; gloo keeps its outside MemTracker) would put emu's zero1 peak at
  // its first reduction (131,072 B of staging on this model) instead of at step().
  const std::string collectives =
      peaked_in_step(top) ? " --collectives all_reduce=mpi,reduce_scatter=mpi,all_gather=mpi" : "";
  const json emu = run_emu_deepspeed(fixture, dir, stage, 2, "--no-checkpoint --attention sdpa" + collectives);
  ASSERT_FALSE(emu.is_null()) << fixture["file"];
  json named_case = {{"case", fixture["file"].get<std::string>()}};
  rows.push_back(check_case(named_case, compare(top, emu), fmt::format("zero{}", stage)));
}

// DeepSpeed ZeRO-3 as it ran (its own code on CPU), by category, against emu's zero3 measured and predicted, run as
// the recording ran: SDPA attention, no checkpointing, two steps (MemTracker tracked the second).
TEST(DeepSpeedRun, Zero3AgainstEmu) {
  const std::vector<json> fixtures = load_fixtures("deepspeed");
  ASSERT_FALSE(fixtures.empty());
  testing::TempDir dir("ds-run");
  std::vector<std::string> rows;
  int compared = 0;
  for (const json& fixture : fixtures) {
    for (const char* key : {"versions", "command", "model_config", "ranks", "stages"}) {
      ASSERT_TRUE(fixture.contains(key)) << fixture["file"] << " lacks " << key;
    }
    const std::string stage = fmt::format("zero3-{}", fixture["precision"].get<std::string>());
    if (!fixture["stages"].contains(stage)) continue;
    // Recorded before the script kept the breakdown at the peak: its categories are compared, not its total.
    const json& ranks = fixture["stages"][stage];
    for (const json& r : ranks) ASSERT_FALSE(r.contains("error")) << fixture["file"] << ": " << r["error"];
    const json* top = &highest_peak(ranks);
    const json emu = run_emu_deepspeed(fixture, dir, 3, 2, "--no-checkpoint --attention sdpa");
    ASSERT_FALSE(emu.is_null()) << fixture["file"];
    std::vector<Line> lines = compare_deepspeed(fixture, *top, emu);
    json named_case = {{"case", fixture["file"].get<std::string>()}};
    rows.push_back(check_case(named_case, lines, "zero3"));
    ++compared;
  }
  EXPECT_GT(compared, 0) << "no ZeRO-3 run among the DeepSpeed fixtures";
  print_deepspeed_rows(rows);
}

// What MemTracker sees of DeepSpeed without ZeRO (stage 0, bf16, the script's torch AdamW, which
// engine.py _configure_fp16_optimizer wraps in FP16_UnfusedOptimizer) against emu's zero0, per category, from the
// shapes. MemTracker sees the module's bf16 parameters and .grad and the inner AdamW's states (and what its foreach
// step makes, as optimizer state); anything else made while it tracks it files by where it is made: outside a
// backward and outside the inner AdamW's step, as an activation.
void name_deepspeed_zero0(const std::string& category, const CaseFacts& f, Line& line) {
  if (category == "parameters") {
    line.named.push_back(
        {"FP16_UnfusedOptimizer's fp32 copy of every tensor (fp32_groups, the inner AdamW's parameters), made at "
         "deepspeed.initialize(): unseen by MemTracker",
         4 * f.psi});
  }
  if (category == "gradients") {
    line.named.push_back(
        {"the fp32 .grad of every fp32 copy, cast from the bf16 .grad by FP16_UnfusedOptimizer.step before the inner "
         "AdamW's step: MemTracker's activations, emu's gradients",
         4 * f.psi, false});
  }
  if (category == "optimizer_state") {
    line.named.push_back({"AdamW's step counters: one fp32 tensor per parameter tensor", -4 * f.tensors});
  }
  if (category == "buckets") {
    // One bucket here: Ψ is far below the 500,000,000 elements allreduce_no_retain fills before it reduces.
    line.named.push_back(
        {"engine.py allreduce_bucket's flat bf16 copy of the gradients, made after autograd's backward: MemTracker's "
         "activations, emu's buckets",
         2 * f.psi, false});
  }
  if (category == "buffers") line.named.push_back({"RoPE inv_freq buffers (emu keeps none)", -rope_buffers(f, 4)});
}

std::vector<Line> compare_deepspeed_zero0(const json& fixture, const json& rank, const json& emu) {
  const CaseFacts f = deepspeed_case(fixture);
  check_collectives(fixture, rank, emu, f, 0);
  const auto peaks = rank["category_peaks"].get<RecordedCategories>();
  const auto at_peak = rank["at_peak"].get<RecordedCategories>();
  std::vector<Line> lines = category_lines(
      {"parameters", "gradients", "optimizer_state", "buckets", "buffers"}, peaks, emu,
      [&](const std::string& category, Line& line) { name_deepspeed_zero0(category, f, line); }, &at_peak);
  const Moment moment = recorded_moment(at_peak, false);
  name_work_at_peak(fixture, f, "zero0", moment, lines.back());
  if (moment == Moment::kOptimizerStep) {  // the -s8 recording: 8 tokens put the peak in FP16_UnfusedOptimizer.step
    lines.back().named.push_back(
        {"the fp32 .grad of every fp32 copy, cast from the bf16 .grad by FP16_UnfusedOptimizer.step: MemTracker's "
         "activations, emu's gradients",
         -4 * f.psi, false});
  }
  lines.push_back(deepspeed_total(lines, rank, emu));
  return lines;
}

// DeepSpeed without ZeRO as it ran (stage 0, its own engine on CPU), by category and in total, against emu's zero0
// measured and predicted, run as the recording ran: SDPA attention, no checkpointing, two steps (MemTracker tracked
// the second, so what the first step leaves behind counts).
TEST(DeepSpeedRun, Zero0AgainstEmu) {
  testing::TempDir dir("ds-run0");
  std::vector<std::string> rows;
  for (const json& fixture : load_fixtures("deepspeed")) {
    const std::string key = fmt::format("zero0-{}", fixture["precision"].get<std::string>());
    if (!fixture["stages"].contains(key)) continue;
    ASSERT_NO_FATAL_FAILURE(compare_recorded_stage(
        fixture, key, 0, "FP16_UnfusedOptimizer", dir,
        [&](const json& top, const json& emu) { return compare_deepspeed_zero0(fixture, top, emu); }, rows));
  }
  ASSERT_FALSE(rows.empty()) << "no stage-0 run among the DeepSpeed fixtures";
  print_deepspeed_rows(rows);
}

// What MemTracker sees of DeepSpeed ZeRO-1 and ZeRO-2 (runtime/zero/stage_1_and_2.py DeepSpeedZeroOptimizer, bf16,
// the script's torch AdamW over one flat fp32 partition; contiguous_gradients on, DeepSpeed's default) and what it
// does not, against emu's zero1/zero2. The parameters are views into the flat bf16 group (bit16_groups_flat, padded
// to 2N elements: nccl_start_alignment_factor 2), which MemTracker counts once through them, as emu does. MemTracker
// follows the inner AdamW's state only, not its parameter (the fp32 master partition, single_partition_of_fp32_groups)
// nor that parameter's .grad.
struct Zero12Facts {
  int stage = 1;
  int64_t shard = 0;           // S = P/N, P = Ψ rounded up to 2N: the elements this rank updates
  int64_t bucket = 0;          // R, reduce_bucket_size elements
  int64_t buckets = 1;         // setup_buckets: buf_0, and buf_1 with overlap_comm (default false below stage 3)
  int64_t largest_tensor = 0;  // elements of the largest parameter tensor: the LM head (V·h) here
  int64_t partition = 0;       // grads_in_partition's elements: the whole tensors meeting the rank's S
  // Stage 2 accumulating in fp32 under bf16 (data_types.grad_accum_dtype "fp32"): a compact fp32 partition of S
  // elements in place of grads_in_partition, read by step() as it is.
  bool compact = false;
  // The gradient hooks reduce in backward: stage 2; stage 1 with overlap_comm at the accumulation boundary
  // (process_gradients). `tensorwise`: each .grad copied into the bucket as autograd makes it (stage 2; stage 1 so
  // when the boundary is the only micro-batch, with no .grad accumulated before it).
  bool hooks_reduce = false;
  bool tensorwise = false;
  int accumulation = 1;
  bool head_in_partition = false;  // the LM head, the last tensor in registration order, meets the rank's S elements
  // contiguous_gradients false (stage 1): no ipg bucket buffer and no grads_in_partition; every .grad kept to step(),
  // and `flattened` bytes: the largest bucket of several .grads, flattened for its all-reduce (allreduce_bucket), as
  // recorded (the largest all-reduce of a tensor of its own).
  bool contiguous = true;
  int64_t flattened = 0;
};

Zero12Facts zero12_facts(const CaseFacts& c, int stage, const json& zero, int64_t rank) {
  Zero12Facts f;
  f.stage = stage;
  const auto n = static_cast<uint64_t>(c.n);
  f.shard = static_cast<int64_t>(oracle::round_up(static_cast<uint64_t>(c.psi), 2 * n) / n);
  f.partition = static_cast<int64_t>(oracle::grads_in_partition(c.shapes, n, static_cast<uint64_t>(rank)));
  const DeepSpeedFacts d = deepspeed_facts(c.shapes, c.n, zero);
  f.bucket = d.bucket;
  f.largest_tensor = d.largest_tensor;
  // config.py overlap_comm_valid: unset means stage == 3.
  f.buckets = zero.value("overlap_comm", false) ? 2 : 1;
  f.hooks_reduce = stage == 2 || f.buckets == 2;
  const int64_t psi = c.psi;
  f.head_in_partition = (rank + 1) * f.shard > psi - f.largest_tensor;
  f.contiguous = zero.value("contiguous_gradients", true);
  return f;
}

bool accumulates_in_fp32(const json& fixture) {
  return fixture.value("data_types", json::object()).value("grad_accum_dtype", "") == "fp32";
}

void name_deepspeed_zero12(const std::string& category, const Zero12Facts& f, const CaseFacts& c, Line& line) {
  const int64_t S = f.shard;
  const int64_t bucket_bytes = 2 * f.bucket * f.buckets;
  if (category == "parameters") {
    line.named.push_back(
        {"the fp32 master partition (single_partition_of_fp32_groups, the inner AdamW's own parameter): unseen by "
         "MemTracker",
         4 * S});
  }
  // step(): flatten(averaged_gradients) (2S, bf16) and its .to(fp32) (4S, set as the fp32 partition's .grad) beside
  // averaged_gradients, views of grads_in_partition (copy_grads_in_partition: 2 B for each element of the whole
  // tensors meeting the partition). None is a module parameter's .grad then (independent_gradient_partition_epilogue
  // cleared them), so MemTracker files all three as activations or temporaries; emu files them under gradients,
  // where its peak is the more of backward's and this.
  const int64_t at_step = 6 * S + 2 * f.partition;
  if (category == "gradients" && f.stage == 1 && f.hooks_reduce && f.accumulation > 1) {
    // The boundary's backward starts with every .grad accumulated; the head's backward makes a new .grad that
    // AccumulateGrad adds into the accumulated one before the hook copies it into the bucket.
    line.named.push_back(
        {"autograd's new .grad of the LM head beside its accumulated one, until AccumulateGrad adds it in: "
         "MemTracker's gradients, emu accumulates in place",
         -2 * f.largest_tensor, false});
  }
  if (category == "gradients" && f.stage == 1 && !f.tensorwise) {
    // Stage 1 without overlap_comm reduces nothing in backward (process_gradients: neither partition_gradients nor
    // overlap_comm), so MemTracker's gradient peak is every autograd .grad (2Ψ) at its end, before reduce_gradients
    // points each into the bucket or grads_in_partition; with overlap_comm and accumulation, every .grad at the
    // start of the boundary's backward.
    line.named.push_back(
        {"step()'s grads_in_partition, the flattened copy of its S elements and its fp32 cast (MemTracker's "
         "activations, emu's gradients), beyond MemTracker's peak of every autograd .grad",
         std::max(2 * c.psi, at_step) - 2 * c.psi, false});
  }
  if (category == "gradients" && f.stage == 1 && f.tensorwise && !f.head_in_partition) {
    // Stage 1 copies into grads_in_partition only the partition's tensors: the head, larger than the bucket and
    // reduced from its own .grad (extra_large_param_to_reduce), keeps that .grad to step() on a rank whose partition
    // it does not meet, where the embeddings' is made beside it at the end of backward. Not modelled by emu, which
    // frees it once reduced (its totals here peak elsewhere).
    line.named.push_back(
        {"the LM head's .grad, reduced from its own storage and kept to step() on a rank whose "
         "partition it does not meet, beside the embeddings' (MemTracker's gradients): not modelled "
         "by emu",
         -2 * f.largest_tensor, false});
  }
  if (category == "gradients" && f.tensorwise) {
    // Stage 2: each hook copies its .grad into the bucket and points .grad into it
    // (reduce_independent_p_g_buckets_and_remove_grads); a tensor over R (the head) is reduced from its own .grad
    // (extra_large_param_to_reduce). MemTracker's gradient peak: the bucket storages, filed through those views, beside
    // the largest autograd .grad.
    line.named.push_back(
        {"the ipg bucket(s), which MemTracker files under gradients (the .grad views into them) and emu under buckets",
         -bucket_bytes, false});
  }
  if (category == "gradients" && f.compact) {
    // _build_compact_grad_partition_buffer: S fp32 elements, no tensor's .grad (MemTracker's temporaries), from the
    // first reduction that reaches it, beside the largest .grad; step() reads it as it is.
    line.named.push_back(
        {"the compact fp32 gradient partition (S elements): MemTracker's temporaries, emu's gradients", 4 * S, false});
  }
  if (category == "gradients" && f.tensorwise && !f.compact) {
    line.named.push_back(
        {"emu's gradient peak, the more of step()'s grads_in_partition with its flattened and fp32 copies "
         "(MemTracker's activations) and grads_in_partition beside the largest .grad in backward, beyond DeepSpeed's "
         "largest .grad",
         std::max(at_step, 2 * f.partition + 2 * f.largest_tensor) - 2 * f.largest_tensor, false});
  }
  if (category == "optimizer_state") {
    line.named.push_back({"AdamW's step counter, one fp32 tensor for the one flat fp32 partition", -4});
  }
  if (category == "buckets" && !f.contiguous) {
    line.named.push_back(
        {"the largest bucket of several .grads, flattened by allreduce_bucket for its all-reduce (the "
         "recording's largest all-reduce of a tensor of its own): MemTracker's temporaries; no ipg "
         "bucket buffer",
         f.flattened, false});
  } else if (category == "buckets") {
    line.named.push_back(
        {!f.tensorwise ? "the ipg bucket (reduce_bucket_size bf16 elements), made by setup_buckets in a gradient hook: "
                         "MemTracker's temporaries (no .grad points into it before reduce_gradients, after backward)"
                       : "the ipg bucket(s) (reduce_bucket_size bf16 elements each), filed by MemTracker under "
                         "gradients",
         bucket_bytes, false});
  }
  if (category == "buffers") line.named.push_back({"RoPE inv_freq buffers (emu keeps none)", -rope_buffers(c, 4)});
}

std::vector<Line> compare_deepspeed_zero12(const json& fixture, int stage, const json& rank, const json& emu) {
  const CaseFacts c = deepspeed_case(fixture);
  Zero12Facts f =
      zero12_facts(c, stage, fixture.value("zero_optimization", json::object()), rank["rank"].get<int64_t>());
  f.compact = stage == 2 && accumulates_in_fp32(fixture);
  f.accumulation = fixture.value("gradient_accumulation_steps", 1);
  f.tensorwise = stage == 2 || (f.hooks_reduce && f.accumulation == 1 && f.contiguous);
  for (const json& call : rank.value("collectives", json::array())) {
    const int64_t bytes = call["bytes"].empty() ? 0 : call["bytes"][0].get<int64_t>();
    if (call["kind"] == "all_reduce" && call.value("own_storage", false) && bytes > 8) {
      f.flattened = std::max(f.flattened, bytes);
    }
  }
  check_collectives(fixture, rank, emu, c, stage);
  const auto at_peak = rank["at_peak"].get<RecordedCategories>();
  std::vector<Line> lines = category_lines(
      {"parameters", "gradients", "optimizer_state", "buckets", "buffers"},
      rank["category_peaks"].get<RecordedCategories>(), emu,
      [&](const std::string& category, Line& line) { name_deepspeed_zero12(category, f, c, line); }, &at_peak);
  // The recordings peak at the loss's backward (a bucket small beside the model's states, made only at the first
  // gradient hook, leaves DeepSpeed's peak where its work peaks), or, with activations below the model's states (the
  // -s8 ones: 8 tokens), in step() (peaked_in_step).
  // Stage 1 accumulating holds the earlier micro-batches' .grads there too (MemTracker's gradients at the peak).
  const bool accumulated = stage == 1 && f.accumulation > 1;
  const Moment moment = peaked_in_step(rank) ? Moment::kOptimizerStep
                        : accumulated        ? Moment::kBeforeGradients
                                             : recorded_moment(at_peak, false);
  EXPECT_NE(moment, Moment::kBlockBackward) << fixture["file"] << ": the recorded peak is in a block's backward";
  name_work_at_peak(fixture, c, fmt::format("zero{}", stage), moment, lines.back());
  if (moment == Moment::kOptimizerStep) {
    lines.back().named.push_back(
        {"step()'s gradient norm (scaled_global_grad_norm) and _global_grad_norm, two 0-d fp32 tensors", -8});
  }
  if (moment == Moment::kOptimizerStep && f.compact) {
    // step() hands the compact fp32 partition to the inner AdamW as it is, and peaks in its step.
    lines.back().named.push_back(
        {"the compact fp32 gradient partition: MemTracker's temporaries, emu's gradients", -4 * f.shard, false});
  } else if (moment == Moment::kOptimizerStep && !f.contiguous) {
    // Without contiguous_gradients the partition's own .grads stand for grads_in_partition: MemTracker's gradients
    // at the peak, as emu's; the flattened partition (2S) and its fp32 cast (4S) are MemTracker's activations.
    lines.back().named.push_back(
        {"step()'s flattened partition and its fp32 cast: MemTracker's activations, emu's gradients", -6 * f.shard,
         false});
  } else if (moment == Moment::kOptimizerStep) {
    // step() peaks as it casts: flatten(averaged_gradients) (2S) and its .to(fp32) (4S) beside averaged_gradients,
    // views of grads_in_partition (2 B for each element of the whole tensors meeting the partition), which it frees
    // (free_grad_in_param_list, averaged_gradients = None) before the inner AdamW steps. MemTracker files them
    // outside any module: as activations, stage 2's grads_in_partition (made by a gradient hook) as a temporary.
    lines.back().named.push_back(
        {"step()'s grads_in_partition, its flattened copy and fp32 cast: MemTracker's activations and temporaries, "
         "emu's gradients",
         -(6 * f.shard + 2 * f.partition), false});
  }
  // Both make the root's .grad and the ipg bucket(s) only once the loss's backward is over (the first gradient
  // hook, process_gradients -> setup_buckets), so neither is at the peak.
  const int accumulation = fixture.value("gradient_accumulation_steps", 1);
  if (stage == 1 && f.hooks_reduce && accumulation > 1) {
    // With overlap_comm the first micro-batch's gradient hooks make the ipg buckets (setup_buckets), released only
    // by the boundary's reduction: alive at the later micro-batch's loss backward.
    lines.back().named.push_back(
        {"the ipg buckets, made by the first micro-batch's gradient hooks and kept to the "
         "boundary's reduction: MemTracker's temporaries, emu's buckets",
         -2 * f.bucket * f.buckets, false});
  }
  if (stage == 2 && accumulation > 1 && f.compact) {
    // The compact fp32 partition, made by the first micro-batch's first reduction reaching it, is the one sum.
    lines.back().named.push_back(
        {"the compact fp32 gradient partition, alive from the first micro-batch through the later ones: MemTracker's "
         "temporaries, emu's gradients",
         -4 * f.shard, false});
  } else if (stage == 2 && accumulation > 1) {
    // copy_grads_in_partition makes grads_in_partition at a backward's first reduction, sized for the whole tensors
    // that meet the partition; over accumulated micro-batches the first one's stays (all_grad_tensors holds views
    // of it, a later backward makes its own and adds it in), so at the recorded peak, a later micro-batch's loss
    // backward, it is alive: MemTracker's temporaries, emu's partition (gradients), kept until step() as there.
    lines.back().named.push_back(
        {"the first micro-batch's grads_in_partition (the whole tensors meeting the partition), alive through the "
         "later ones (views in all_grad_tensors): MemTracker's temporaries, emu's gradients",
         -2 * f.partition, false});
  }
  lines.push_back(deepspeed_total(lines, rank, emu));
  return lines;
}

// DeepSpeed ZeRO-1 and ZeRO-2 as they ran (stage_1_and_2.py on CPU), by category and in total, against emu's zero1 and
// zero2 measured and predicted, run as the recordings ran: SDPA attention, no checkpointing, two steps (MemTracker
// tracked the second). A recording at DeepSpeed's default reduce_bucket_size (500,000,000 elements, a 1 GB bucket
// beside this model's 158,016 parameters) hides every other term: it is kept, not compared here.
TEST(DeepSpeedRun, Zero12AgainstEmu) {
  testing::TempDir dir("ds-run12");
  std::vector<std::string> rows;
  std::set<int> compared;
  for (const json& fixture : load_fixtures("deepspeed")) {
    if (!fixture.value("zero_optimization", json::object()).contains("reduce_bucket_size")) continue;
    for (const int stage : {1, 2}) {
      const std::string key = fmt::format("zero{}-{}", stage, fixture["precision"].get<std::string>());
      if (!fixture["stages"].contains(key)) continue;
      ASSERT_NO_FATAL_FAILURE(compare_recorded_stage(
          fixture, key, stage, "DeepSpeedZeroOptimizer", dir,
          [&](const json& top, const json& emu) { return compare_deepspeed_zero12(fixture, stage, top, emu); }, rows));
      compared.insert(stage);
    }
  }
  EXPECT_EQ(compared, (std::set<int>{1, 2})) << "no ZeRO-1 or no ZeRO-2 run with a set reduce_bucket_size";
  print_deepspeed_rows(rows);
}

// What MemTracker sees of DeepSpeed's BF16_Optimizer (runtime/bf16_optimizer.py: bf16 with data_types.grad_accum_dtype
// "fp32" at stage 1, the script's torch AdamW over one flat fp32 partition) and what it does not, against emu's zero1
// run from the same config, per category, from the shapes. The parameters are views into the flat bf16 group (padded
// to 2N); the fp32 gradients (fp32_groups_gradients_flat, zeros_like the flat group at fp32) and the fp32 master
// partition are made at deepspeed.initialize(), before MemTracker tracks; the autograd .grad of every parameter lives
// from backward to the engine's zero_grad after the step (a later micro-batch's backward prologue only zeroes them),
// and the backward epilogue (update_hp_grads) adds each into its fp32 slice, after which MemTracker has seen the fp32
// gradients' storage through those writes: at a later micro-batch's loss backward it files them as activations.
void name_bf16_optimizer(const std::string& category, const CaseFacts& c, int64_t padded, int64_t largest,
                         int accumulation, bool hp_grads_seen, Line& line) {
  const int64_t S = padded / c.n;
  if (category == "parameters") {
    line.named.push_back(
        {"the fp32 master partition (fp32_groups_flat_partition, the inner AdamW's own parameter): unseen by "
         "MemTracker",
         4 * S});
  }
  if (category == "gradients") {
    line.named.push_back(!hp_grads_seen
                             ? Named{"BF16_Optimizer's fp32 gradients of the whole flat group, made at "
                                     "deepspeed.initialize(): unseen by MemTracker",
                                     4 * padded}
                             : Named{"BF16_Optimizer's fp32 gradients of the whole flat group, which MemTracker files "
                                     "under activations once the first micro-batch's epilogue has written them",
                                     4 * padded, false});
    if (accumulation > 1) {
      line.named.push_back(
          {"a later micro-batch's new .grad of the largest tensor beside its accumulated .grad (AccumulateGrad; emu "
           "accumulates in place), at the head's backward, not at the peak",
           -2 * largest, false});
    }
  }
  if (category == "optimizer_state") {
    line.named.push_back({"AdamW's step counter, one fp32 tensor for the one flat fp32 partition", -4});
  }
  if (category == "buffers") line.named.push_back({"RoPE inv_freq buffers (emu keeps none)", -rope_buffers(c, 4)});
}

std::vector<Line> compare_bf16_optimizer(const json& fixture, const json& rank, const json& emu) {
  const CaseFacts c = deepspeed_case(fixture);
  const auto n = static_cast<uint64_t>(c.n);
  const auto padded = static_cast<int64_t>(oracle::round_up(static_cast<uint64_t>(c.psi), 2 * n));
  const std::vector<uint64_t> tensors = oracle::registration_order(c.shapes);
  const auto largest = static_cast<int64_t>(*std::max_element(tensors.begin(), tensors.end()));
  const int accumulation = fixture.value("gradient_accumulation_steps", 1);
  // The peak is the loss's backward, or, with 8 tokens (the -s8 recording), the engine's all-reduce of the fp32
  // gradients through their bf16 copy (2P: MemTracker's activations, emu's temporaries) after the last backward.
  const bool in_step = peaked_in_step(rank);
  // MemTracker files the fp32 gradients as activations once a backward epilogue has written them: at a later
  // micro-batch's peak and in the step.
  const bool hp_grads_seen = accumulation > 1 || in_step;
  const auto at_peak = rank["at_peak"].get<RecordedCategories>();
  std::vector<Line> lines = category_lines(
      {"parameters", "gradients", "optimizer_state", "buckets", "buffers"},
      rank["category_peaks"].get<RecordedCategories>(), emu,
      [&](const std::string& category, Line& line) {
        name_bf16_optimizer(category, c, padded, largest, accumulation, hp_grads_seen, line);
      },
      &at_peak);
  // Every parameter's .grad is at the peak in the step, and in a later micro-batch (the first micro-batch's, zeroed by
  // the backward prologue, kept), on both sides.
  EXPECT_EQ(at_peak.at("Gradient"), hp_grads_seen ? 2 * c.psi : 0) << fixture["file"];
  name_work_at_peak(fixture, c, "zero1", in_step ? Moment::kOptimizerStep : Moment::kBeforeGradients, lines.back());
  if (hp_grads_seen) {
    lines.back().named.push_back(
        {"BF16_Optimizer's fp32 gradients: MemTracker's activations from the first micro-batch's epilogue, emu's "
         "gradients",
         -4 * padded, false});
  }
  lines.push_back(deepspeed_total(lines, rank, emu));
  return lines;
}

// DeepSpeed's BF16_Optimizer as it ran (bf16, data_types.grad_accum_dtype "fp32", stage 1, on CPU), by category and in
// total, against emu's zero1 run from the same DeepSpeed config, measured and predicted, as the recordings ran: SDPA
// attention, no checkpointing, two steps (MemTracker tracked the second), one and two micro-batches per step.
TEST(DeepSpeedRun, Bf16OptimizerAgainstEmu) {
  testing::TempDir dir("ds-run-bf16");
  std::vector<std::string> rows;
  std::set<int> accumulations;
  for (const json& fixture : load_fixtures("deepspeed")) {
    if (!accumulates_in_fp32(fixture)) continue;
    if (!fixture["stages"].contains("zero1-bf16")) continue;  // stage 2's compact partition: Zero12AgainstEmu
    ASSERT_NO_FATAL_FAILURE(compare_recorded_stage(
        fixture, "zero1-bf16", 1, "BF16_Optimizer", dir,
        [&](const json& top, const json& emu) { return compare_bf16_optimizer(fixture, top, emu); }, rows));
    accumulations.insert(fixture.value("gradient_accumulation_steps", 1));
  }
  EXPECT_EQ(accumulations, (std::set<int>{1, 2})) << "no BF16_Optimizer run with one and with two micro-batches";
  print_deepspeed_rows(rows);
}

TEST(PyTorchOracle, Llama) { compare_model("llama"); }
TEST(PyTorchOracle, Gpt2) { compare_model("gpt2"); }

}  // namespace
}  // namespace emu
