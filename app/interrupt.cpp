#include "app/interrupt.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <csignal>
#include <cstring>

namespace emu::app {
namespace {

// Two buffers: the note is written into the one the handler is not reading, then published by the index.
constexpr size_t kNoteBytes = 4096;
std::array<std::array<char, kNoteBytes>, 2> notes{};
std::atomic<int> published{-1};
static_assert(std::atomic<int>::is_always_lock_free, "the handler reads the index");

void write_all(const char* text, size_t length) {
  while (length > 0) {
    const ssize_t written = ::write(STDERR_FILENO, text, length);
    if (written <= 0) return;
    text += written;
    length -= static_cast<size_t>(written);
  }
}

extern "C" void on_interrupt(int signal_number) {
  const int index = published.load();
  if (index >= 0) {
    const char* name = signal_number == SIGINT ? "SIGINT" : "SIGTERM";
    write_all("\nemu: interrupted by ", 21);
    write_all(name, std::strlen(name));
    write_all(": ", 2);
    write_all(notes[static_cast<size_t>(index)].data(), std::strlen(notes[static_cast<size_t>(index)].data()));
    write_all("\n", 1);
  }
  // End as the signal would have (the exit status says which), the default action restored.
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

}  // namespace

void install_interrupt_handlers() {
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
}

void set_interrupt_note(const std::string& note) {
  const int next = published.load() == 0 ? 1 : 0;
  std::array<char, kNoteBytes>& buffer = notes[static_cast<size_t>(next)];
  const size_t length = std::min(note.size(), kNoteBytes - 1);
  std::memcpy(buffer.data(), note.data(), length);
  buffer[length] = '\0';
  published.store(next);
}

}  // namespace emu::app
