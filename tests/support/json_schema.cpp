#include "tests/support/json_schema.h"
#include "tests/support/paths.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <stdexcept>

namespace emu::testing {
namespace {

using nlohmann::json;

const std::set<std::string> kAnnotations = {"$schema", "$id", "title", "description", "$defs"};

class Validator {
 public:
  explicit Validator(const json& root) : root_(root) {}

  void check(const json& schema, const json& value, const std::string& where) {
    for (const auto& [keyword, argument] : schema.items()) {
      if (kAnnotations.contains(keyword)) continue;
      if (keyword == "$ref") {
        check(resolve(argument.get<std::string>()), value, where);
      } else if (keyword == "type") {
        check_type(argument, value, where);
      } else if (keyword == "properties" || keyword == "required" || keyword == "additionalProperties") {
        if (value.is_object()) check_object(schema, keyword, value, where);
      } else if (keyword == "items") {
        for (size_t i = 0; value.is_array() && i < value.size(); ++i) {
          check(argument, value[i], fmt::format("{}/{}", where, i));
        }
      } else if (keyword == "minItems") {
        if (value.is_array() && value.size() < argument.get<size_t>()) fail(where, "fewer items than minItems");
      } else if (keyword == "enum") {
        if (std::find(argument.begin(), argument.end(), value) == argument.end()) {
          fail(where, fmt::format("{} is not one of {}", value.dump(), argument.dump()));
        }
      } else if (keyword == "const") {
        if (value != argument) fail(where, fmt::format("{} is not {}", value.dump(), argument.dump()));
      } else if (keyword == "minimum") {
        if (value.is_number() && value.get<double>() < argument.get<double>()) {
          fail(where, fmt::format("{} is below the minimum {}", value.dump(), argument.dump()));
        }
      } else if (keyword == "oneOf") {
        check_one_of(argument, value, where);
      } else {
        throw std::runtime_error(fmt::format("json_schema: unsupported keyword '{}' at {}", keyword, where));
      }
    }
  }

  std::vector<std::string> violations;

 private:
  const json& resolve(const std::string& ref) const {
    const std::string prefix = "#/$defs/";
    if (!ref.starts_with(prefix) || !root_.contains("$defs") || !root_["$defs"].contains(ref.substr(prefix.size()))) {
      throw std::runtime_error("json_schema: unresolvable $ref " + ref);
    }
    return root_["$defs"][ref.substr(prefix.size())];
  }

  static bool is_type(const std::string& type, const json& value) {
    if (type == "object") return value.is_object();
    if (type == "array") return value.is_array();
    if (type == "string") return value.is_string();
    if (type == "boolean") return value.is_boolean();
    if (type == "null") return value.is_null();
    if (type == "number") return value.is_number();
    if (type == "integer") {
      return value.is_number_integer() ||
             (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>());
    }
    throw std::runtime_error("json_schema: unknown type " + type);
  }

  void check_type(const json& types, const json& value, const std::string& where) {
    const json names = types.is_array() ? types : json::array({types});
    for (const json& name : names) {
      if (is_type(name.get<std::string>(), value)) return;
    }
    fail(where, fmt::format("{} is not of type {}", value.dump(), types.dump()));
  }

  void check_object(const json& schema, const std::string& keyword, const json& value, const std::string& where) {
    const json properties = schema.value("properties", json::object());
    if (keyword == "properties") {
      for (const auto& [name, sub] : properties.items()) {
        if (value.contains(name)) check(sub, value[name], where + "/" + name);
      }
    } else if (keyword == "required") {
      for (const json& name : schema["required"]) {
        if (!value.contains(name.get<std::string>())) fail(where, "missing required " + name.get<std::string>());
      }
    } else if (!schema["additionalProperties"].get<bool>()) {
      for (const auto& [name, sub] : value.items()) {
        if (!properties.contains(name)) fail(where, "a field the schema does not document: " + name);
      }
    }
  }

  void check_one_of(const json& choices, const json& value, const std::string& where) {
    int matched = 0;
    std::vector<std::string> first_failure;
    for (const json& choice : choices) {
      Validator inner(root_);
      inner.check(choice, value, where);
      if (inner.violations.empty()) {
        ++matched;
      } else if (first_failure.empty() || inner.violations.size() < first_failure.size()) {
        first_failure = inner.violations;  // the closest alternative says best what is wrong
      }
    }
    if (matched == 1) return;
    if (matched > 1) {
      fail(where, "matches more than one of oneOf");
      return;
    }
    violations.insert(violations.end(), first_failure.begin(), first_failure.end());
  }

  void fail(const std::string& where, const std::string& what) {
    violations.push_back((where.empty() ? "/" : where) + ": " + what);
  }

  const json& root_;
};

}  // namespace

std::vector<std::string> schema_violations(const json& schema, const json& document) {
  Validator validator(schema);
  validator.check(schema, document, "");
  return validator.violations;
}

const json& emu_output_schema() {
  static const json schema = [] {
    std::ifstream in(std::string(EMU_SOURCE_DIR) + "/docs/emu-output.schema.json");
    if (!in) throw std::runtime_error("cannot read docs/emu-output.schema.json");
    return json::parse(in);
  }();
  return schema;
}

}  // namespace emu::testing
