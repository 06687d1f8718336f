#include "app/json_report.h"

#include <nlohmann/json.hpp>

#include "app/advisor.h"
#include "app/plan.h"
#include "app/report.h"
#include "app/step_time.h"
#include "workloads/model/layout.h"

namespace emu::app {
namespace {

using nlohmann::json;

json categories(const CategoryBytes& bytes, uint64_t scale) {
  json out = json::object();
  for (size_t i = 0; i < kNumCategories; ++i) out[std::string(category_name(category_at(i)))] = bytes.bytes[i] * scale;
  return out;
}

json shapes(const model::ModelConfig& m) {
  return {{"name", m.name},
          {"style", std::string(model::style_name(m.style))},
          {"hidden", m.hidden},
          {"ffn", m.ffn},
          {"vocab", m.vocab},
          {"seq_len", m.seq},
          {"layers", m.layers},
          {"heads", m.heads},
          {"kv_heads", m.kv_heads},
          {"micro_batch", m.batch},
          {"parameters", model::parameter_count(m)}};
}

// A text that may be absent: null, never "" (one rule for every optional text of the JSON).
json text_or_null(const std::string& text) { return text.empty() ? json(nullptr) : json(text); }

// One shape for traffic, measured or predicted: per collective and kind of group, per optimizer step and rank.
// `received` is null where it is not known (the analytic model states what each rank sends).
json traffic_entry(coll::CollectiveKind kind, const std::string& group, uint64_t calls, uint64_t sent,
                   const json& received, uint64_t scale) {
  return {{"collective", std::string(coll::kind_name(kind))},
          {"group", group},
          {"calls", calls},
          {"sent_bytes", sent},
          {"sent_full_scale_bytes", sent * scale},
          {"received_bytes", received},
          {"received_full_scale_bytes", received.is_null() ? json(nullptr) : json(received.get<uint64_t>() * scale)}};
}

json out_of_memory_json(const RunReport& r, const StrategyOutcome& o) {
  if (o.fits()) return nullptr;
  const uint64_t scale = r.scale();
  json ranks = json::array();
  for (size_t i = 0; i < o.verdict.ranks.size(); ++i) {
    const strategy::RankMemory& m = o.verdict.ranks[i];
    if (!m.out_of_memory) continue;
    const RankRole role = o.roles.empty() ? RankRole{m.rank, m.rank, m.rank} : o.roles[i];
    ranks.push_back({{"rank", role.first},
                     {"last_rank", role.last},
                     {"phase", text_or_null(m.phase)},
                     {"tensor", text_or_null(m.what)},
                     {"requested_bytes", m.requested},
                     {"requested_full_scale_bytes", m.requested * scale},
                     {"in_use_bytes", m.in_use},
                     {"in_use_full_scale_bytes", m.in_use * scale},
                     {"cap_bytes", m.cap},
                     {"cap_full_scale_bytes", m.cap * scale},
                     {"needed_bytes", m.peak},
                     {"needed_full_scale_bytes", m.peak * scale}});
  }
  return {{"ranks", ranks}, {"summary", oom_summary(r, o)}};
}

// A plan's roles: which ranks each planned rank speaks for, with its peaks; null for a run (whose per-rank arrays
// hold every rank).
json roles_json(const RunReport& r, const StrategyOutcome& o) {
  if (o.roles.empty()) return nullptr;
  json roles = json::array();
  for (size_t i = 0; i < o.roles.size(); ++i) {
    roles.push_back({{"first_rank", o.roles[i].first},
                     {"last_rank", o.roles[i].last},
                     {"ranks", o.roles[i].ranks()},
                     {"accounted_rank", o.roles[i].accounted},
                     {"bound", o.roles[i].bound},
                     {"peak_bytes", o.peak[i]},
                     {"reserved_peak_bytes", o.reserved_peak[i]},
                     {"verdict", o.verdict.ranks[i].out_of_memory ? "oom" : "fit"}});
  }
  return roles;
}

// --save-weights: the file, whose weights (the first strategy's) and after how many steps; null when not saved.
json saved_weights(const RunReport& r) {
  if (r.options.save_weights_path.empty() || r.plan || r.outcomes.empty()) return nullptr;
  return {{"path", r.options.save_weights_path},
          {"strategy", r.outcomes.front().name},
          {"steps", r.outcomes.front().steps_run}};
}

json per_step(const RunReport& r, const auto& values) { return r.plan ? json(nullptr) : json(values); }

json outcome_json(const RunReport& r, const StrategyOutcome& o) {
  const uint64_t scale = r.scale();
  json s;
  s["name"] = o.name;
  s["verdict"] = o.fits() ? "fit" : "oom";
  s["steps_run"] = o.steps_run;
  s["out_of_memory"] = out_of_memory_json(r, o);
  const auto p = static_cast<size_t>(o.peak_rank);
  s["peak"] = {{"rank", o.roles.empty() ? o.peak_rank : o.roles[p].first},
               {"bytes", o.peak[p]},
               {"full_scale_bytes", o.peak[p] * scale},
               {"at_peak_by_category", categories(o.at_peak[p], 1)},
               {"at_peak_by_category_full_scale", categories(o.at_peak[p], scale)},
               {"category_peaks", categories(o.category_peaks[p], 1)},
               {"category_peaks_full_scale", categories(o.category_peaks[p], scale)}};
  s["peak_bytes_per_rank"] = o.roles.empty() ? json(o.peak) : json(nullptr);
  s["plan_roles"] = roles_json(r, o);
  const auto rp = static_cast<size_t>(o.reserved_peak_rank);
  const uint64_t fragmentation = o.reserved_peak[rp] - o.allocated_at_reserved_peak[rp];
  s["reserved"] = {{"allocator", std::string(allocator_name(r.options.allocator))},
                   {"alloc_conf", text_or_null(r.options.alloc_conf.str())},
                   {"rank", o.roles.empty() ? o.reserved_peak_rank : o.roles[rp].first},
                   {"peak_bytes", o.reserved_peak[rp]},
                   {"peak_full_scale_bytes", o.reserved_peak[rp] * scale},
                   {"allocated_at_peak_bytes", o.allocated_at_reserved_peak[rp]},
                   {"allocated_at_peak_full_scale_bytes", o.allocated_at_reserved_peak[rp] * scale},
                   {"fragmentation_bytes", fragmentation},
                   {"fragmentation_full_scale_bytes", fragmentation * scale}};
  s["reserved_peak_bytes_per_rank"] = o.roles.empty() ? json(o.reserved_peak) : json(nullptr);
  json predicted_traffic = json::array();
  for (const strategy::PredictedTraffic& t : o.prediction.traffic) {
    predicted_traffic.push_back(traffic_entry(t.kind, t.group, t.calls, t.sent, nullptr, scale));
  }
  // The prediction for the rank that peaked, as "peak" is that rank's; traffic: rank 0's.
  const CategoryBytes& predicted_peak = o.predicted_peaks.empty() ? o.prediction.peak : o.predicted_peaks[p];
  const uint64_t predicted_states =
      o.predicted_states.empty() ? o.prediction.model_state_bytes() : o.predicted_states[p];
  s["predicted"] = {{"formula", text_or_null(o.prediction.formula)},
                    {"by_category", categories(predicted_peak, 1)},
                    {"by_category_full_scale", categories(predicted_peak, scale)},
                    {"model_state_bytes", predicted_states},
                    {"model_state_full_scale_bytes", predicted_states * scale},
                    {"activation_bytes", o.predicted_activations},
                    {"activation_full_scale_bytes", o.predicted_activations * scale},
                    {"traffic_per_step", predicted_traffic}};
  json measured = json::array();
  for (const auto& [key, t] : o.traffic_per_step) {
    const auto calls = o.calls_per_step.find(key);
    measured.push_back(traffic_entry(key.kind, key.group, calls == o.calls_per_step.end() ? 0 : calls->second, t.sent,
                                     t.received, scale));
  }
  s["traffic_per_step"] = measured;
  s["pcie_per_step"] = {{"device_to_host_bytes", o.host_per_step.device_to_host},
                        {"host_to_device_bytes", o.host_per_step.host_to_device},
                        {"device_to_host_full_scale_bytes", o.host_per_step.device_to_host * scale},
                        {"host_to_device_full_scale_bytes", o.host_per_step.host_to_device * scale}};
  s["step_seconds"] = per_step(r, o.step_seconds);
  s["losses"] = per_step(r, o.losses);
  s["grad_norms"] = per_step(r, o.grad_norms);
  s["predicted_step"] = nullptr;
  if (!r.options.hardware.empty()) {
    const StepTime st = predict_step_time(r, o, step_time_setting(r.options));
    s["predicted_step"] = {{"seconds", st.seconds},
                           {"compute_seconds", st.compute},
                           {"exposed_communication_seconds", st.exposed_communication},
                           {"communication_seconds", st.communication},
                           {"bubble_seconds", st.bubble},
                           {"offload_seconds", st.offload},
                           {"tokens_per_second_per_gpu", st.tokens_per_second_per_gpu},
                           {"mfu", st.mfu},
                           {"model_flops_per_gpu", st.model_flops}};
  }
  return s;
}

// --hardware: what the predictions assume; null without it.
json step_time_json(const RunReport& r) {
  if (r.options.hardware.empty()) return nullptr;
  const StepTimeSetting setting = step_time_setting(r.options);
  const Achievable& a = setting.achievable;
  return {{"hardware", setting.hardware.name},
          {"origin", setting.hardware.origin},
          {"gpus_per_node", setting.gpus_per_node},
          {"nodes", (r.world + setting.gpus_per_node - 1) / setting.gpus_per_node},
          {"achievable",
           {{"matmul", a.matmul},
            {"attention", a.attention},
            {"memory", a.memory},
            {"intra_link", a.intra_link},
            {"inter_link", a.inter_link},
            {"host_link", a.host_link},
            {"cpu_adam_params_per_s", a.cpu_adam_params_per_s},
            {"basis", a.basis}}}};
}

}  // namespace

std::string format_json(const RunReport& r, const Advice* advice) {
  const RunOptions& o = r.options;
  json root;
  root["schema_version"] = kJsonSchemaVersion;
  root["emu_version"] = EMU_VERSION;
  root["config"] = {
      {"model", o.model},
      {"shrink", r.shrink},
      {"plan", r.plan},
      {"ranks", r.world},
      {"hosts", r.hosts},
      {"ranks_per_node", r.ranks_per_node},
      {"precision", std::string(o.strategies.front().recipe.name())},
      {"steps", reported_steps(o)},
      {"gradient_accumulation", o.accumulation},
      {"activation_checkpointing", o.model_options.checkpoint},
      {"selective_recompute", o.model_options.selective_recompute},
      {"sequence_parallel", o.model_options.sequence_parallel},
      {"attention", std::string(model::attention_name(o.model_options.attention))},
      {"loss", std::string(model::loss_name(o.model_options.loss))},
      {"adamw", std::string(optim::adamw_impl_name(o.strategies.front().adamw_impl))},
      {"optimizer_offload", o.offload},
      {"collectives", o.collectives.empty() ? "ring" : o.collectives},
      {"deepspeed_config", text_or_null(o.deepspeed)},
      {"tokens", o.tokens_path.empty() ? json("synthetic") : json(o.tokens_path)},
      {"initial_weights", o.load_weights_path.empty() ? json("seeded") : json(o.load_weights_path)},
      {"saved_weights", saved_weights(r)},
      {"device", r.plan ? "shapes" : o.device},
      {"cap",
       {{"spec", o.cap.text},
        {"per_rank_bytes", r.cap == kNoCap ? json(nullptr) : json(r.cap)},
        {"full_scale_bytes", r.cap == kNoCap ? json(nullptr) : json(r.cap * r.scale())}}},
      {"reserve", {{"per_rank_bytes", r.reserve}, {"full_scale_bytes", o.reserve_full_scale}}},
      {"strict_oom", o.strict_oom},
      {"allocator", std::string(allocator_name(o.allocator))},
      {"alloc_conf", text_or_null(o.alloc_conf.str())},
  };
  root["model"] = {{"full_scale", shapes(o.full)}, {"run", shapes(r.model)}};
  json outcomes = json::array();
  for (const StrategyOutcome& outcome : r.outcomes) outcomes.push_back(outcome_json(r, outcome));
  root["strategies"] = outcomes;
  root["complete"] = r.complete;
  root["strategies_not_run"] = r.not_run;
  root["seconds"] = r.seconds;
  root["step_time"] = step_time_json(r);
  if (advice != nullptr) root["advice"] = advice_json(*advice);
  return root.dump(2) + "\n";
}

}  // namespace emu::app
