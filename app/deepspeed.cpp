#include "app/deepspeed.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "emu/check.h"

namespace emu::app {
namespace {

using nlohmann::json;

// Reads the fields of one JSON object, checking types and ranges; remembers which keys were used, and notes in
// `config` the keys that set something and those left "auto".
class Fields {
 public:
  Fields(const json& object, std::string path, std::string_view source, DeepSpeedConfig& config)
      : object_(object), path_(std::move(path)), source_(source), config_(config) {
    if (!object_.is_object()) fail(path_, object_, "an object");
  }
  ~Fields() = default;

  // Notes the keys no get() asked for.
  void finish() {
    for (const auto& [key, value] : object_.items()) {
      if (std::find(used_.begin(), used_.end(), key) == used_.end()) config_.ignored.push_back(name(key));
    }
  }

  bool has(const std::string& key) const {
    return object_.contains(key) && !object_[key].is_null() && !(object_[key].is_string() && object_[key] == "auto");
  }
  const json* child(const std::string& key) {
    used_.push_back(key);
    return object_.contains(key) && object_[key].is_object() ? &object_[key] : nullptr;
  }
  void use(const std::string& key) { used_.push_back(key); }
  // Notes `key` as set by the file (its value as written) or as left "auto".
  void note(const std::string& key) {
    if (!object_.contains(key)) return;
    const json& value = object_[key];
    if (value.is_string() && value == "auto") {
      config_.left_auto.push_back(name(key));
    } else if (value.is_number_float() && std::abs(value.get<double>()) < 1e15 &&
               std::floor(value.get<double>()) == value.get<double>()) {
      config_.applied.push_back(fmt::format("{} {}", name(key), static_cast<int64_t>(value.get<double>())));  // 2e8
    } else if (!value.is_null()) {
      config_.applied.push_back(fmt::format("{} {}", name(key), value.dump()));
    }
  }

