// Ctrl-C (SIGINT) and a scheduler's SIGTERM, under mpirun: the job may be killed moments later, so nothing is left
// to do at the signal but to say what there is. Rank 0 keeps a note of which strategies finished (their results
// are already in the JSON, rewritten atomically after each one) and the handler prints it, then lets the signal
// end the process as it would have.
#pragma once

#include <string>

namespace emu::app {

// Installs the handler for SIGINT and SIGTERM (every rank; only a rank with a note prints).
void install_interrupt_handlers();

// What the handler prints after "emu: interrupted by SIGINT: ". Not to be called from a signal handler.
void set_interrupt_note(const std::string& note);

}  // namespace emu::app
