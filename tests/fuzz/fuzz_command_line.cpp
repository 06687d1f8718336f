// Fuzzes the emu command line (app/options.h). The input is the argument list after the program name, one
// argument per line, so seeds read like a command line: "--cap\n40GB-scaled\n-k\n32".
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "app/options.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> arguments{"emu"};
  std::string current;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      arguments.push_back(current);
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  if (size > 0) arguments.push_back(current);

  // argv as main() gets it: C strings (an embedded NUL ends an argument there, as it would in a real argv),
  // terminated by a null pointer.
  std::vector<const char*> argv;
  for (const std::string& argument : arguments) argv.push_back(argument.c_str());
  argv.push_back(nullptr);

  emu::fuzz::expect_accept_or_input_error("emu::app::parse_command_line", [&] {
    (void)emu::app::parse_command_line(static_cast<int>(arguments.size()), argv.data());
  });
  return 0;
}