  template <typename T>
  bool get(const std::string& key, T& out, double lo, double hi) {
    used_.push_back(key);
    note(key);
    if (!has(key)) return false;
    const json& value = object_[key];
    if constexpr (std::is_same_v<T, bool>) {
      if (!value.is_boolean()) fail(name(key), value, "true or false");
      out = value.get<bool>();
    } else {
      if (!value.is_number()) fail(name(key), value, fmt::format("a number from {} to {}", lo, hi));
      const double number = value.get<double>();
      if (!(number >= lo && number <= hi) || (std::is_integral_v<T> && std::floor(number) != number)) {
        fail(name(key), value,
             fmt::format("{} from {} to {}", std::is_integral_v<T> ? "an integer" : "a number", lo, hi));
      }
      out = static_cast<T>(number);
    }
    return true;
  }
  // A field DeepSpeed accepts under two names (its pydantic models take the alias or the field's own name:
  // runtime/config_utils.py populate_by_name, runtime/zero/config.py alias="stage3_..."); the alias when both are
  // written, as pydantic validates by it first.
  template <typename T>
  bool get_either(const std::string& alias, const std::string& field, T& out, double lo, double hi) {
    if (object_.contains(alias)) {
      used_.push_back(field);
      if (object_.contains(field)) config_.ignored.push_back(name(field) + " (" + name(alias) + " is also given)");
      return get(alias, out, lo, hi);
    }
    used_.push_back(alias);
    return get(field, out, lo, hi);
  }
  bool get_string(const std::string& key, std::string& out, const std::vector<std::string>& accepted) {
    used_.push_back(key);
    note(key);
    if (!has(key)) return false;
    const json& value = object_[key];
    const std::string list = fmt::format("one of \"{}\"", fmt::join(accepted, "\", \""));
    if (!value.is_string()) fail(name(key), value, list);
    out = value.get<std::string>();
    std::string lower = out;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    for (const std::string& a : accepted) {
      std::string la = a;
      for (char& c : la) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (la == lower) {
        out = a;
        return true;
      }
    }
    fail(name(key), value, list);
    return false;
  }
  std::string name(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  [[noreturn]] void fail(const std::string& key, const json& value, const std::string& accepted) const {
    throw InputError(fmt::format("{}: \"{}\" is {}; accepted: {}", source_, key, value.dump(), accepted));
  }

 private:
  const json& object_;
  std::string path_;
  std::string_view source_;
  DeepSpeedConfig& config_;
  std::vector<std::string> used_;
};

}  // namespace

namespace {

json parse_json(std::string_view text, std::string_view source) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& error) {
    throw InputError(fmt::format("{}: not valid JSON at byte {}: {}", source, error.byte, error.what()));
  } catch (const json::exception& error) {  // out_of_range: a number such as 1e400
    throw InputError(fmt::format("{}: not valid JSON: {}", source, error.what()));
  }
}

// train_micro_batch_size_per_gpu, gradient_accumulation_steps, train_batch_size, gradient_clipping.
void read_batch_and_clipping(Fields& top, DeepSpeedConfig& config) {
  top.get("train_micro_batch_size_per_gpu", config.micro_batch, 1, 4096);
  top.get("gradient_accumulation_steps", config.accumulation, 1, 4096);
  top.get("train_batch_size", config.train_batch_size, 1, 1 << 30);
  double clip = config.knobs.clip_norm;
  if (top.get("gradient_clipping", clip, 0, 1e9)) config.knobs.clip_norm = static_cast<float>(clip);
}

// bf16 / fp16 sections: either enabled makes the recipe mixed precision; "auto" (the Hugging Face Trainer fills it
// from its own --bf16/--fp16) keeps emu's recipe, which --precision sets.
void read_precision(Fields& top, std::string_view source, DeepSpeedConfig& config) {
  bool bf16 = false, fp16 = false, any_auto = false;
  auto enabled = [&](const json& section) {
    return section.contains("enabled") && section["enabled"].is_string() && section["enabled"] == "auto";
  };
  if (const json* section = top.child("bf16")) {
    Fields f(*section, "bf16", source, config);
    f.get("enabled", bf16, 0, 1);
    any_auto = any_auto || enabled(*section);
    f.finish();
  }
  if (const json* section = top.child("fp16")) {
    Fields f(*section, "fp16", source, config);
    f.get("enabled", fp16, 0, 1);
    any_auto = any_auto || enabled(*section);
    for (const char* key : {"loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale"}) {
      f.use(key);  // loss scaling changes no memory or traffic
    }
    // auto_cast false (DeepSpeed's default, written by Axolotl's configs) leaves the inputs as they are; true casts
    // them to fp16 in the engine's forward, which emu does not model: then a warning.
    bool auto_cast = false;
    f.get("auto_cast", auto_cast, 0, 1);
    if (auto_cast) config.ignored.emplace_back("fp16.auto_cast = true (inputs cast to fp16 in forward)");
    f.finish();
  }
  // fp16 mixed precision keeps the same bytes as bf16 mixed precision: 2-byte weights and gradients, fp32 master
  // and moments. emu computes it as bf16.
  if (!bf16 && !fp16 && any_auto) {
    config.precision_auto = true;
    return;
  }
  config.knobs.recipe = optim::precision_recipe(bf16 || fp16 ? optim::Recipe::kMixed : optim::Recipe::kFp32);
  config.knobs.recipe.fp16 = fp16 && !bf16;
}

// zero_optimization.offload_optimizer: "cpu" offloads the optimizer, "none" keeps it; "nvme" is not modelled.
void read_offload_optimizer(Fields& zero, std::string_view source, DeepSpeedConfig& config) {
  const json* offload = zero.child("offload_optimizer");
  if (offload == nullptr) return;
  Fields f(*offload, "zero_optimization.offload_optimizer", source, config);
  std::string device = "none";
  f.get_string("device", device, {"none", "cpu", "nvme"});
  if (device == "nvme") {
    throw InputError(
        fmt::format("{}: \"zero_optimization.offload_optimizer.device\" is \"nvme\"; emu models "
                    "\"cpu\" and \"none\"",
                    source));
  }
  config.offload_optimizer = device == "cpu";
  f.use("pin_memory");
  f.finish();
}

// zero_optimization.offload_param: "cpu" keeps ZeRO-3's parameter partitions in host memory, "none" on the device;
// "nvme" is not modelled. The nvme knobs (buffer_count, buffer_size, max_in_cpu) change nothing for "cpu".
void read_offload_param(Fields& zero, std::string_view source, DeepSpeedConfig& config) {
  const json* offload = zero.child("offload_param");
  if (offload == nullptr) return;
  Fields f(*offload, "zero_optimization.offload_param", source, config);
  std::string device = "none";
  f.get_string("device", device, {"none", "cpu", "nvme"});
  if (device == "nvme") {
    throw InputError(fmt::format(
        "{}: \"zero_optimization.offload_param.device\" is \"nvme\"; emu models \"cpu\" and \"none\"", source));
  }
  config.knobs.zero.offload_param = device == "cpu";
  for (const char* key : {"pin_memory", "buffer_count", "buffer_size", "max_in_cpu"}) f.use(key);
  f.finish();
}

// The keys older DeepSpeed configs use, as runtime/zero/config.py maps them: cpu_offload is offload_optimizer to
// the CPU, cpu_offload_param is offload_param to the CPU, cpu_offload_use_pin_memory only pins. DeepSpeed refuses
// any other key in zero_optimization (pydantic's extra="forbid"), so the near-miss "cpu_offload_params" is refused
// here too, naming the key it maps to. fp16_master_weights_and_grads changes memory in ways emu does not model.
void read_legacy_offload(Fields& zero, std::string_view source, DeepSpeedConfig& config) {
  bool on = false;
  if (zero.get("cpu_offload", on, 0, 1) && on) config.offload_optimizer = true;
  on = false;
  if (zero.get("cpu_offload_param", on, 0, 1) && on) config.knobs.zero.offload_param = true;
  zero.use("cpu_offload_use_pin_memory");
  zero.use("cpu_offload_params");
  if (zero.has("cpu_offload_params")) {
    throw InputError(fmt::format(
        "{}: \"zero_optimization.cpu_offload_params\" is not a DeepSpeed key (DeepSpeed refuses it); the legacy key "
        "is \"cpu_offload_param\", or use \"offload_param\": {{\"device\": \"cpu\"}}",
        source));
  }
  on = false;
  if (zero.get("fp16_master_weights_and_grads", on, 0, 1) && on) {
    throw InputError(fmt::format(
        "{}: \"zero_optimization.fp16_master_weights_and_grads\" is true; emu does not model it yet, accepted: false",
        source));
  }
}

// zero_optimization: the stage (0 when the section is absent) and DeepSpeed's bucket and stage-3 knobs.
int read_zero(Fields& top, std::string_view source, DeepSpeedConfig& config) {
  int stage = 0;
  const json* section = top.child("zero_optimization");
  if (section == nullptr) return stage;
  strategy::ZeroOptions& zero = config.knobs.zero;
  Fields z(*section, "zero_optimization", source, config);
  z.get("stage", stage, 0, 3);
  double value = 0;
  // DeepSpeed refuses 0 (runtime/zero/config.py: reduce_bucket_size > 0), and so does emu.
  if (z.get("reduce_bucket_size", value, 1, 1e13)) zero.reduce_bucket_elements = static_cast<uint64_t>(value);
  if (z.get("allgather_bucket_size", value, 1, 1e13)) zero.allgather_bucket_elements = static_cast<uint64_t>(value);
  z.get("overlap_comm", zero.overlap_comm, 0, 1);
  // The stage-3 knobs under either name: "stage3_max_live_parameters" or "max_live_parameters" (Axolotl writes the
  // latter), and so on.
  if (z.get_either("stage3_prefetch_bucket_size", "prefetch_bucket_size", value, 0, 1e13)) {
    zero.prefetch_bucket_elements = static_cast<uint64_t>(value);
  }
  if (z.get_either("stage3_param_persistence_threshold", "param_persistence_threshold", value, 0, 1e13)) {
    zero.param_persistence_threshold = static_cast<uint64_t>(value);
  }
  // DeepSpeed accepts 0 for the stage-3 limits (runtime/zero/config.py: ge=0): no prefetch, nothing kept for reuse.
  if (z.get_either("stage3_max_live_parameters", "max_live_parameters", value, 0, 1e13)) {
    zero.max_live_parameters = static_cast<uint64_t>(value);
  }
  if (z.get("sub_group_size", value, 0, 1e13)) zero.sub_group_size = static_cast<uint64_t>(value);
  if (z.get_either("stage3_max_reuse_distance", "max_reuse_distance", value, 0, 1e13)) {
    zero.max_reuse_distance = static_cast<uint64_t>(value);
  }
  // contiguous_gradients false: modelled at stage 1 (ZeroOptions::contiguous_gradients); at stages 2 and 3 emu runs
  // the contiguous path and lists the key. Optimizer offload forces it on (stage_1_and_2.py: contiguous_gradients or
  // cpu_offload), checked once the offload keys are read.
  z.get("contiguous_gradients", zero.contiguous_gradients, 0, 1);
  // Stages 1 and 2 reduce each bucket by owner (average_tensor) only with reduce_scatter on, DeepSpeed's default;
  // off, they all-reduce the bucket whole (gradient_reduction_w_predivide), as the multi-rank all-reduce moves it.
  z.get("use_multi_rank_bucket_allreduce", zero.multi_rank_bucket_allreduce, 0, 1);
  bool reduce_scatter = true;
  if (z.get("reduce_scatter", reduce_scatter, 0, 1) && !reduce_scatter) zero.multi_rank_bucket_allreduce = true;
  // No effect on what emu measures; the last three concern loading checkpoints and checking for unused parameters.
  for (const char* key : {"allgather_partitions", "round_robin_gradients", "stage3_gather_16bit_weights_on_model_save",
                          "gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
                          "load_from_fp32_weights", "elastic_checkpoint", "ignore_unused_parameters"}) {
    z.use(key);
  }
  read_offload_optimizer(z, source, config);
  read_offload_param(z, source, config);
  read_legacy_offload(z, source, config);
  z.finish();
  if (stage == 0) {
    // Without ZeRO the engine all-reduces in its own fixed buckets (engine.py allreduce_gradients:
    // MEMORY_OPT_ALLREDUCE_SIZE, 500,000,000 elements) and offloads nothing (offload is ZeRO's).
    for (const char* key : {"reduce_bucket_size", "allgather_bucket_size", "overlap_comm"}) {
      if (z.has(key)) {
        config.ignored.push_back(fmt::format(
            "zero_optimization.{} (no effect at stage 0: DeepSpeed all-reduces in 500,000,000-element buckets)", key));
      }
    }
  }
  if (!zero.contiguous_gradients && (stage != 1 || config.offload_optimizer)) {
    if (stage != 1) {
      config.ignored.emplace_back(
          stage == 0 ? "zero_optimization.contiguous_gradients = false (no effect at stage 0)"
                     : fmt::format("zero_optimization.contiguous_gradients = false (emu runs the contiguous path at "
                                   "stage {})",
                                   stage));
    }
    zero.contiguous_gradients = true;  // optimizer offload forces it on at stage 1
  }
  if ((stage == 0 || stage == 3) && z.has("use_multi_rank_bucket_allreduce")) {
    config.ignored.push_back(fmt::format(
        "zero_optimization.use_multi_rank_bucket_allreduce (no effect at stage {}: only stages 1 and 2 reduce their "
        "buckets by owner)",
        stage));
  }
  if (stage != 3 && config.knobs.zero.offload_param) {
    config.ignored.emplace_back("zero_optimization.offload_param (DeepSpeed offloads parameters at stage 3 only)");
    config.knobs.zero.offload_param = false;
  }
  return stage;
}

// optimizer: AdamW or Adam, with lr, eps, weight_decay, betas, adam_w_mode and torch_adam. As DeepSpeed 0.19's
// engine.py _configure_basic_optimizer builds it: type "AdamW" is always decoupled weight decay; type "Adam" is too
// unless adam_w_mode is false, which is Adam with L2 weight decay (weight_decay·w added to the gradient; FusedAdam's
// ADAM_MODE_0, torch.optim.Adam). torch_adam true builds torch.optim.AdamW / Adam instead of DeepSpeed's FusedAdam
// (get_optimizer_configuration): its step temporaries are --adamw's (ZeroOptions::torch_adam).
void read_optimizer(Fields& top, std::string_view source, DeepSpeedConfig& config) {
  const json* section = top.child("optimizer");
  if (section == nullptr) return;
  config.has_optimizer = true;
  optim::AdamWConfig& adamw = config.knobs.adamw;
  Fields f(*section, "optimizer", source, config);
  std::string type;
  f.get_string("type", type, {"AdamW", "Adam"});
  if (const json* params = f.child("params")) {
    Fields p(*params, "optimizer.params", source, config);
    double value = 0;
    if (p.get("lr", value, 0, 10)) adamw.lr = value;
    if (p.get("eps", value, 1e-30, 1)) adamw.eps = value;
    if (p.get("weight_decay", value, 0, 10)) adamw.weight_decay = value;
    bool adam_w_mode = true;
    if (p.get("adam_w_mode", adam_w_mode, 0, 1) && !adam_w_mode) {
      if (type == "Adam") {
        adamw.decoupled = false;
      } else {
        config.ignored.emplace_back(
            "optimizer.params.adam_w_mode = false with type AdamW (DeepSpeed 0.19 runs AdamW for type AdamW; "
            "type Adam with adam_w_mode false is Adam with L2 weight decay)");
      }
    }
    p.get("torch_adam", config.knobs.zero.torch_adam, 0, 1);
    p.use("betas");
    p.note("betas");
    if (p.has("betas")) {
      const json& betas = (*params)["betas"];
      if (!betas.is_array() || betas.size() != 2 || !betas[0].is_number() || !betas[1].is_number() ||
          betas[0].get<double>() < 0 || betas[0].get<double>() >= 1 || betas[1].get<double>() < 0 ||
          betas[1].get<double>() >= 1) {
        p.fail("optimizer.params.betas", betas, "two numbers in [0, 1)");
      }
      adamw.beta1 = betas[0].get<double>();
      adamw.beta2 = betas[1].get<double>();
    }
    p.finish();
  }
  f.finish();
}

// An optimizer offload at stage 0, as DeepSpeed 0.19 treats it: never offloaded, since engine.py
// zero_use_cpu_optimizer reads offload_optimizer whatever the stage. The config's own Adam becomes DeepSpeedCPUAdam
// over parameters left on the GPU, whose step() asserts that they are on the CPU (ops/adam/cpu_adam.py); a client
// optimizer (the Trainer's, no "optimizer" section) is refused in _configure_optimizer (ZeRORuntimeException) unless
// zero_force_ds_cpu_optimizer is false. Those two fail in DeepSpeed and are refused here; torch_adam and a client
// optimizer with zero_force_ds_cpu_optimizer false train on the GPU with nothing offloaded, and the key is listed
// as ignored.
void check_stage0_offload(DeepSpeedConfig& config, bool force_cpu_optimizer, std::string_view source) {
  if (!config.offload_optimizer) return;
  config.offload_optimizer = false;
  if (config.knobs.zero.torch_adam || (!config.has_optimizer && !force_cpu_optimizer)) {
    config.ignored.emplace_back(
        "zero_optimization.offload_optimizer (at stage 0 DeepSpeed offloads nothing: the optimizer runs on the GPU)");
    return;
  }
  throw InputError(fmt::format(
      "{}: \"zero_optimization.offload_optimizer\" (or \"cpu_offload\") is \"cpu\" at stage 0; DeepSpeed offloads "
      "the optimizer only with ZeRO, and at stage 0 {}; accepted: \"stage\" 1, 2 or 3 with the offload, or "
      "stage 0 with \"device\": \"none\"",
      source,
      config.has_optimizer ? "its CPUAdam fails on the parameters left on the GPU"
                           : "it refuses the Trainer's optimizer (ZeRORuntimeException)"));
}

// scheduler: WarmupLR's warm-up steps and peak learning rate; WarmupDecayLR's the same, then a linear decay to
// warmup_min_lr at total_num_steps (DeepSpeed runtime/lr_schedules.py). WarmupDecayLR is DeepSpeed's own schedule
// even when every parameter is "auto" (the Hugging Face Accelerate templates): the Trainer fills warmup_min_lr 0,
// warmup_max_lr its learning rate, warmup_num_steps its warm-up steps and total_num_steps its max_steps, which are
// emu's --lr, no warm-up and --steps (total_steps 0 here: the run's steps, filled by the options).
void read_scheduler(Fields& top, std::string_view source, DeepSpeedConfig& config) {
  const json* section = top.child("scheduler");
  if (section == nullptr) return;
  Fields f(*section, "scheduler", source, config);
  std::string type;
  f.get_string("type", type, {"WarmupLR", "WarmupDecayLR"});
  optim::LrSchedule& schedule = config.knobs.schedule;
  if (type == "WarmupDecayLR") {
    schedule.warmup = optim::LrSchedule::Warmup::kDeepSpeedLog;
    schedule.decay = optim::LrSchedule::Decay::kDeepSpeedLinear;
    schedule.total_steps = 0;
  }
  if (const json* params = f.child("params")) {
    Fields p(*params, "scheduler.params", source, config);
    // Any of these given (not "auto"): DeepSpeed's own WarmupLR, with its defaults for the others (1000 steps, from
    // 0, log). All "auto": the Hugging Face Trainer's schedule, which is emu's (--lr, no warm-up).
    const bool deepspeed_warmup = p.has("warmup_num_steps") || p.has("warmup_min_lr") || p.has("warmup_type");
    if (deepspeed_warmup) {
      schedule.warmup = optim::LrSchedule::Warmup::kDeepSpeedLog;
      schedule.warmup_steps = 1000;
    }
    int64_t warmup = 0;
    if (p.get("warmup_num_steps", warmup, 1, 1e9)) schedule.warmup_steps = warmup;
    double value = 0;
    if (p.get("warmup_max_lr", value, 0, 10)) config.knobs.adamw.lr = value;
    if (p.get("warmup_min_lr", value, 0, 10)) schedule.warmup_min_lr = value;
    std::string warmup_type;
    if (p.get_string("warmup_type", warmup_type, {"log", "linear"}) && warmup_type == "linear") {
      schedule.warmup = optim::LrSchedule::Warmup::kDeepSpeedLinear;
    }
    if (type == "WarmupDecayLR") {
      if (!params->contains("total_num_steps")) {  // WarmupDecayLR's one required argument
        p.fail("scheduler.params.total_num_steps", nullptr, "a number of steps from 1 to 1e9, or \"auto\"");
      }
      int64_t total = 0;
      if (p.get("total_num_steps", total, 1, 1e9)) schedule.total_steps = total;
    }
    p.finish();
  }
  f.finish();
}

// data_types.grad_accum_dtype (engine.py get_data_types, _do_optimizer_sanity_check): the dtype gradients accumulate
// in, the model's (bf16, fp16 or fp32) when absent or the same. bf16 with "fp32" without optimizer offload
// (ZeroOptions::fp32_grad_accumulation): BF16_Optimizer at stage 1, the ZeRO optimizer's compact fp32 gradient
// partition at stage 2. At stage 0 any other than the model's is refused, as DeepSpeed refuses it
// (NotImplementedError: unsupported mix). The others at stages 1-3 change DeepSpeed's ZeRO optimizer (its
// gradient_accumulation_dtype) in ways emu does not model: listed as ignored.
void read_data_types(Fields& top, std::string_view source, int stage, DeepSpeedConfig& config) {
  const json* section = top.child("data_types");
  if (section == nullptr) return;
  Fields f(*section, "data_types", source, config);
  std::string given;
  const bool set = f.get_string("grad_accum_dtype", given,
                                {"fp32", "float32", "float", "torch.float32", "bf16", "bfloat16", "torch.bfloat16",
                                 "fp16", "float16", "half", "torch.float16"});
  f.finish();
  if (!set) return;
  const auto dtype_of = [](const std::string& name) -> std::string {
    if (name == "bf16" || name == "bfloat16" || name == "torch.bfloat16") return "bf16";
    if (name == "fp16" || name == "float16" || name == "half" || name == "torch.float16") return "fp16";
    return "fp32";
  };
  const optim::PrecisionRecipe& recipe = config.knobs.recipe;
  const std::string model = recipe.recipe == optim::Recipe::kFp32 ? "fp32" : recipe.fp16 ? "fp16" : "bf16";
  const std::string accumulate = dtype_of(given);
  if (accumulate == model) return;
  if (stage == 0) {
    throw InputError(
        fmt::format("{}: \"data_types.grad_accum_dtype\" is \"{}\" with {} weights at stage 0, a mix DeepSpeed refuses "
                    "(NotImplementedError: unsupported mix); accepted at stage 0: the weights' dtype, \"{}\"",
                    source, given, model, model));
  }
  // bf16 accumulating in fp32 without optimizer offload: BF16_Optimizer at stage 1, the ZeRO optimizer's compact fp32
  // gradient partition at stage 2 (stage_1_and_2.py _use_compact_grad_partition_buffer).
  if ((stage == 1 || stage == 2) && model == "bf16" && accumulate == "fp32" && !config.offload_optimizer) {
    config.knobs.zero.fp32_grad_accumulation = true;
    return;
  }
  config.ignored.push_back(fmt::format(
      "data_types.grad_accum_dtype = \"{}\" with {} weights at stage {} (DeepSpeed's ZeRO optimizer accumulating in "
      "{}; emu models \"fp32\" under bf16 at stages 1 and 2 without optimizer offload)",
      given, model, stage, accumulate));
}

}  // namespace

