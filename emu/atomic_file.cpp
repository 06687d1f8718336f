#include "emu/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "emu/check.h"

namespace emu {

void write_file_atomically(const std::string& path, std::string_view contents) {
  const std::string temporary = fmt::format("{}.tmp.{}", path, getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw InputError(fmt::format("'{}' cannot be written: {}", path, std::strerror(errno)));
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      throw InputError(fmt::format("'{}' cannot be written: {}", path, std::strerror(error)));
    }
    written += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  const bool closed = ::close(fd) == 0;
  if (!synced || !closed || std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    throw InputError(fmt::format("'{}' cannot be written: {}", path, std::strerror(error)));
  }
}

}  // namespace emu
