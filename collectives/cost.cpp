#include "collectives/cost.h"

#include <fmt/format.h>

#include <Eigen/Dense>
#include <cmath>
#include <limits>

namespace emu::coll {

double predicted_seconds(const Cost& cost, const LinkModel& link) {
  return cost.rounds * link.alpha + cost.bytes * link.beta + cost.reduced * link.gamma;
}

double predicted_seconds(const Cost& cost, const Fabric& fabric, int n) {
  if (node_size(fabric.ranks_per_node, n) >= n) return predicted_seconds(cost, fabric.node);
  if (!cost.split) {
    const LinkModel& across = fabric.flat ? *fabric.flat : fabric.network;
    return predicted_seconds(cost, LinkModel{across.alpha, across.beta, fabric.node.gamma});
  }
  return (cost.rounds - cost.inter_rounds) * fabric.node.alpha + (cost.bytes - cost.inter_bytes) * fabric.node.beta +
         cost.inter_rounds * fabric.network.alpha + cost.inter_bytes * fabric.network.beta +
         cost.reduced * fabric.node.gamma;
}

std::optional<Crossover> crossover(const Algorithm& a, const Algorithm& b, int n, const LinkModel& link) {
  return crossover(a, b, n, Fabric{link, link, 0, std::nullopt});
}

std::optional<Crossover> crossover(const Algorithm& a, const Algorithm& b, int n, const Fabric& fabric) {
  // Each cost is t(S) = fixed + S·slope: the rounds do not depend on S, the bytes grow with it.
  const int per_node = fabric.ranks_per_node;
  const auto fixed = [&](const Algorithm& x) { return predicted_seconds(x.cost(0, n, per_node), fabric, n); };
  // Taken over a large payload, so that the latency subtracted out leaves the per-byte terms to full precision.
  constexpr double kLarge = 1 << 30;
  const auto slope = [&](const Algorithm& x) {
    return (predicted_seconds(x.cost(kLarge, n, per_node), fabric, n) - fixed(x)) / kLarge;
  };
  const double a_fixed = fixed(a), b_fixed = fixed(b);
  const double a_slope = slope(a), b_slope = slope(b);
  if (std::abs(a_slope - b_slope) <= 1e-12 * std::max(std::abs(a_slope), std::abs(b_slope))) return std::nullopt;
  const double payload = (b_fixed - a_fixed) / (a_slope - b_slope);
  if (!(payload > 0)) return std::nullopt;
  // Below the crossover the one with the smaller fixed (latency) cost wins.
  return a_fixed < b_fixed ? Crossover{payload, &a, &b} : Crossover{payload, &b, &a};
}

Fit fit_link(std::span<const Sample> samples) {
  // Weighted least squares on t = α·rounds + β·bytes + γ·reduced, each row divided by its measured time; the
  // non-negative solution by trying every subset of the three terms (an exact active-set search for three).
  const auto rows = static_cast<Eigen::Index>(samples.size());
  Eigen::MatrixXd terms(rows, 3);
  Eigen::VectorXd ones = Eigen::VectorXd::Ones(rows);
  for (Eigen::Index i = 0; i < rows; ++i) {
    const Sample& s = samples[static_cast<size_t>(i)];
    const double weight = s.seconds > 0 ? 1 / s.seconds : 0;
    terms.row(i) << s.cost.rounds * weight, s.cost.bytes * weight, s.cost.reduced * weight;
  }
  Eigen::Vector3d best = Eigen::Vector3d::Zero();
  double best_residual = std::numeric_limits<double>::infinity();
  for (int subset = 1; subset < 8; ++subset) {
    std::vector<Eigen::Index> used;
    for (Eigen::Index t = 0; t < 3; ++t) {
      if ((subset >> t) & 1) used.push_back(t);
    }
    Eigen::MatrixXd a(rows, static_cast<Eigen::Index>(used.size()));
    for (size_t c = 0; c < used.size(); ++c) a.col(static_cast<Eigen::Index>(c)) = terms.col(used[c]);
    const Eigen::VectorXd x = a.colPivHouseholderQr().solve(ones);
    if ((x.array() < 0).any()) continue;
    const double residual = (a * x - ones).squaredNorm();
    if (residual < best_residual) {
      best_residual = residual;
      best.setZero();
      for (size_t c = 0; c < used.size(); ++c) best(used[c]) = x(static_cast<Eigen::Index>(c));
    }
  }
  Fit fit;
  fit.link = {best(0), best(1), best(2)};
  for (const Sample& s : samples) {
    fit.relative_errors.push_back(s.seconds > 0 ? (predicted_seconds(s.cost, fit.link) - s.seconds) / s.seconds : 0);
  }
  return fit;
}

std::string describe(const LinkModel& link) {
  const auto rate = [](double per_byte) {
    return per_byte > 0 ? fmt::format("{:.3g} GB/s", 1e-9 / per_byte) : std::string("free");
  };
  return fmt::format("α {:.3g} µs, 1/β {}, 1/γ {}", link.alpha * 1e6, rate(link.beta), rate(link.gamma));
}

}  // namespace emu::coll
