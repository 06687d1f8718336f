// --json FILE: the results for machines. The fields are documented in the README ("JSON output").
#pragma once

#include <string>

#include "app/run.h"

namespace emu::app {

std::string format_json(const RunReport& report);

}  // namespace emu::app
