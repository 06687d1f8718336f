// The rotary embedding's tables, computed once on the host and brought to the device (Ops::rope_apply uses them).
#pragma once

#include <cstdint>
#include <vector>

#include "workloads/model/config.h"

namespace emu::model {

// The d/2 inverse frequencies theta^(−2j/d), stretched as rope_scaling says (transformers'
// modeling_rope_utils.py: linear, dynamic NTK, llama3, longrope). `full_seq` is the sequence length at full scale,
// which decides whether dynamic NTK scaling applies and which of longrope's factor lists is used. A shrunk head
// (d = d_full / k) keeps every k-th frequency of the full head, so longrope divides frequency j by factor[j·k].
std::vector<double> rope_inverse_frequencies(int64_t head_dim, double theta, const RopeScaling& scaling,
                                             int64_t full_seq);

// Hugging Face's rotate_half convention: within each head of dimension d, element j < d/2 pairs with j + d/2,
// rotated by the angle pos · inv_freq[j]. cos and sin are [seq, d/2], computed in double, stored in fp32, each
// times `attention_factor` (longrope's scaling of cos and sin; 1 otherwise).
void rope_tables(int64_t seq, const std::vector<double>& inv_freq, float* cos, float* sin, double attention_factor = 1);

}  // namespace emu::model
