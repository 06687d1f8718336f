// What the α-β-γ model (algorithm.h, Cost) says about time: one call's predicted seconds over a link, the payload
// at which one algorithm overtakes another, and the link's α, β, γ fitted to measured times.
//
// This is the model that explains NCCL's and MPI's choices: the ring's 2(N-1) rounds cost latency that a tree's
// 2 ceil(log2 N) do not, while the tree moves the whole buffer through one rank in every round. Below the
// crossover payload the tree (or recursive halving-doubling) is faster, above it the ring.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "collectives/algorithm.h"

namespace emu::coll {

// A link as the model sees it: latency per message, seconds per byte moved, seconds per byte reduced.
struct LinkModel {
  double alpha = 0;  // s
  double beta = 0;   // s/B (1 / bandwidth)
  double gamma = 0;  // s/B (1 / reduction rate)
};

// Every term at the one link.
double predicted_seconds(const Cost& cost, const LinkModel& link);

// Two kinds of link, as on a GPU cluster: within a node (NVLink) and between nodes (the NIC), with L ranks per node
// (algorithm.h, node_size). On one node every term is charged at the node's link. Over several nodes, a split cost
// (Cost::split: the hierarchical all-reduce) has its inter-node rounds and bytes charged at the network's α and β
// and the rest at the node's; an unsplit one all at the network's (each step of a flat algorithm waits on some
// message between nodes). Reductions run on the GPU: the node's γ.
//
// `flat`, where given, replaces the network's link for the unsplit costs only: what a flat algorithm spread over
// whole nodes really gets when the library runs it over many channels at once. NCCL cuts a ring into channels and
// gives each node boundary of each channel its own NIC, so a node with one NIC per GPU offers the flat ring all of
// them together (app/step_time.cpp, link_for), while each inter-node ring of the hierarchical all-reduce runs over
// its rank's one NIC (`network`). Absent, as in coll-teach's one-link-per-pair view: the network's.
struct Fabric {
  LinkModel node;
  LinkModel network;
  int ranks_per_node = 0;  // 0: one node
  std::optional<LinkModel> flat;
};
double predicted_seconds(const Cost& cost, const Fabric& fabric, int n);

// The payload S (bytes) at which `a` and `b` take the same time over N ranks, with `a` the faster below it; empty
// when neither overtakes the other at any positive size (the same rounds, or the one with fewer rounds also
// moves no more per byte). Both algorithms must have a cost.
struct Crossover {
  double payload = 0;
  const Algorithm* below = nullptr;  // faster for payloads under `payload`
  const Algorithm* above = nullptr;
};
std::optional<Crossover> crossover(const Algorithm& a, const Algorithm& b, int n, const LinkModel& link);
// The same over a fabric, each algorithm's cost taken for its L ranks per node.
std::optional<Crossover> crossover(const Algorithm& a, const Algorithm& b, int n, const Fabric& fabric);

// One measured call: the algorithm's cost at its payload and rank count, and the time it took.
struct Sample {
  Cost cost;
  double seconds = 0;
};

// α, β, γ (each ≥ 0) that minimise the squared relative error of the prediction over the samples (relative, so
// that microsecond calls weigh as much as second-long ones), with `relative_errors` the error of each sample.
struct Fit {
  LinkModel link;
  std::vector<double> relative_errors;  // (predicted - measured) / measured, one per sample
};
Fit fit_link(std::span<const Sample> samples);

// "α 4.1 µs, 1/β 11.2 GB/s, 1/γ 6 GB/s"
std::string describe(const LinkModel& link);

}  // namespace emu::coll
