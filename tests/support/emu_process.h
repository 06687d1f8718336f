// What the end-to-end tests of the emu executable share: its path in this build, a quick model to run, and reading
// the JSON it writes. Header-only: EMU_BINARY_DIR comes from tests/support/paths.h (generated).
#pragma once

#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/support/json_schema.h"
#include "tests/support/paths.h"
#include "tests/support/process.h"

namespace emu::testing {

inline const std::string kEmu = std::string(EMU_BINARY_DIR) + "/bin/emu";
// GPT-2 (124M) shrunk by 8: 1.9M parameters, quick on 8 oversubscribed ranks.
inline const std::string kSmall = " --model gpt2 --shrink 8 --steps 2";

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Reads a JSON file; one emu wrote with --json (it has `emu_version` at the top) must conform to
// docs/emu-output.schema.json, else this throws with every violation, failing the test that read it.
inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  nlohmann::json document = nlohmann::json::parse(in);
  if (document.is_object() && document.contains("emu_version")) {
    const std::vector<std::string> violations = schema_violations(emu_output_schema(), document);
    if (!violations.empty()) {
      std::string text = path + " does not conform to docs/emu-output.schema.json:";
      for (const std::string& v : violations) text += "\n  " + v;
      throw std::runtime_error(text);
    }
  }
  return document;
}

// A JSON traffic list ({collective, group, calls, sent_bytes, ...} per collective and group) summed over the groups
// by collective: `field` of each, e.g. traffic_by_kind(s["traffic_per_step"], "sent_bytes")["all_reduce"].
inline std::map<std::string, double> traffic_by_kind(const nlohmann::json& traffic, const std::string& field) {
  std::map<std::string, double> out;
  for (const nlohmann::json& t : traffic) out[t["collective"].get<std::string>()] += t[field].get<double>();
  return out;
}

}  // namespace emu::testing
