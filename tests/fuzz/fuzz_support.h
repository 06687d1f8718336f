// What every emu fuzz target checks: a parser of user input either accepts its input or rejects it with
// emu::InputError (exit code 2, a message naming the bad value). Any other exception is a finding, and so is
// every crash, sanitizer report or EMU_CHECK failure; libFuzzer then saves the input that caused it.
#pragma once

#include <cxxabi.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <typeinfo>

#include "emu/check.h"

namespace emu::fuzz {

// A broken promise of the parser that is not an exception (a wrong result): reported, then a crash for libFuzzer.
[[noreturn]] inline void finding(const char* what) {
  std::fprintf(stderr, "emu fuzz: %s\n", what);
  std::abort();
}

// Runs `parse`; returns quietly for success or an InputError, aborts (a finding) on any other exception.
template <typename Parse>
void expect_accept_or_input_error(const char* parser, Parse&& parse) {
  try {
    parse();
  } catch (const InputError&) {
    // The expected rejection of bad input.
  } catch (const std::exception& error) {
    int status = 0;
    char* type = abi::__cxa_demangle(typeid(error).name(), nullptr, nullptr, &status);
    std::fprintf(stderr, "emu fuzz: %s threw %s instead of emu::InputError: %s\n", parser,
                 status == 0 ? type : typeid(error).name(), error.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "emu fuzz: %s threw something that is not a std::exception\n", parser);
    std::abort();
  }
}

// For parsers that take a path: one scratch file per fuzzing process (so parallel fuzzers never share one),
// rewritten for each input and removed when the process ends normally.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& name)
      : path_(std::filesystem::temp_directory_path() / ("emu_fuzz_" + name + "." + std::to_string(::getpid()))) {}
  ~ScratchFile() {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  const std::filesystem::path& write(const uint8_t* data, size_t size) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    out.close();
    if (!out) {
      std::fprintf(stderr, "emu fuzz: cannot write the scratch file %s\n", path_.c_str());
      std::abort();
    }
    return path_;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace emu::fuzz