DeepSpeedConfig parse_deepspeed_config(std::string_view text, std::string_view source,
                                       const strategy::StrategyOptions& defaults) {
  const json root = parse_json(text, source);
  DeepSpeedConfig config;
  config.knobs = defaults;
  Fields top(root, "", source, config);
  read_batch_and_clipping(top, config);
  read_precision(top, source, config);
  const int stage = read_zero(top, source, config);
  config.strategy = fmt::format("zero{}", stage);
  read_data_types(top, source, stage, config);
  read_optimizer(top, source, config);
  bool force_cpu_optimizer = true;
  top.get("zero_force_ds_cpu_optimizer", force_cpu_optimizer, 0, 1);
  if (stage == 0) check_stage0_offload(config, force_cpu_optimizer, source);
  // Stage 0 in bf16/fp16 with the config's own optimizer: DeepSpeed builds its FusedAdam (unless torch_adam) and
  // wraps it in FP16_Optimizer's flat buffers (engine.py _configure_fp16_optimizer), not the per-tensor
  // FP16_UnfusedOptimizer that zero0 runs, as DeepSpeed does for a client optimizer (the Trainer's) or torch_adam.
  const bool low_precision = config.precision_auto || config.knobs.recipe.recipe != optim::Recipe::kFp32;
  if (stage == 0 && low_precision && config.has_optimizer && !config.knobs.zero.torch_adam) {
    config.ignored.emplace_back(
        "optimizer at stage 0 (DeepSpeed's FusedAdam in FP16_Optimizer's flat buffers; emu runs "
        "FP16_UnfusedOptimizer's per-tensor recipe)");
  }
  // In fp32 DeepSpeed steps that FusedAdam with no wrapper: one multi-tensor kernel, no step temporaries, as zero1-3
  // model it (--adamw names a client optimizer's: the Trainer's, or torch_adam's). Under FP16_Optimizer its flat fp32
  // gradient at step() stays --adamw's temporaries, the same 4 bytes per parameter as foreach's.
  if (stage == 0 && !low_precision && config.has_optimizer && !config.knobs.zero.torch_adam) {
    config.knobs.adamw_impl = optim::AdamWImpl::kFused;
  }
  read_scheduler(top, source, config);
  for (const char* key : {"steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer",
                          "prescale_gradients", "gradient_predivide_factor"}) {
    top.use(key);
  }
  top.finish();
  return config;
}

