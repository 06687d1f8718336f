#include "app/json_report.h"

#include <nlohmann/json.hpp>

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

json outcome_json(const RunReport& r, const StrategyOutcome& o) {
  const uint64_t scale = r.scale();
  json s;
  s["name"] = o.name;
  s["verdict"] = o.fits() ? "fit" : "oom";
  s["steps_run"] = o.steps_run;
  if (!o.fits()) {
    json ranks = json::array();
    for (const strategy::RankMemory& m : o.verdict.ranks) {
      if (!m.out_of_memory) continue;
      ranks.push_back({{"rank", m.rank},
                       {"phase", m.phase},
                       {"tensor", m.what},
                       {"requested_bytes", m.requested},
                       {"in_use_bytes", m.in_use},
                       {"cap_bytes", m.cap},
                       {"needed_bytes", m.peak},
                       {"needed_full_scale_bytes", m.peak * scale}});
    }
    s["out_of_memory"] = {{"ranks", ranks}, {"summary", o.verdict.summary()}};
  }
  if (!o.peak.empty()) {
    const int p = o.peak_rank;
    s["peak"] = {{"rank", p},
                 {"bytes", o.peak[p]},
                 {"full_scale_bytes", o.peak[p] * scale},
                 {"at_peak_by_category", categories(o.at_peak[p], 1)},
                 {"at_peak_by_category_full_scale", categories(o.at_peak[p], scale)},
                 {"category_peaks", categories(o.category_peaks[p], 1)},
                 {"category_peaks_full_scale", categories(o.category_peaks[p], scale)}};
    s["peak_bytes_per_rank"] = o.peak;
    const auto rp = static_cast<size_t>(o.reserved_peak_rank);
    const uint64_t fragmentation = o.reserved_peak[rp] - o.allocated_at_reserved_peak[rp];
    s["reserved"] = {{"allocator", std::string(allocator_name(r.options.allocator))},
                     {"alloc_conf", r.options.alloc_conf.str()},
                     {"rank", o.reserved_peak_rank},
                     {"peak_bytes", o.reserved_peak[rp]},
                     {"peak_full_scale_bytes", o.reserved_peak[rp] * scale},
                     {"allocated_at_peak_bytes", o.allocated_at_reserved_peak[rp]},
                     {"fragmentation_bytes", fragmentation},
                     {"fragmentation_full_scale_bytes", fragmentation * scale}};
    s["reserved_peak_bytes_per_rank"] = o.reserved_peak;
  }
  json traffic = json::array();
  for (const strategy::PredictedTraffic& t : o.prediction.traffic) {
    traffic.push_back({{"collective", std::string(coll::kind_name(t.kind))},
                       {"group", t.group},
                       {"calls", t.calls},
                       {"sent_bytes", t.sent},
                       {"sent_full_scale_bytes", t.sent * scale}});
  }
  s["predicted"] = {{"formula", o.prediction.formula},
                    {"by_category", categories(o.prediction.peak, 1)},
                    {"by_category_full_scale", categories(o.prediction.peak, scale)},
                    {"model_state_bytes", o.prediction.model_state_bytes()},
                    {"model_state_full_scale_bytes", o.prediction.model_state_bytes() * scale},
                    {"activation_bytes", o.predicted_activations},
                    {"traffic_per_step", traffic}};
  json measured = json::object();
  for (const auto& [kind, t] : o.traffic_per_step) {
    const auto calls = o.calls_per_step.find(kind);
    measured[std::string(coll::kind_name(kind))] = {{"calls", calls == o.calls_per_step.end() ? 0 : calls->second},
                                                    {"sent_bytes", t.sent},
                                                    {"received_bytes", t.received},
                                                    {"sent_full_scale_bytes", t.sent * scale},
                                                    {"received_full_scale_bytes", t.received * scale}};
  }
  s["traffic_per_step"] = measured;
  s["pcie_per_step"] = {{"device_to_host_bytes", o.host_per_step.device_to_host},
                        {"host_to_device_bytes", o.host_per_step.host_to_device},
                        {"device_to_host_full_scale_bytes", o.host_per_step.device_to_host * scale},
                        {"host_to_device_full_scale_bytes", o.host_per_step.host_to_device * scale}};
  s["step_seconds"] = o.step_seconds;
  s["losses"] = o.losses;
  return s;
}

}  // namespace

std::string format_json(const RunReport& r) {
  const RunOptions& o = r.options;
  json root;
  root["emu_version"] = EMU_VERSION;
  root["config"] = {
      {"model", o.model},
      {"shrink", r.shrink},
      {"plan", r.plan},
      {"ranks", r.world},
      {"hosts", r.hosts},
      {"ranks_per_node", r.ranks_per_node},
      {"precision", std::string(o.strategies.front().recipe.name())},
      {"steps", o.steps},
      {"gradient_accumulation", o.accumulation},
      {"activation_checkpointing", o.model_options.checkpoint},
      {"attention", std::string(model::attention_name(o.model_options.attention))},
      {"loss", std::string(model::loss_name(o.model_options.loss))},
      {"adamw", std::string(optim::adamw_impl_name(o.strategies.front().adamw_impl))},
      {"optimizer_offload", o.offload},
      {"collectives", o.collectives.empty() ? "ring" : o.collectives},
      {"deepspeed_config", o.deepspeed},
      {"tokens", o.tokens_path.empty() ? json("synthetic") : json(o.tokens_path)},
      {"initial_weights", o.load_weights_path.empty() ? json("seeded") : json(o.load_weights_path)},
      {"saved_weights", o.save_weights_path.empty() ? json(nullptr) : json(o.save_weights_path)},
      {"device", r.plan ? "shapes" : o.device},
      {"cap",
       {{"spec", o.cap.text},
        {"per_rank_bytes", r.cap == kNoCap ? json(nullptr) : json(r.cap)},
        {"full_scale_bytes", r.cap == kNoCap ? json(nullptr) : json(r.cap * r.scale())}}},
      {"reserve", {{"per_rank_bytes", r.reserve}, {"full_scale_bytes", o.reserve_full_scale}}},
      {"strict_oom", o.strict_oom},
      {"allocator", std::string(allocator_name(o.allocator))},
      {"alloc_conf", o.alloc_conf.str()},
  };
  root["model"] = {{"full_scale", shapes(o.full)}, {"run", shapes(r.model)}};
  json outcomes = json::array();
  for (const StrategyOutcome& outcome : r.outcomes) outcomes.push_back(outcome_json(r, outcome));
  root["strategies"] = outcomes;
  root["seconds"] = r.seconds;
  return root.dump(2) + "\n";
}

}  // namespace emu::app
