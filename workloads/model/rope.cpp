#include "workloads/model/rope.h"

#include <cmath>
#include <numbers>

namespace emu::model {

std::vector<double> rope_inverse_frequencies(int64_t head_dim, double theta, const RopeScaling& scaling,
                                             int64_t full_seq) {
  const double d = double(head_dim);
  double base = theta;
  if (scaling.type == RopeScaling::Type::kDynamic && full_seq > scaling.original_max_positions) {
    // NTK-aware: the base grows with the sequence beyond the context the model was trained at.
    const double stretch =
        scaling.factor * double(full_seq) / double(scaling.original_max_positions) - (scaling.factor - 1);
    base = theta * std::pow(stretch, d / (d - 2));
  }
  std::vector<double> inv_freq(size_t(head_dim / 2));
  for (size_t j = 0; j < inv_freq.size(); ++j) inv_freq[j] = std::pow(base, -2.0 * double(j) / d);
  if (scaling.type == RopeScaling::Type::kLongrope) {
    // transformers _compute_longrope_parameters: the long factors once the sequence passes the original context
    // (longrope_frequency_update compares max(position_ids) + 1 with it), the short ones otherwise.
    const std::vector<double>& factors =
        full_seq > scaling.original_max_positions ? scaling.long_factor : scaling.short_factor;
    const size_t stride = factors.size() / inv_freq.size();  // k: the shrunk head keeps every k-th frequency
    for (size_t j = 0; j < inv_freq.size(); ++j) inv_freq[j] /= factors[j * stride];
  } else if (scaling.type == RopeScaling::Type::kLinear) {
    for (double& f : inv_freq) f /= scaling.factor;
  } else if (scaling.type == RopeScaling::Type::kLlama3) {
    // Wavelengths longer than the original context / low_freq_factor are stretched by the factor, those shorter
    // than context / high_freq_factor kept, and those between interpolated linearly in context / wavelength.
    const double context = double(scaling.original_max_positions);
    const double low_wavelength = context / scaling.low_freq_factor;
    const double high_wavelength = context / scaling.high_freq_factor;
    for (double& f : inv_freq) {
      const double wavelength = 2 * std::numbers::pi / f;
      if (wavelength > low_wavelength) {
        f /= scaling.factor;
      } else if (wavelength >= high_wavelength) {
        const double smooth =
            (context / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor);
        f = (1 - smooth) * f / scaling.factor + smooth * f;
      }
    }
  }
  return inv_freq;
}

void rope_tables(int64_t seq, const std::vector<double>& inv_freq, float* cos, float* sin, double attention_factor) {
  const size_t half = inv_freq.size();
  for (int64_t pos = 0; pos < seq; ++pos) {
    for (size_t j = 0; j < half; ++j) {
      const double angle = double(pos) * inv_freq[j];
      cos[size_t(pos) * half + j] = static_cast<float>(std::cos(angle) * attention_factor);
      sin[size_t(pos) * half + j] = static_cast<float>(std::sin(angle) * attention_factor);
    }
  }
}

}  // namespace emu::model