void fill_auto_total_steps(optim::LrSchedule& schedule, int steps, std::vector<std::string>& left_auto) {
  if (schedule.decay != optim::LrSchedule::Decay::kDeepSpeedLinear || schedule.total_steps != 0) return;
  schedule.total_steps = steps;
  const std::string key = "scheduler.params.total_num_steps";
  const auto it = std::find(left_auto.begin(), left_auto.end(), key);
  if (it != left_auto.end()) *it = fmt::format("{} = {} (the Hugging Face Trainer's max_steps: --steps)", key, steps);
}

void fill_auto_from_hidden(strategy::ZeroOptions& zero, bool stage3, int64_t hidden,
                           std::vector<std::string>& left_auto) {
  const auto h = static_cast<uint64_t>(hidden);
  const auto fill = [&](const std::string& key, uint64_t value, uint64_t& knob, const char* from) {
    const auto it = std::find(left_auto.begin(), left_auto.end(), key);
    if (it == left_auto.end()) return;
    knob = value;
    *it = fmt::format("{} = {} (the Hugging Face Trainer's {})", key, value, from);
  };
  fill("zero_optimization.reduce_bucket_size", h * h, zero.reduce_bucket_elements, "h²");
  if (!stage3) return;
  fill("zero_optimization.stage3_prefetch_bucket_size", static_cast<uint64_t>(0.9 * static_cast<double>(h * h)),
       zero.prefetch_bucket_elements, "0.9·h²");
  fill("zero_optimization.stage3_param_persistence_threshold", 10 * h, zero.param_persistence_threshold, "10·h");
}

