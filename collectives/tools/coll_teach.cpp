// coll-teach: watch one collective step by step.
//
//   mpirun -np 4 bin/coll-teach --kind all_reduce --algorithm ring --count 8 --trace ring.json
//
// Every rank runs the chosen algorithm once on small verifiable data and logs its exchanges; rank 0 prints, round
// by round, which block each rank sends to whom, what it receives and whether it adds it into its own, with the
// bytes so far, then the per-rank totals beside the algorithm's declared volumes and its α-β-γ cost beside the
// rounds and bytes it really took, and writes a Chrome trace (open it at ui.perfetto.dev) with one track per rank.
//
//   bin/coll-teach --kind all_reduce --cost --ranks 8 [--link perf.json]
//
// prints the cost model instead: each algorithm's predicted time per payload size over N ranks and the payloads
// where one overtakes another, over a link given by --alpha-us/--bandwidth/--reduce-bandwidth or fitted by
// coll-perf --fit.
//
//   mpirun -np 4 bin/coll-teach --tp-layer --batch 1 --seq 8 --hidden 16 [--sequence-parallel]
//
// teaches one tensor-parallel transformer layer instead (teach_layer.h): which matmuls are column- and
// row-parallel, and each all-reduce (or reduce-scatter and all-gather) the layer makes, run here in its order with
// its bytes read from the ledger beside the ring's closed form.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "collectives/cost.h"
#include "collectives/mpi/mpi_communicator.h"
#include "collectives/tools/teach_layer.h"
#include "collectives/tools/teach_picture.h"
#include "collectives/tools/teach_view.h"
#include "collectives/topology.h"
#include "collectives/verify.h"
#include "emu/atomic_file.h"
#include "emu/check.h"
#include "emu/hardware.h"
#include "emu/mpi_env.h"
#include "emu/units.h"

