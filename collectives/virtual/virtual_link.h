// A group of ranks of which only this one exists: the Link behind shapes-only planning at any rank count
// (`emu --plan 1024`). On a device that holds no data the communicator moves nothing and charges the ledger with
// what each algorithm declares, so an algorithm never reaches this Link's exchange(); only the size matters.
#pragma once

#include <memory>
#include <string>

#include "collectives/communicator.h"
#include "collectives/link.h"

namespace emu::coll {

// Rank `rank` of a group of `size`. exchange() and native() end the job: they mean data was about to move.
std::unique_ptr<Link> make_virtual_link(int rank, int size);

// A communicator over a virtual group, its buffers charged to `device` (which must hold no data); `shrink`: the k
// of a shrunk model accounted on shapes (its scratch slices charged ÷ k², CommunicatorOptions::shrink);
// `ranks_per_node`: its nodes (CommunicatorOptions::ranks_per_node, 0: one node).
std::unique_ptr<Communicator> make_virtual_communicator(Device& device, int rank, int size, std::string name,
                                                        int64_t shrink = 1, int ranks_per_node = 0);

}  // namespace emu::coll
