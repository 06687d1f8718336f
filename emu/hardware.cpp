#include "emu/hardware.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "emu/check.h"

namespace emu {

// The text of each file in hardware/, generated at configure time (cmake/EmbedHardware.cmake).
struct EmbeddedFile {
  const char* name;
  const char* text;
};
extern const EmbeddedFile kHardwareFiles[];
extern const size_t kHardwareFileCount;

namespace {

using nlohmann::json;

double positive(const json& object, const char* key, std::string_view where) {
  if (!object.contains(key) || !object[key].is_number() || !(object[key].get<double>() > 0)) {
    throw InputError(fmt::format("{}: \"{}\" must be a number above 0", where, key));
  }
  return object[key].get<double>();
}

std::string text(const json& object, const char* key, std::string_view where) {
  if (!object.contains(key) || !object[key].is_string() || object[key].get<std::string>().empty()) {
    throw InputError(fmt::format("{}: \"{}\" must be a non-empty string", where, key));
  }
  return object[key].get<std::string>();
}

const json& section(const json& object, const char* key, std::string_view where) {
  if (!object.contains(key) || !object[key].is_object()) {
    throw InputError(fmt::format("{}: \"{}\" must be an object", where, key));
  }
  return object[key];
}

LinkSpec link(const json& object, const char* key, std::string_view origin, bool latency) {
  const std::string where = fmt::format("{}, {}", origin, key);
  const json& s = section(object, key, origin);
  LinkSpec spec;
  spec.link = text(s, "link", where);
  spec.gb_per_s_per_direction = positive(s, "gb_per_s_per_direction", where);
  if (latency) spec.step_latency_us = positive(s, "step_latency_us", where);
  return spec;
}

}  // namespace

Hardware parse_hardware(std::string_view json_text, std::string_view origin) {
  const json root = json::parse(json_text, nullptr, false);
  if (root.is_discarded() || !root.is_object()) {
    throw InputError(fmt::format("{}: not a JSON object (see hardware/*.json for the form)", origin));
  }
  Hardware h;
  h.origin = std::string(origin);
  h.name = text(root, "name", origin);
  h.description = text(root, "description", origin);
  if (root.contains("cap")) h.cap = text(root, "cap", origin);
  const std::string gpu_where = fmt::format("{}, gpu", origin);
  const json& gpu = section(root, "gpu", origin);
  h.memory_gib = positive(gpu, "memory_gib", gpu_where);
  h.bf16_dense_tflops = positive(gpu, "bf16_dense_tflops", gpu_where);
  h.fp32_tflops = positive(gpu, "fp32_tflops", gpu_where);
  h.hbm_gb_per_s = positive(gpu, "hbm_gb_per_s", gpu_where);
  h.intra_node = link(root, "intra_node", origin, true);
  const double per_node = positive(section(root, "intra_node", origin), "gpus_per_node", gpu_where);
  if (per_node != static_cast<int>(per_node)) {
    throw InputError(fmt::format("{}, intra_node: \"gpus_per_node\" must be a whole number", origin));
  }
  h.gpus_per_node = static_cast<int>(per_node);
  h.inter_node = link(root, "inter_node", origin, true);
  h.host = link(root, "host", origin, false);
  h.call_latency_us = positive(root, "call_latency_us", origin);
  for (const auto& [key, value] : section(root, "sources", origin).items()) {
    if (value.is_string()) h.sources[key] = value.get<std::string>();
  }
  for (const char* needed : {"gpu", "intra_node", "inter_node", "host", "latencies"}) {
    if (!h.sources.contains(needed)) {
      throw InputError(fmt::format("{}, sources: \"{}\" must say where those figures come from", origin, needed));
    }
  }
  return h;
}

const std::vector<Hardware>& builtin_hardware() {
  static const std::vector<Hardware> all = [] {
    std::vector<Hardware> list;
    for (size_t i = 0; i < kHardwareFileCount; ++i) {
      list.push_back(parse_hardware(kHardwareFiles[i].text, fmt::format("hardware/{}", kHardwareFiles[i].name)));
      list.back().origin = "built-in";
    }
    return list;
  }();
  return all;
}

std::string hardware_names() {
  std::string names;
  for (const Hardware& h : builtin_hardware()) names += (names.empty() ? "" : ", ") + h.name;
  return names;
}

Hardware find_hardware(std::string_view name_or_path) {
  for (const Hardware& h : builtin_hardware()) {
    if (h.name == name_or_path) return h;
  }
  const std::filesystem::path path(name_or_path);
  if (path.extension() != ".json") {
    throw InputError(
        fmt::format("hardware '{}' is not known; expected one of {} or a .json file in their form (copy one from "
                    "hardware/)",
                    name_or_path, hardware_names()));
  }
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("hardware file '{}' cannot be read", name_or_path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse_hardware(buffer.str(), name_or_path);
}

}  // namespace emu
