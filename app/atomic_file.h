// The app writes its outputs (JSON, trace, SVG) complete or absent, through emu/atomic_file.h.
#pragma once

#include "emu/atomic_file.h"

namespace emu::app {

using emu::write_file_atomically;

}  // namespace emu::app
