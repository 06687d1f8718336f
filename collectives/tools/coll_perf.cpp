// coll-perf: bandwidth of every collective algorithm, in the style of nccl-tests.
//
//   mpirun -np 8 bin/coll-perf --kind all_reduce -b 1K -e 64M -f 4 -w 5 -n 20 --json perf.json
//
// For each kind, size and algorithm (ours and MPI's own): warm-up calls, then timed iterations, each started
// together after a barrier and timed as the slowest rank saw it; the table shows the median. Iterations alternate
// between the algorithms, in a rotating order, so that changes in the machine's load hit all of them alike.
// algbw = S / time; busbw = algbw * factor, with nccl-tests' factors (all_reduce 2(N-1)/N; reduce_scatter,
// all_gather, all_to_all (N-1)/N; broadcast, reduce 1), so that busbw compares with the link's peak whatever the
// rank count. Every size is then run once more on verifiable inputs and #wrong counts the elements, over all
// ranks, that differ from the exact answer; the exit code is 1 if any does.
//
// --fit fits the α-β-γ model (collectives/cost.h) to the rows of our algorithms — one latency α, one link rate
// 1/β and one reduction rate 1/γ for the machine — and prints how well each algorithm's closed form then predicts
// its own measurements; with --json the fit is written too, for coll-teach --cost --link.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "collectives/cost.h"
#include "collectives/mpi/mpi_communicator.h"
#include "collectives/verify.h"
#include "emu/check.h"
#include "emu/mpi_env.h"
#include "emu/units.h"

