#include "collectives/virtual/virtual_link.h"

#include <cstring>

#include "emu/check.h"

namespace emu::coll {
namespace {

class VirtualLink final : public Link {
 public:
  VirtualLink(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view library() const override { return "virtual"; }

  void exchange(const void*, size_t, int, void*, size_t, int) override {
    EMU_CHECK(false, "a virtual group of {} ranks cannot move data; plan with a shapes-only device", size_);
  }
  void native(const Call& call) override {
    EMU_CHECK(false, "a virtual group of {} ranks cannot run {}", size_, kind_name(call.kind));
  }
  // Every virtual rank calls what this one calls: the checks see agreement.
  void gather_all(const void* mine, size_t bytes, void* all) override {
    for (int r = 0; r < size_; ++r) std::memcpy(static_cast<char*>(all) + static_cast<size_t>(r) * bytes, mine, bytes);
  }
  std::unique_ptr<Link> split(int, int) override {
    EMU_CHECK(false, "a virtual group cannot be split: make each planned group with make_virtual_communicator");
    return nullptr;
  }

 private:
  int rank_;
  int size_;
};

}  // namespace

std::unique_ptr<Link> make_virtual_link(int rank, int size) { return std::make_unique<VirtualLink>(rank, size); }

std::unique_ptr<Communicator> make_virtual_communicator(Device& device, int rank, int size, std::string name,
                                                        int64_t shrink, int ranks_per_node) {
  EMU_CHECK(!device.holds_data(), "a virtual communicator needs a shapes-only device");
  CommunicatorOptions options;  // no watchdog, no call checks: nothing waits
  options.shrink = shrink;
  options.ranks_per_node = ranks_per_node;
  return std::make_unique<Communicator>(make_virtual_link(rank, size), device, std::move(name), options);
}

}  // namespace emu::coll
