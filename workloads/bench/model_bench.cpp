// Single-rank training-step throughput of the CPU model against OpenBLAS sgemm, measured in the same run.
//
// Model FLOPs per step (forward + backward, one micro-batch of T = b·s tokens):
//   6 · Ψ_mm · T + 12 · L · b · s² · h
// Ψ_mm counts the weights used in matrix products: the blocks' matrices and the LM head (V·h); the token embedding
// lookup, position table, norms and biases do no matrix products and are left out. 6 = 2 (multiply-add) × 3
// (forward; backward to inputs; backward to weights). The attention term is QKᵀ and P·V, 2·2·b·s²·d per head in
// forward (the full s × s square, as these kernels compute it), tripled for backward. Flash-style attention
// recomputes the scores in backward; that work is not counted, as in MFU accounting.
//
// The reference is sgemm on square 1024 × 1024 matrices with the same threads, measured again just before each
// case (this machine may be shared, so each case is compared with the sgemm rate of its own moment).
//
// The process keeps freed heap memory for reuse (mallopt below) instead of returning every large buffer to the
// OS and faulting it in again at the next step, as a GPU framework's caching allocator keeps device memory.
#include <cblas.h>
#include <fmt/format.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "emu/device.h"
#include "workloads/model/config.h"
#include "workloads/model/local_params.h"
#include "workloads/model/memory_terms.h"
#include "workloads/model/model.h"
#include "workloads/model/shrink.h"

namespace {

using emu::model::Attention;
using emu::model::ModelConfig;
using emu::model::ModelOptions;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Best GFLOP/s of sgemm on n × n × n over a few repetitions.
double sgemm_gflops(int n) {
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const auto start = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a.data(), n, b.data(), n, 0, c.data(), n);
    best = std::max(best, 2.0 * n * n * double(n) / seconds_since(start) / 1e9);
  }
  return best;
}

struct Case {
  const char* preset;
  int64_t k;
  int64_t seq;  // full-scale sequence before shrinking
  int64_t batch;
  ModelOptions options;
};

}  // namespace

// Usage: emu_model_bench [filter]: only the cases whose "preset dtype attention" line contains `filter`.
//        emu_model_bench --sgemm: the sgemm GFLOP/s alone, one number (scripts/bench-speed.py's machine bound).
int main(int argc, char** argv) {
  const std::string filter = argc > 1 ? argv[1] : "";
  if (filter == "--sgemm") {
    fmt::print("{:.1f}\n", sgemm_gflops(1024));
    return 0;
  }
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  const ModelOptions fp32_classic{emu::DType::kF32, Attention::kEager, false};
  const ModelOptions fp32_flash{emu::DType::kF32, Attention::kFlash, false};
  const ModelOptions bf16_classic{emu::DType::kBF16, Attention::kEager, false};
  const ModelOptions fp32_ckpt{emu::DType::kF32, Attention::kEager, true};
  const Case cases[] = {
      {"gpt2", 4, 1024, 4, fp32_classic},       {"gpt2", 4, 1024, 4, fp32_flash},
      {"gpt2", 4, 1024, 4, bf16_classic},       {"gpt2", 4, 1024, 4, fp32_ckpt},
      {"llama2-7b", 16, 4096, 2, fp32_classic}, {"llama2-7b", 16, 4096, 2, bf16_classic},
  };
  fmt::print("{:<10} {:>3} {:>5} {:>6} {:>4} {:>2} {:<8} {:<12} {:>9} {:>7} {:>8} {:>8} {:>7}\n", "model", "k", "h",
             "V", "s", "b", "dtype", "attention", "step (ms)", "GFLOP", "GFLOP/s", "sgemm", "ratio");
  for (const Case& cs : cases) {
    const std::string attention =
        fmt::format("{}{}", emu::model::attention_name(cs.options.attention), cs.options.checkpoint ? "+ckpt" : "");
    const std::string label = fmt::format("{} {} {}", cs.preset, emu::dtype_name(cs.options.compute), attention);
    if (label.find(filter) == std::string::npos) continue;
    ModelConfig full = emu::model::preset(cs.preset);
    full.seq = cs.seq;
    full.batch = cs.batch;
    const ModelConfig config = emu::model::shrink(full, cs.k);
    auto device = emu::make_cpu_device({});
    emu::model::Model model(*device, config, cs.options);
    emu::model::LocalParams params(model, 1234);
    std::mt19937 rng(7);
    std::vector<int32_t> tokens(size_t(config.tokens())), targets(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = int32_t(rng() % uint32_t(config.vocab));
      targets[i] = int32_t(rng() % uint32_t(config.vocab));
    }
    params.train_step(tokens.data(), targets.data(), 0.0f);  // warm-up
    const double peak = sgemm_gflops(1024);
    std::vector<double> times;
    for (int rep = 0; rep < 3; ++rep) {
      params.zero_grads();
      emu::model::NoHooks hooks;
      const auto start = Clock::now();
      model.step(tokens.data(), targets.data(), hooks);
      times.push_back(seconds_since(start));
    }
    std::sort(times.begin(), times.end());
    const double t = times[times.size() / 2];
    const double gflop = emu::model::step_flops(config) / 1e9;  // workloads/model/shrink.h
    fmt::print("{:<10} {:>3} {:>5} {:>6} {:>4} {:>2} {:<8} {:<12} {:>9.1f} {:>7.1f} {:>8.1f} {:>8.1f} {:>7.2f}\n",
               cs.preset, cs.k, config.hidden, config.vocab, config.seq, config.batch,
               emu::dtype_name(cs.options.compute), attention, t * 1e3, gflop, gflop / t, peak, gflop / t / peak);
  }
  return 0;
}
