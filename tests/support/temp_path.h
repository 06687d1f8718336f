#pragma once
// A path for a test's scratch file, in a folder of this process's own (/tmp/emu-test-<pid>/), removed when the
// process exits. Fixed names in /tmp itself clash between users and between runs: a file left by another user cannot
// be rewritten, and the test would read that user's copy.
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace emu::testing {

inline std::filesystem::path temp_path(const std::string& name) {
  struct Folder {
    std::filesystem::path path = std::filesystem::temp_directory_path() / ("emu-test-" + std::to_string(::getpid()));
    Folder() { std::filesystem::create_directories(path); }
    Folder(const Folder&) = delete;
    Folder& operator=(const Folder&) = delete;
    ~Folder() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Folder folder;
  return folder.path / name;
}

}  // namespace emu::testing
