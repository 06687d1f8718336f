// A JSON Schema validator for the subset docs/emu-output.schema.json uses, for the tests that check every JSON emu
// writes against its documented schema.
//
// Why not a library: Debian's C++ validator (libvalijson-dev) depends on Qt 5, Poco, MariaDB and three other JSON
// libraries (68 packages with --no-install-recommends) for a test-only need; this subset is about a hundred lines.
//
// Keywords (JSON Schema 2020-12 meaning): type (a name or a list of names), properties, required,
// additionalProperties (false), items, minItems, enum, const, minimum, oneOf, and $ref to "#/$defs/<name>".
// Annotations ($schema, $id, title, description) are skipped. Any other keyword is an error, so the schema cannot
// say more than this validator checks.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace emu::testing {

// The violations of `document` against `schema`, each "<JSON pointer>: <what is wrong>"; empty when it conforms.
std::vector<std::string> schema_violations(const nlohmann::json& schema, const nlohmann::json& document);

// docs/emu-output.schema.json of this source tree.
const nlohmann::json& emu_output_schema();

}  // namespace emu::testing
