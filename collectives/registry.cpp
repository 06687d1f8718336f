// The table of algorithms: one entry per file in algorithms/, the default of each kind first (ring, as on NCCL,
// where there is one).
#include <array>

#include "collectives/algorithm.h"

namespace emu::coll {

extern const Algorithm kRingAllReduce, kRhdAllReduce, kTreeAllReduce, kDbtreeAllReduce, kHierAllReduce,
    kRingReduceScatter, kRingAllGather, kTreeBroadcast, kRingReduce, kTreeReduce, kPairwiseAllToAll,
    kDisseminationBarrier;
extern const Algorithm kMpiAllReduce, kMpiReduceScatter, kMpiAllGather, kMpiBroadcast, kMpiReduce, kMpiAllToAll,
    kMpiBarrier;

namespace {
const std::array<const Algorithm*, 19> kTable = {
    &kRingAllReduce,        &kRhdAllReduce,     &kTreeAllReduce, &kDbtreeAllReduce, &kHierAllReduce, &kMpiAllReduce,  //
    &kRingReduceScatter,    &kMpiReduceScatter,                                                                       //
    &kRingAllGather,        &kMpiAllGather,                                                                           //
    &kTreeBroadcast,        &kMpiBroadcast,                                                                           //
    &kRingReduce,           &kTreeReduce,       &kMpiReduce,                                                          //
    &kPairwiseAllToAll,     &kMpiAllToAll,                                                                            //
    &kDisseminationBarrier, &kMpiBarrier,                                                                             //
};
}  // namespace

std::span<const Algorithm* const> algorithms() { return kTable; }

std::vector<const Algorithm*> algorithms_for(CollectiveKind kind) {
  std::vector<const Algorithm*> found;
  for (const Algorithm* algorithm : kTable) {
    if (algorithm->kind == kind) found.push_back(algorithm);
  }
  return found;
}

const Algorithm* find_algorithm(CollectiveKind kind, std::string_view name) {
  for (const Algorithm* algorithm : kTable) {
    if (algorithm->kind == kind && algorithm->name == name) return algorithm;
  }
  return nullptr;
}

std::string algorithm_names(CollectiveKind kind) {
  std::string names;
  for (const Algorithm* algorithm : algorithms_for(kind)) {
    names += (names.empty() ? "" : ", ") + std::string(algorithm->name);
  }
  return names;
}

}  // namespace emu::coll
