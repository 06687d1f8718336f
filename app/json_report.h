// --json FILE: the results for machines. Every field is documented in docs/json.md; docs/emu-output.schema.json is
// its JSON Schema, which the end-to-end tests validate every output against.
#pragma once

#include <string>

#include "app/run.h"

namespace emu::app {

// Raised whenever a field is renamed, removed or changes meaning; adding a field keeps it.
inline constexpr int kJsonSchemaVersion = 1;

struct Advice;  // advisor.h

// `advice`: the advisor's search after the run (the "advice" key), when there was one.
std::string format_json(const RunReport& report, const Advice* advice = nullptr);

}  // namespace emu::app