void derive_batch(int train_batch_size, int ranks, int& micro_batch, int& accumulation, std::string_view source) {
  const int64_t tbs = train_batch_size;
  const auto fail = [&](const std::string& why) {
    throw InputError(fmt::format("{}: train_batch_size {} {}", source, tbs, why));
  };
  if (tbs == 0) {
    if (accumulation == 0) accumulation = 1;
    if (micro_batch == 0) micro_batch = 1;
    return;
  }
  if (micro_batch == 0 && accumulation == 0) accumulation = 1;
  if (micro_batch == 0) {
    const int64_t per_step = int64_t{accumulation} * ranks;
    if (tbs % per_step != 0) {
      fail(fmt::format("is not a multiple of gradient_accumulation_steps {} x {} ranks = {}", accumulation, ranks,
                       per_step));
    }
    micro_batch = static_cast<int>(tbs / per_step);
  } else if (accumulation == 0) {
    const int64_t per_step = int64_t{micro_batch} * ranks;
    if (tbs % per_step != 0) {
      fail(fmt::format("is not a multiple of train_micro_batch_size_per_gpu {} x {} ranks = {}", micro_batch, ranks,
                       per_step));
    }
    accumulation = static_cast<int>(tbs / per_step);
  }
  if (tbs != int64_t{micro_batch} * accumulation * ranks) {
    fail(fmt::format("is not train_micro_batch_size_per_gpu {} x gradient_accumulation_steps {} x {} ranks = {}",
                     micro_batch, accumulation, ranks, int64_t{micro_batch} * accumulation * ranks));
  }
  if (micro_batch > 4096 || accumulation > 4096) {
    fail(fmt::format("gives micro-batch {} and accumulation {}; accepted: 1 to 4096 each", micro_batch, accumulation));
  }
}

DeepSpeedConfig load_deepspeed_config(const std::filesystem::path& path, const strategy::StrategyOptions& defaults) {
  std::ifstream in(path, std::ios::binary);
  if (!in || std::filesystem::is_directory(path)) {
    throw InputError(fmt::format("--deepspeed '{}' cannot be read: no such file", path.string()));
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse_deepspeed_config(text.str(), path.string(), defaults);
}

}  // namespace emu::app
