#include "workloads/model/rope.h"

#include <cmath>

namespace emu::model {

void rope_tables(int64_t seq, int64_t head_dim, double theta, float* cos, float* sin) {
  const int64_t half = head_dim / 2;
  for (int64_t pos = 0; pos < seq; ++pos) {
    for (int64_t j = 0; j < half; ++j) {
      const double inv_freq = std::pow(theta, -2.0 * double(j) / double(head_dim));
      const double angle = double(pos) * inv_freq;
      cos[pos * half + j] = static_cast<float>(std::cos(angle));
      sin[pos * half + j] = static_cast<float>(std::sin(angle));
    }
  }
}

}  // namespace emu::model
