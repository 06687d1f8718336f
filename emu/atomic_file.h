// Files emu and its tools write are complete or absent: written beside their destination, flushed, then renamed
// over it.
#pragma once

#include <string>
#include <string_view>

namespace emu {

// Writes `contents` to `path` atomically. Throws InputError naming the path and the reason when it cannot.
void write_file_atomically(const std::string& path, std::string_view contents);

}  // namespace emu
