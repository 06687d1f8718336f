// The validator the end-to-end tests check every emu JSON with (tests/support/json_schema.cpp), on documents whose
// verdict is known by reading them, and docs/emu-output.schema.json itself: every field it allows is documented.
#include "tests/support/json_schema.h"

#include <gtest/gtest.h>

#include <functional>

namespace emu::testing {
namespace {

using nlohmann::json;

const json kSchema = json::parse(R"({
  "$defs": {"pair": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0},
                                                      "b": {"type": ["string", "null"]}},
                     "required": ["a", "b"], "additionalProperties": false}},
  "type": "object",
  "properties": {
    "version": {"const": 1},
    "kind": {"enum": ["fit", "oom"]},
    "pairs": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/pair"}},
    "maybe": {"oneOf": [{"type": "null"}, {"type": "array", "items": {"type": "number"}}]}
  },
  "required": ["version", "kind", "pairs", "maybe"],
  "additionalProperties": false
})");

const json kGood = json::parse(R"({"version": 1, "kind": "fit", "pairs": [{"a": 3, "b": null}], "maybe": [1.5]})");

TEST(JsonSchema, AConformingDocumentHasNoViolations) {
  EXPECT_TRUE(schema_violations(kSchema, kGood).empty());
  json plan = kGood;
  plan["maybe"] = nullptr;
  EXPECT_TRUE(schema_violations(kSchema, plan).empty());
}

// Each edit breaks one rule; the violation names where.
TEST(JsonSchema, EachBrokenRuleIsReportedWithItsPlace) {
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& d) { d["version"] = 2; }, "/version: 2 is not 1"},
      {[](json& d) { d["kind"] = "fits"; }, "/kind: \"fits\" is not one of"},
      {[](json& d) { d["pairs"] = json::array(); }, "/pairs: fewer items than minItems"},
      {[](json& d) { d["pairs"][0]["a"] = -1; }, "/pairs/0/a: -1 is below the minimum"},
      {[](json& d) { d["pairs"][0]["a"] = 1.5; }, "/pairs/0/a: 1.5 is not of type"},
      {[](json& d) { d["pairs"][0]["b"] = 7; }, "/pairs/0/b: 7 is not of type"},
      {[](json& d) { d["pairs"][0].erase("b"); }, "/pairs/0: missing required b"},
      {[](json& d) { d["extra"] = true; }, "/: a field the schema does not document: extra"},
      {[](json& d) { d["maybe"] = "no"; }, "/maybe: \"no\" is not of type"},
  };
  for (const auto& [edit, expected] : cases) {
    json document = kGood;
    edit(document);
    const std::vector<std::string> violations = schema_violations(kSchema, document);
    ASSERT_EQ(violations.size(), 1u) << expected;
    EXPECT_NE(violations.front().find(expected), std::string::npos) << violations.front();
  }
}

TEST(JsonSchema, AKeywordItDoesNotCheckIsAnErrorNotAPass) {
  EXPECT_THROW(schema_violations(json::parse(R"({"maxLength": 3})"), json("abcd")), std::runtime_error);
  EXPECT_THROW(schema_violations(json::parse(R"({"$ref": "#/$defs/none"})"), json(1)), std::runtime_error);
}

// Every field emu writes is documented: each property of docs/emu-output.schema.json has a description, and every
// object is closed (additionalProperties false), so an undocumented field fails the end-to-end tests.
TEST(JsonSchema, EmuOutputSchemaDocumentsEveryFieldAndAllowsNoOther) {
  const json& schema = emu_output_schema();
  int properties = 0;
  std::function<void(const json&, const std::string&)> walk = [&](const json& node, const std::string& where) {
    if (node.is_array()) {
      for (size_t i = 0; i < node.size(); ++i) walk(node[i], where + "/" + std::to_string(i));
      return;
    }
    if (!node.is_object()) return;
    if (node.contains("properties")) {
      EXPECT_EQ(node.value("additionalProperties", true), false) << where << " is open to undocumented fields";
      for (const auto& [name, sub] : node["properties"].items()) {
        ++properties;
        EXPECT_FALSE(sub.value("description", std::string()).empty()) << where << "/" << name << " is undocumented";
      }
    }
    for (const auto& [key, sub] : node.items()) walk(sub, where + "/" + key);
  };
  walk(schema, "");
  EXPECT_GT(properties, 100) << "the schema covers every field of a run's JSON";
  EXPECT_EQ(schema["$defs"]["run"]["properties"]["schema_version"]["const"], 1);
}

}  // namespace
}  // namespace emu::testing