namespace emu::coll {
namespace {

struct Settings {
  std::vector<std::string> kinds{"all_reduce"};
  std::vector<std::string> algorithms;  // empty: all of each kind
  std::string min_bytes = "1K";
  std::string max_bytes = "64M";
  double factor = 4;
  int warmup = 5;
  int iterations = 20;
  std::string dtype = "float32";
  std::string op = "sum";
  bool in_place = false;
  size_t slice_bytes = 4 << 20;
  std::string json;
  bool fit = false;
};

struct Row {
  CollectiveKind kind;
  std::string algorithm;
  uint64_t bytes;
  size_t count;
  double seconds;
  double algbw;
  double busbw;
  uint64_t wrong;
};

// emu's sizes (64MiB, 100MB: emu/units.h), plus nccl-tests' -b/-e forms: a byte count, or K, M, G as powers of 2.
uint64_t parse_size(const std::string& text) {
  if (const std::optional<uint64_t> bytes = parse_bytes(text)) return *bytes;
  const size_t digits = text.find_first_not_of("0123456789");
  const std::map<std::string, uint64_t> short_units{{"", 1}, {"K", kKiB}, {"M", kMiB}, {"G", kGiB}};
  const auto unit = short_units.find(digits == std::string::npos ? "" : text.substr(digits));
  if (digits != 0 && unit != short_units.end()) {
    const uint64_t value = std::stoull(text.substr(0, digits));
    if (value > 0 && value <= (uint64_t{1} << 50) / unit->second) return value * unit->second;
  }
  throw InputError(
      fmt::format("size '{}' is not a size; accepted: 512, 4K, 64M, 1G (powers of 2, as nccl-tests), or "
                  "with a unit: 64MiB, 100MB, 1GiB, 512B (GB = 10^9, GiB = 2^30), from 1 byte to 1 PiB",
                  text));
}

// Elements per call for a payload of `bytes` (S): per rank for reduce_scatter / all_gather, per peer for
// all_to_all, whole otherwise. Rounded down to a whole number per rank.
size_t count_for(CollectiveKind kind, uint64_t bytes, DType dtype, int size) {
  const uint64_t elements = bytes / dtype_size(dtype);
  const bool per_rank =
      kind == CollectiveKind::kReduceScatter || kind == CollectiveKind::kAllGather || kind == CollectiveKind::kAllToAll;
  return static_cast<size_t>(per_rank ? elements / static_cast<uint64_t>(size) : elements);
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// All algorithms of one kind at one size. Iterations go round-robin over the algorithms, in a rotating order, so
// a change in the machine's load (other processes) hits them all alike rather than whichever happened to run then.
std::vector<Row> measure(Communicator& comm, const std::vector<const Algorithm*>& chosen, uint64_t bytes,
                         const Settings& settings, DType dtype, ReduceOp op) {
  const int size = comm.size();
  const CollectiveKind kind = chosen.front()->kind;
  const size_t count = count_for(kind, bytes, dtype, size);
  // One set of buffers for all algorithms, so that none is favoured by where its memory happens to lie.
  VerifiedCase verified(comm.device(), kind, dtype, op, count, {}, 0, settings.in_place, comm.rank(), size);
  const auto call = [&](size_t a) {
    comm.set_algorithm(kind, chosen[a]->name);
    comm.run(verified.call());
  };
  for (int i = 0; i < settings.warmup; ++i) {
    for (size_t a = 0; a < chosen.size(); ++a) call(a);
  }
  // times[a * iterations + i]
  const auto iterations = static_cast<size_t>(settings.iterations);
  std::vector<double> times(chosen.size() * iterations);
  for (size_t i = 0; i < iterations; ++i) {
    // Iteration i starts with algorithm i mod A, so that none always runs right after another.
    for (size_t k = 0; k < chosen.size(); ++k) {
      const size_t a = (i + k) % chosen.size();
      MPI_Barrier(MPI_COMM_WORLD);
      const auto start = std::chrono::steady_clock::now();
      call(a);
      times[a * iterations + i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  }
  // Each iteration takes as long as its slowest rank.
  MPI_Allreduce(MPI_IN_PLACE, times.data(), static_cast<int>(times.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  std::vector<Row> rows;
  for (size_t a = 0; a < chosen.size(); ++a) {
    verified.reset();
    call(a);
    uint64_t wrong = verified.wrong();
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    const uint64_t payload = payload_bytes(verified.call(), size);
    const double seconds =
        median(std::vector<double>(times.begin() + static_cast<std::ptrdiff_t>(a * iterations),
                                   times.begin() + static_cast<std::ptrdiff_t>((a + 1) * iterations)));
    const double algbw = seconds > 0 ? static_cast<double>(payload) / seconds / 1e9 : 0;
    rows.push_back(
        Row{kind, std::string(chosen[a]->name), payload, count, seconds, algbw, algbw * bus_factor(kind, size), wrong});
  }
  return rows;
}

void print_header(CollectiveKind kind, int size, const Settings& settings) {
  std::printf("#\n# %s, %d ranks, %s, op %s, %s, warm-up %d, %d iterations (median), slice %zu B\n#\n",
              std::string(kind_name(kind)).c_str(), size, settings.dtype.c_str(), settings.op.c_str(),
              settings.in_place ? "in place" : "out of place", settings.warmup, settings.iterations,
              settings.slice_bytes);
  std::printf("%12s %12s %9s %5s %14s %12s %12s %12s %8s\n", "size (B)", "count", "type", "op", "algorithm",
              "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong");
}

// The kind named `kind_text` and the algorithms of it to run: those --algorithms names, or all of the kind.
std::pair<CollectiveKind, std::vector<const Algorithm*>> chosen_algorithms(const std::string& kind_text,
                                                                           const Settings& settings) {
  const auto kind = parse_kind(kind_text);
  if (!kind || !is_collective(*kind) || *kind == CollectiveKind::kBarrier) {
    throw InputError(
        fmt::format("--kind {}: expected all_reduce, reduce_scatter, all_gather, broadcast, reduce "
                    "or all_to_all",
                    kind_text));
  }
  std::vector<const Algorithm*> chosen;
  for (const Algorithm* algorithm : algorithms_for(*kind)) {
    if (settings.algorithms.empty() || std::find(settings.algorithms.begin(), settings.algorithms.end(),
                                                 algorithm->name) != settings.algorithms.end()) {
      chosen.push_back(algorithm);
    }
  }
  if (chosen.empty())
    throw InputError(
        fmt::format("--algorithms: none of them is a {} algorithm ({})", kind_text, algorithm_names(*kind)));
  return {*kind, chosen};
}

void print_row(const Row& row, DType dtype, const Settings& settings) {
  std::printf("%12llu %12zu %9s %5s %14s %12.1f %12.3f %12.3f %8llu\n", static_cast<unsigned long long>(row.bytes),
              row.count, std::string(dtype_name(dtype)).c_str(), settings.op.c_str(), row.algorithm.c_str(),
              row.seconds * 1e6, row.algbw, row.busbw, static_cast<unsigned long long>(row.wrong));
  std::fflush(stdout);
}

// Our algorithms against MPI's own at the largest size of each kind.
void print_against_mpi(const std::vector<Row>& rows) {
  std::printf("#\n");
  for (const Row& row : rows) {
    if (row.algorithm == "mpi" || row.bytes != rows.back().bytes) continue;
    for (const Row& reference : rows) {
      if (reference.kind == row.kind && reference.bytes == row.bytes && reference.algorithm == "mpi") {
        std::printf("# %s %s at %llu B: busbw %.3f GB/s = %.2f x MPI's %.3f GB/s\n",
                    std::string(kind_name(row.kind)).c_str(), row.algorithm.c_str(),
                    static_cast<unsigned long long>(row.bytes), row.busbw, row.busbw / reference.busbw,
                    reference.busbw);
      }
    }
  }
}

// The fit over the rows of our algorithms, and per algorithm the median and worst relative error of its model.
nlohmann::json fit_rows(const std::vector<Row>& rows, int ranks) {
  std::vector<Sample> samples;
  std::vector<const Algorithm*> of;
  for (const Row& row : rows) {
    const Algorithm* algorithm = find_algorithm(row.kind, row.algorithm);
    if (algorithm == nullptr || algorithm->cost == nullptr || row.seconds <= 0) continue;
    samples.push_back({algorithm->cost(static_cast<double>(row.bytes), ranks, 0), row.seconds});
    of.push_back(algorithm);
  }
  nlohmann::json out;
  if (samples.empty()) return out;
  const Fit fit = fit_link(samples);
  out = {{"alpha_s", fit.link.alpha},
         {"beta_s_per_byte", fit.link.beta},
         {"gamma_s_per_byte", fit.link.gamma},
         {"rows", samples.size()},
         {"statistic", "relative error (predicted - measured) / measured"}};
  std::printf("#\n# α-β-γ fit over %zu rows of our algorithms: %s\n", samples.size(), describe(fit.link).c_str());
  std::printf("# each algorithm's model against its own rows, (predicted - measured) / measured:\n");
  std::vector<const Algorithm*> seen;
  for (const Algorithm* algorithm : of) {
    if (std::find(seen.begin(), seen.end(), algorithm) != seen.end()) continue;
    seen.push_back(algorithm);
    std::vector<double> errors;
    for (size_t i = 0; i < of.size(); ++i) {
      if (of[i] == algorithm) errors.push_back(fit.relative_errors[i]);
    }
    const double worst =
        *std::max_element(errors.begin(), errors.end(), [](double a, double b) { return std::abs(a) < std::abs(b); });
    std::vector<double> magnitudes(errors.size());
    std::transform(errors.begin(), errors.end(), magnitudes.begin(), [](double e) { return std::abs(e); });
    const double typical = median(magnitudes);
    std::printf("#   %-14s %-9s median |error| %5.1f%%, worst %+6.1f%%\n",
                std::string(kind_name(algorithm->kind)).c_str(), std::string(algorithm->name).c_str(), 100 * typical,
                100 * worst);
    out["per_algorithm"].push_back({{"kind", kind_name(algorithm->kind)},
                                    {"algorithm", algorithm->name},
                                    {"median_abs_relative_error", typical},
                                    {"worst_relative_error", worst}});
  }
  return out;
}

void write_json(const Settings& settings, int ranks, const std::vector<Row>& rows, const nlohmann::json& fit) {
  nlohmann::json out;
  out["ranks"] = ranks;
  out["dtype"] = settings.dtype;
  out["op"] = settings.op;
  out["in_place"] = settings.in_place;
  out["warmup"] = settings.warmup;
  out["iterations"] = settings.iterations;
  out["statistic"] = "median over iterations of the slowest rank's time";
  out["slice_bytes"] = settings.slice_bytes;
  for (const Row& row : rows) {
    out["rows"].push_back({{"kind", kind_name(row.kind)},
                           {"algorithm", row.algorithm},
                           {"bytes", row.bytes},
                           {"count", row.count},
                           {"time_us", row.seconds * 1e6},
                           {"algbw_gbps", row.algbw},
                           {"busbw_gbps", row.busbw},
                           {"wrong", row.wrong}});
  }
  if (!fit.is_null()) out["fit"] = fit;
  std::ofstream(settings.json) << out.dump(2) << "\n";
}

int run(const MpiSession& mpi, int argc, char** argv) {
  Settings settings;
  CLI::App app{"coll-perf: bandwidth of the collective algorithms, nccl-tests style"};
  app.add_option("-k,--kind", settings.kinds, "collective kinds")->delimiter(',');
  app.add_option("-a,--algorithms", settings.algorithms, "algorithms to run (default: all of the kind)")
      ->delimiter(',');
  app.add_option("-b,--min-bytes", settings.min_bytes,
                 "smallest payload S: 512, 4K, 64M, 1G (powers of 2, as nccl-tests) or 64MiB, 100MB (as emu)");
  app.add_option("-e,--max-bytes", settings.max_bytes, "largest payload S, in the same forms");
  app.add_option("-f,--factor", settings.factor, "size multiplier between rows")->check(CLI::Range(1.01, 1e6));
  app.add_option("-w,--warmup", settings.warmup, "warm-up calls per row")->check(CLI::NonNegativeNumber);
  app.add_option("-n,--iterations", settings.iterations, "timed calls per row")->check(CLI::PositiveNumber);
  app.add_option("-d,--dtype", settings.dtype, "float32 or bfloat16");
  app.add_option("-o,--op", settings.op, "sum, avg or max");
  app.add_flag("--in-place", settings.in_place, "run in place");
  app.add_option("--slice", settings.slice_bytes, "largest message of our algorithms, bytes");
  app.add_option("--json", settings.json, "also write the rows as JSON to this file");
  app.add_flag("--fit", settings.fit, "fit the α-β-γ cost model to our algorithms' rows and show how well it predicts");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (mpi.rank() == 0) app.exit(error);
    return error.get_exit_code() == 0 ? kExitOk : kExitBadInput;
  }
  const auto dtype = parse_dtype(settings.dtype);
  const auto op = parse_op(settings.op);
  if (!dtype || !op) {
    if (mpi.rank() == 0) std::fprintf(stderr, "coll-perf: error: --dtype float32|bfloat16, --op sum|avg|max\n");
    return kExitBadInput;
  }
  const uint64_t min_bytes = parse_size(settings.min_bytes);
  const uint64_t max_bytes = parse_size(settings.max_bytes);

  MemoryPool::Options memory;
  memory.rank = mpi.rank();
  memory.timeline = false;
  auto device = make_cpu_device(memory);
  CommunicatorOptions options = CommunicatorOptions::from_environment();
  options.slice_bytes = settings.slice_bytes;
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, *device, "world", options);

  std::vector<Row> rows;
  for (const std::string& kind_text : settings.kinds) {
    const auto [kind, chosen] = chosen_algorithms(kind_text, settings);
    if (mpi.rank() == 0) print_header(kind, mpi.world(), settings);
    for (double bytes = static_cast<double>(min_bytes); bytes <= static_cast<double>(max_bytes) * 1.0001;
         bytes *= settings.factor) {
      for (const Row& row : measure(*comm, chosen, static_cast<uint64_t>(bytes), settings, *dtype, *op)) {
        rows.push_back(row);
        if (mpi.rank() == 0) print_row(row, *dtype, settings);
      }
    }
  }

  uint64_t wrong = 0;
  for (const Row& row : rows) wrong += row.wrong;
  if (mpi.rank() == 0) {
    print_against_mpi(rows);
    const nlohmann::json fit = settings.fit ? fit_rows(rows, mpi.world()) : nlohmann::json();
    std::printf("# %s\n", wrong == 0 ? "all results correct" : fmt::format("{} wrong elements", wrong).c_str());
    if (!settings.json.empty()) write_json(settings, mpi.world(), rows, fit);
  }
  return wrong == 0 ? kExitOk : kExitExpectationFailed;
}

}  // namespace
}  // namespace emu::coll

int main(int argc, char** argv) {
  emu::MpiSession mpi(argc, argv);
  return emu::run_guarded(mpi, "coll-perf", [&] { return emu::coll::run(mpi, argc, argv); });
}
