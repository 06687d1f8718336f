// The watchdog: a collective that does not complete in time ends the job instead of hanging it.
//
// The dispatch point arms the watchdog with a description of the call ("all_reduce #17, phase 'backward', group
// 'world'") and disarms it when the call returns. One background thread per process waits for the deadline; if
// it passes, the thread prints "[rR/N] coll: watchdog: ..." to stderr, waits a short grace period so the peers
// stuck in the same collective print theirs too, and ends every rank with exit code 3 (emu::fatal).
// Blocking library calls are covered too, since nothing on the calling thread needs to poll.
#pragma once

#include <string>

namespace emu::coll::watchdog {

// Starts the clock for one call; seconds <= 0 leaves the watchdog off. Calls do not nest: arming replaces.
void arm(double seconds, std::string what);
void disarm();

}  // namespace emu::coll::watchdog
