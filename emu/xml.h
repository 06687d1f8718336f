// Text placed in the SVG and HTML files emu and its tools write (memory pictures, coll-teach's pictures).
#pragma once

#include <string>
#include <string_view>

namespace emu {

// `text` with XML's five special characters as entities (& < > " ', the last for attribute values in either quote).
std::string xml_escape(std::string_view text);

}  // namespace emu