namespace emu::coll {
namespace {

// Per rank: sent, received, the declared two; between nodes: sent, received, the declared two (kNotStated where the
// algorithm states none).
constexpr int kTotals = 8;
constexpr uint64_t kNotStated = ~uint64_t{0};

struct Settings {
  std::string kind = "all_reduce";
  std::string algorithm = "ring";
  size_t count = 8;
  std::string dtype = "float32";
  int root = 0;
  size_t slice_bytes = 4 << 20;
  std::string trace;
  std::string svg;
  std::string html;
  // --cost
  bool cost = false;
  int ranks = 0;                 // 0: the world's size
  double alpha_us = 5;           // illustrative round figures for a GPU link; coll-perf --fit measures a real one
  double bandwidth = 20;         // GB/s
  double reduce_bandwidth = 40;  // GB/s
  std::string link;              // coll-perf's JSON with a "fit"
  std::string hardware;          // a description (emu/hardware.h): its intra-node link, or its network
  bool across_nodes = false;
  // Nodes: L consecutive ranks each (0: one node), for the run (the hierarchical all-reduce, the bytes between nodes)
  // and for --cost, whose network is --hardware's or --net-alpha-us/--net-bandwidth.
  int ranks_per_node = 0;
  double net_alpha_us = 0;
  double net_bandwidth = 0;  // GB/s; 0: not given
  // --tp-layer
  bool tp_layer = false;
  teach::LayerShape layer;
};

// The link of --cost and what to call it.
struct NamedLink {
  LinkModel model;
  std::string label;
};

NamedLink link_model(const Settings& settings) {
  if (!settings.hardware.empty()) {
    // A step's latency and the link's rate each way; a reduction reads two operands and writes one, at the HBM's
    // rate.
    const Hardware hardware = find_hardware(settings.hardware);
    const LinkSpec& link = settings.across_nodes ? hardware.inter_node : hardware.intra_node;
    return {{link.step_latency_us * 1e-6, 1 / (link.gb_per_s_per_direction * 1e9), 3 / (hardware.hbm_gb_per_s * 1e9)},
            fmt::format("{} {}: {} (reduction at a third of the HBM rate)", hardware.name,
                        settings.across_nodes ? "between nodes" : "within a node", link.link)};
  }
  if (!settings.link.empty()) {
    std::ifstream in(settings.link);
    if (!in) throw InputError(fmt::format("--link {}: cannot read the file", settings.link));
    const nlohmann::json perf = nlohmann::json::parse(in, nullptr, false);
    if (perf.is_discarded() || !perf.contains("fit") || !perf["fit"].is_object()) {
      throw InputError(
          fmt::format("--link {}: not coll-perf's JSON with a \"fit\" (run coll-perf --fit --json)", settings.link));
    }
    const nlohmann::json& fit = perf["fit"];
    return {{fit.value("alpha_s", 0.0), fit.value("beta_s_per_byte", 0.0), fit.value("gamma_s_per_byte", 0.0)},
            fmt::format("fitted by coll-perf ({})", settings.link)};
  }
  const auto positive = [](double value, std::string_view flag) {
    if (!(value > 0)) throw InputError(fmt::format("{} {}: expected a number above 0", flag, value));
    return value;
  };
  return {{positive(settings.alpha_us, "--alpha-us") * 1e-6, 1e-9 / positive(settings.bandwidth, "--bandwidth"),
           1e-9 / positive(settings.reduce_bandwidth, "--reduce-bandwidth")},
          "as given (--alpha-us, --bandwidth, --reduce-bandwidth)"};
}

// The network of --cost with --ranks-per-node: --hardware's, else --net-alpha-us and --net-bandwidth.
NamedLink network_model(const Settings& settings, const NamedLink& node) {
  if (!settings.hardware.empty()) {
    Settings across = settings;
    across.across_nodes = true;
    return link_model(across);
  }
  if (!(settings.net_bandwidth > 0) || !(settings.net_alpha_us > 0)) {
    throw InputError(
        fmt::format("--ranks-per-node {} with --cost: the network between nodes is needed too; give "
                    "--hardware NAME, or --net-alpha-us and --net-bandwidth (above 0)",
                    settings.ranks_per_node));
  }
  return {{settings.net_alpha_us * 1e-6, 1e-9 / settings.net_bandwidth, node.model.gamma},
          "as given (--net-alpha-us, --net-bandwidth)"};
}

// The cost model's table: each of the kind's algorithms (MPI's own has no stated cost) at payloads from 256 B to
// 1 GiB, the fastest marked, then the crossovers. Over several nodes (fabric.ranks_per_node below n) the
// hierarchical algorithm's inter-node part is charged at the network and the flat ones wholly at it (cost.h).
void print_cost_table(CollectiveKind kind, int n, const NamedLink& named, const Fabric& fabric,
                      const NamedLink& network) {
  const int per_node = fabric.ranks_per_node;
  const bool nodes = node_size(per_node, n) < n;
  std::vector<const Algorithm*> chosen;
  std::string left_out;
  for (const Algorithm* algorithm : algorithms_for(kind)) {
    if (algorithm->cost == nullptr) continue;
    try {
      const Cost cost = algorithm->cost(1, n, per_node);
      if (cost.split && !nodes) {
        left_out +=
            fmt::format("  {:<13} left out: on one node it is the ring (give --ranks-per-node)\n", algorithm->name);
        continue;
      }
    } catch (const InputError& error) {
      left_out += fmt::format("  {:<13} left out: {}\n", algorithm->name, error.what());
      continue;
    }
    chosen.push_back(algorithm);
  }
  if (nodes) {
    std::printf(
        "%s on %d ranks, %d nodes of %d, α-β-γ model\nwithin a node: %s\n  link: %s\nbetween nodes: %s\n"
        "  link: %s\n",
        std::string(kind_name(kind)).c_str(), n, n / node_size(per_node, n), node_size(per_node, n),
        describe(fabric.node).c_str(), named.label.c_str(), describe(fabric.network).c_str(), network.label.c_str());
  } else {
    std::printf("%s on %d ranks, α-β-γ model: %s\nlink: %s\n", std::string(kind_name(kind)).c_str(), n,
                describe(fabric.node).c_str(), named.label.c_str());
  }
  for (const Algorithm* algorithm : chosen) {
    std::printf("  %-13s %s\n", std::string(algorithm->name).c_str(),
                std::string(algorithm->cost(1, n, per_node).formula).c_str());
  }
  std::fputs(left_out.c_str(), stdout);
  std::printf("\n%12s", "S");
  for (const Algorithm* algorithm : chosen) std::printf(" %13s", (std::string(algorithm->name) + " (us)").c_str());
  std::printf("  fastest\n");
  for (double s = 256; s <= double(kGiB); s *= 4) {
    std::printf("%12s", format_bytes(static_cast<uint64_t>(s)).c_str());
    const Algorithm* fastest = nullptr;
    double best = 0;
    for (const Algorithm* algorithm : chosen) {
      const double t = predicted_seconds(algorithm->cost(s, n, per_node), fabric, n);
      std::printf(" %13.1f", t * 1e6);
      if (fastest == nullptr || t < best) {
        fastest = algorithm;
        best = t;
      }
    }
    std::printf("  %s\n", std::string(fastest->name).c_str());
  }
  std::printf("\n");
  for (size_t a = 0; a < chosen.size(); ++a) {
    for (size_t b = a + 1; b < chosen.size(); ++b) {
      const auto cross = crossover(*chosen[a], *chosen[b], n, fabric);
      if (cross) {
        std::printf("%s is faster below %s, %s above\n", std::string(cross->below->name).c_str(),
                    format_bytes(static_cast<uint64_t>(cross->payload)).c_str(),
                    std::string(cross->above->name).c_str());
      } else {
        const bool a_first = predicted_seconds(chosen[a]->cost(1, n, per_node), fabric, n) <=
                             predicted_seconds(chosen[b]->cost(1, n, per_node), fabric, n);
        std::printf("%s is never slower than %s: no more rounds and no more bytes\n",
                    std::string(chosen[a_first ? a : b]->name).c_str(),
                    std::string(chosen[a_first ? b : a]->name).c_str());
      }
    }
  }
  if (nodes) {
    std::printf(
        "(a flat algorithm is charged wholly at the network: each of its steps waits on a message between nodes; "
        "no contention, nor the pipelining of NCCL's trees)\n");
  } else {
    std::printf(
        "(the model sees one link per pair of ranks: neither the topology, where a ring's neighbours share the "
        "fastest links, nor contention, nor the pipelining of NCCL's trees)\n");
  }
}

// Gathers every rank's log on rank 0 (as JSON text).
teach::Logs gather_logs(const std::vector<StepRecord>& mine, int rank, int size) {
  const std::string text = teach::to_json(mine).dump();
  int length = static_cast<int>(text.size());
  std::vector<int> lengths(static_cast<size_t>(size));
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<int> offsets(static_cast<size_t>(size), 0);
  for (size_t r = 1; r < offsets.size(); ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::string all(rank == 0 ? static_cast<size_t>(offsets.back() + lengths.back()) : 0, '\0');
  MPI_Gatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  teach::Logs logs;
  if (rank != 0) return logs;
  for (size_t r = 0; r < lengths.size(); ++r) {
    logs.push_back(teach::from_json(
        nlohmann::json::parse(all.substr(static_cast<size_t>(offsets[r]), static_cast<size_t>(lengths[r])))));
  }
  return logs;
}

std::string partition_text(CollectiveKind kind, size_t count, int size, DType dtype) {
  Blocks blocks;
  if (kind == CollectiveKind::kAllReduce)
    blocks = Blocks::even(count, size);
  else if (kind == CollectiveKind::kReduceScatter || kind == CollectiveKind::kAllGather ||
           kind == CollectiveKind::kAllToAll)
    blocks = Blocks::uniform(count, size);
  else
    return "";
  std::string out = "blocks:";
  for (size_t b = 0; b < blocks.count.size(); ++b) {
    out += fmt::format(" {}=[{},{})", b, blocks.offset[b], blocks.offset[b] + blocks.count[b]);
  }
  return out + fmt::format(" (elements of {} B)\n", dtype_size(dtype));
}

// --svg and --html: the pictures of the same replay the contents text is printed from; nothing is written when the
// exchanges cannot be placed (there is nothing true to draw).
void write_pictures(const Settings& settings, const teach::Replay& replay, const teach::PictureText& text) {
  if (settings.svg.empty() && settings.html.empty()) return;
  if (replay.frames.empty()) {
    std::printf("pictures: not written (the buffer contents cannot be shown for this run)\n");
    return;
  }
  if (!settings.svg.empty()) {
    write_file_atomically(settings.svg, teach::format_svg(replay, text));
    std::printf("picture: %s\n", settings.svg.c_str());
  }
  if (!settings.html.empty()) {
    write_file_atomically(settings.html, teach::format_html(replay, text));
    std::printf("page: %s (open in a browser; the slider steps through the rounds)\n", settings.html.c_str());
  }
}

// Rank 0's report of the run: the rounds, the contents, the totals, the cost against the model, the files.
// Returns the exit code its verdicts call for.
int report(const Settings& settings, CollectiveKind kind, DType dtype, const Algorithm& algorithm, const Call& call,
           const std::vector<uint64_t>& totals, const teach::Logs& logs, uint64_t wrong, int world) {
  const uint64_t payload = payload_bytes(call, world);
  std::printf("%s with %s on %d ranks: %s of %s, S = %s\n%s", std::string(kind_name(kind)).c_str(),
              std::string(algorithm.name).c_str(), world, fmt::format("{} elements", settings.count).c_str(),
              std::string(dtype_name(dtype)).c_str(), format_bytes(payload).c_str(),
              partition_text(kind, settings.count, world, dtype).c_str());
  std::printf("%s: %s\n\n", std::string(algorithm.name).c_str(), std::string(algorithm.summary).c_str());
  const auto rounds = teach::logical_rounds(logs);
  std::fputs(teach::format_steps(logs, rounds, dtype_size(dtype)).c_str(), stdout);
  const teach::Layout layout{kind, settings.count, dtype_size(dtype), settings.root};
  const teach::Replay replay = teach::replay_contents(layout, logs, rounds);
  const teach::Contents contents = teach::format_contents(replay);
  if (!contents.error.empty()) std::printf("\nbuffer contents: cannot be shown: %s\n", contents.error.c_str());
  if (!contents.text.empty()) {
    std::printf(
        "\nbuffer contents (blocks a, b, ...; a0+a3: block a summed over the inputs of r0 and r3;%s ·: not "
        "yet received)\n%sat the end: %s\n",
        world > 4 ? " a2..a5: over r2 to r5;" : "", contents.text.c_str(),
        contents.verdict.empty() ? ("as " + std::string(kind_name(kind)) + " defines").c_str()
                                 : ("DISAGREES: " + contents.verdict).c_str());
  }
  const int per_node = node_size(settings.ranks_per_node, world);
  const bool nodes = per_node < world;
  std::printf(
      "\nper rank: sent / received (declared by the algorithm)%s\n",
      nodes ? fmt::format("; of which between nodes ({} nodes of {} ranks)", world / per_node, per_node).c_str() : "");
  std::string between_disagrees;
  for (int r = 0; r < world; ++r) {
    const uint64_t* t = &totals[kTotals * static_cast<size_t>(r)];
    std::printf("  r%-3d %s / %s (%s / %s)", r, format_bytes(t[0]).c_str(), format_bytes(t[1]).c_str(),
                format_bytes(t[2]).c_str(), format_bytes(t[3]).c_str());
    if (nodes) {
      const bool stated = t[6] != kNotStated;
      std::printf("; %s / %s (%s)", format_bytes(t[4]).c_str(), format_bytes(t[5]).c_str(),
                  stated ? fmt::format("{} / {}", format_bytes(t[6]), format_bytes(t[7])).c_str() : "not stated");
      if (stated && (t[4] != t[6] || t[5] != t[7])) between_disagrees += fmt::format(" r{}", r);
    }
    std::printf("\n");
  }
  if (!between_disagrees.empty()) {
    std::printf("bytes between nodes: DISAGREE with the declared on%s\n", between_disagrees.c_str());
  }
  std::string disagreement;
  if (algorithm.cost != nullptr) {
    const auto bytes = static_cast<double>(payload);
    const Cost model =
        algorithm.sliced_cost != nullptr
            ? algorithm.sliced_cost(bytes, world, settings.ranks_per_node, static_cast<double>(settings.slice_bytes))
            : algorithm.cost(bytes, world, settings.ranks_per_node);
    const teach::ExecutedCost executed = teach::executed_cost(logs, rounds);
    disagreement = teach::cost_disagreement(model, executed, dtype_size(dtype));
    std::printf(
        "\ncost (α-β-γ): %s\n  executed: %d rounds, %s on the busiest rank's critical path, %s reduced\n"
        "  model:    %g rounds, %.1f B, %.1f B: %s\n",
        std::string(model.formula).c_str(), executed.rounds, format_bytes(executed.bytes).c_str(),
        format_bytes(executed.reduced).c_str(), model.rounds, model.bytes, model.reduced,
        disagreement.empty() ? "agrees" : ("DISAGREES: " + disagreement).c_str());
  }
  // --slice below the payload cuts messages into pieces, which the contents view and the one-piece α-β-γ model do
  // not follow: shown, not held against the run.
  const bool sliced = settings.slice_bytes < payload;
  if (sliced && (!disagreement.empty() || !contents.verdict.empty())) {
    std::printf(
        "note: --slice %zu B cuts the %s payload into pieces; the buffer contents and the cost model follow one "
        "piece, so they are shown and not checked\n",
        settings.slice_bytes, format_bytes(payload).c_str());
  }
  std::printf("result: %s\n", wrong == 0 ? "correct on every rank" : fmt::format("{} wrong elements", wrong).c_str());
  if (!settings.trace.empty()) {
    const std::string title = fmt::format("{} {} on {} ranks", kind_name(kind), algorithm.name, world);
    write_file_atomically(settings.trace, teach::chrome_trace(logs, rounds, title).dump(1) + "\n");
    std::printf("trace: %s (open at ui.perfetto.dev)\n", settings.trace.c_str());
  }
  write_pictures(settings, replay,
                 {fmt::format("{} with {} on {} ranks: {} elements of {}, S = {}", kind_name(kind), algorithm.name,
                              world, settings.count, dtype_name(dtype), format_bytes(payload)),
                  std::string(algorithm.summary)});
  return wrong == 0 && (sliced || (disagreement.empty() && contents.verdict.empty())) && contents.error.empty() &&
                 between_disagrees.empty()
             ? kExitOk
             : kExitExpectationFailed;
}

// --tp-layer: every rank runs one tensor-parallel layer's collectives; rank 0 prints what each moved.
int teach_tp_layer(const MpiSession& mpi, const Settings& settings) {
  teach::check_layer_shape(settings.layer, mpi.world());
  MemoryPool::Options memory;
  memory.rank = mpi.rank();
  auto device = make_cpu_device(memory);
  CommunicatorOptions options;
  options.slice_bytes = settings.slice_bytes;
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, *device, "tensor-parallel", options);
  comm->set_algorithm(CollectiveKind::kAllReduce, settings.algorithm);
  const teach::LayerMeasured measured = teach::run_layer(*comm, *device, settings.layer, mpi.rank());
  const size_t calls = measured.sent.size();
  std::vector<uint64_t> all(calls * static_cast<size_t>(mpi.world()));
  MPI_Gather(measured.sent.data(), static_cast<int>(calls), MPI_UINT64_T, all.data(), static_cast<int>(calls),
             MPI_UINT64_T, 0, MPI_COMM_WORLD);
  uint64_t wrong = measured.wrong;
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  int verdict = wrong == 0 ? kExitOk : kExitExpectationFailed;
  if (mpi.rank() == 0) {
    std::vector<std::vector<uint64_t>> sent(static_cast<size_t>(mpi.world()));
    for (size_t r = 0; r < sent.size(); ++r) sent[r].assign(all.begin() + r * calls, all.begin() + (r + 1) * calls);
    bool agrees = true;
    const std::string algorithm(comm->algorithm(CollectiveKind::kAllReduce).name);
    std::fputs(teach::format_layer(settings.layer, mpi.world(), algorithm, sent, wrong, agrees).c_str(), stdout);
    // Only the ring is held to the ring's closed form; another --algorithm is shown beside it.
    if (!agrees && algorithm == "ring") verdict = kExitExpectationFailed;
  }
  MPI_Allreduce(MPI_IN_PLACE, &verdict, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return verdict;
}

int run(const MpiSession& mpi, int argc, char** argv) {
  Settings settings;
  CLI::App app{"coll-teach: one collective, step by step"};
  app.add_option("-k,--kind", settings.kind,
                 "all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all, barrier");
  app.add_option("-a,--algorithm", settings.algorithm, "ring, rhd, tree, pairwise, dissemination (see --list)");
  app.add_option("-c,--count", settings.count,
                 "elements: the buffer (all_reduce, broadcast, reduce) or each rank's block (the others)");
  app.add_option("-d,--dtype", settings.dtype, "float32 or bfloat16");
  app.add_option("-r,--root", settings.root, "root of broadcast and reduce");
  app.add_option("--slice", settings.slice_bytes, "largest message, bytes");
  app.add_option("--trace", settings.trace, "write a Chrome trace (Perfetto) to this file");
  app.add_option("--svg", settings.svg, "write the rounds as a picture (SVG): ranks, messages, buffer contents");
  app.add_option("--html", settings.html, "write the picture as a self-contained HTML page with a step slider");
  bool list = false;
  app.add_flag("--list", list, "list the algorithms of every kind");
  app.add_flag("--cost", settings.cost,
               "print the α-β-γ cost model of the kind's algorithms (time per size, crossovers) instead of running");
  app.add_option("--ranks", settings.ranks, "ranks for --cost (default: this run's)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--alpha-us", settings.alpha_us, "--cost: latency per message, microseconds (default 5)");
  app.add_option("--bandwidth", settings.bandwidth, "--cost: link bandwidth, GB/s (default 20)");
  app.add_option("--reduce-bandwidth", settings.reduce_bandwidth, "--cost: reduction rate, GB/s (default 40)");
  app.add_option("--link", settings.link, "--cost: the link fitted by coll-perf --fit --json FILE");
  app.add_option("--hardware", settings.hardware,
                 "--cost: a GPU and its links, " + hardware_names() + ", or a JSON file in their form");
  app.add_flag("--across-nodes", settings.across_nodes, "--cost with --hardware: the network between nodes");
  app.add_option("--ranks-per-node", settings.ranks_per_node,
                 "nodes of this many consecutive ranks (0: one node): the hierarchical all-reduce's nodes, the bytes "
                 "between nodes; with --cost, the two links (--hardware's, or --net-alpha-us and --net-bandwidth)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--net-alpha-us", settings.net_alpha_us, "--cost --ranks-per-node: latency between nodes, us");
  app.add_option("--net-bandwidth", settings.net_bandwidth, "--cost --ranks-per-node: bandwidth between nodes, GB/s");
  app.add_flag("--tp-layer", settings.tp_layer,
               "teach one tensor-parallel transformer layer over the ranks: its column- and row-parallel matmuls and "
               "the collectives it makes, run with their bytes");
  app.add_option("--batch", settings.layer.batch, "--tp-layer: micro-batch b (default 1)");
  app.add_option("--seq", settings.layer.seq, "--tp-layer: sequence length s (default 8)");
  app.add_option("--hidden", settings.layer.hidden, "--tp-layer: hidden size h (default 16)");
  app.add_flag("--sequence-parallel", settings.layer.sequence_parallel,
               "--tp-layer: Megatron's sequence parallelism (reduce-scatter and all-gather in place of each "
               "all-reduce)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (mpi.rank() == 0) app.exit(error);
    return error.get_exit_code() == 0 ? kExitOk : kExitBadInput;
  }
  if (list) {
    for (const Algorithm* algorithm : algorithms()) {
      if (mpi.rank() == 0) {
        std::printf("%-15s %-14s %s\n", std::string(kind_name(algorithm->kind)).c_str(),
                    std::string(algorithm->name).c_str(), std::string(algorithm->summary).c_str());
      }
    }
    return kExitOk;
  }
  const auto kind = parse_kind(settings.kind);
  const auto dtype = parse_dtype(settings.dtype);
  if (!kind || !is_collective(*kind)) throw InputError(fmt::format("--kind {}: not a collective", settings.kind));
  if (!dtype) throw InputError(fmt::format("--dtype {}: expected float32 or bfloat16", settings.dtype));
  if (settings.tp_layer) {
    if (settings.cost) throw InputError("--tp-layer runs one layer's collectives, --cost none: accepted: one of them");
    settings.layer.dtype = *dtype;
    return teach_tp_layer(mpi, settings);
  }
  if (settings.cost) {
    const int n = settings.ranks > 0 ? settings.ranks : mpi.world();
    if (settings.across_nodes && node_size(settings.ranks_per_node, n) < n) {
      throw InputError(
          "--across-nodes charges every rank at the network; --ranks-per-node keeps the two links apart: "
          "give one of them");
    }
    const NamedLink link = link_model(settings);
    const NamedLink network = node_size(settings.ranks_per_node, n) < n ? network_model(settings, link) : link;
    if (mpi.rank() == 0) {
      print_cost_table(*kind, n, link, Fabric{link.model, network.model, settings.ranks_per_node, std::nullopt},
                       network);
    }
    return kExitOk;
  }
  if (settings.root < 0 || settings.root >= mpi.world()) {
    throw InputError(fmt::format("--root {}: expected a rank of 0..{}", settings.root, mpi.world() - 1));
  }

  MemoryPool::Options memory;
  memory.rank = mpi.rank();
  auto device = make_cpu_device(memory);
  CommunicatorOptions options;
  options.slice_bytes = settings.slice_bytes;
  options.ranks_per_node = settings.ranks_per_node;
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, *device, "world", options);
  comm->set_algorithm(*kind, settings.algorithm);
  const Algorithm& algorithm = comm->algorithm(*kind);

  VerifiedCase c(*device, *kind, *dtype, ReduceOp::kSum, settings.count, {}, settings.root, false, mpi.rank(),
                 mpi.world());
  std::vector<StepRecord> mine;
  comm->set_record(&mine);
  comm->run(c.call());
  comm->set_record(nullptr);
  uint64_t wrong = c.wrong();
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  const Expectation declared =
      algorithm.expect(c.call(), mpi.rank(), mpi.world(), settings.slice_bytes, settings.ranks_per_node);
  const LedgerEntry entry = comm->ledger().total(*kind);
  const Traffic between = declared.between_nodes.value_or(Traffic{kNotStated, kNotStated});
  std::vector<uint64_t> mine_totals{
      entry.moved.sent,         entry.moved.received,         declared.traffic.sent, declared.traffic.received,
      entry.between_nodes.sent, entry.between_nodes.received, between.sent,          between.received};
  std::vector<uint64_t> totals(kTotals * static_cast<size_t>(mpi.world()));
  MPI_Gather(mine_totals.data(), kTotals, MPI_UINT64_T, totals.data(), kTotals, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  const teach::Logs logs = gather_logs(mine, mpi.rank(), mpi.world());
  // Rank 0 alone holds every rank's log and so the verdicts on the contents and the cost; every rank exits with
  // the worst of them and of the results (a file that cannot be written is bad input).
  int verdict = wrong == 0 ? kExitOk : kExitExpectationFailed;
  if (mpi.rank() == 0) {
    try {
      verdict =
          std::max(verdict, report(settings, *kind, *dtype, algorithm, c.call(), totals, logs, wrong, mpi.world()));
    } catch (const InputError& error) {
      std::fprintf(stderr, "coll-teach: error: %s\n", error.what());
      verdict = kExitBadInput;
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, &verdict, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return verdict;
}

}  // namespace
}  // namespace emu::coll

int main(int argc, char** argv) {
  emu::MpiSession mpi(argc, argv);
  return emu::run_guarded(mpi, "coll-teach", [&] { return emu::coll::run(mpi, argc, argv); });
}
