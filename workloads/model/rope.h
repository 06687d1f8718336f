// The rotary embedding's tables, computed once on the host and brought to the device (Ops::rope_apply uses them).
#pragma once

#include <cstdint>

namespace emu::model {

// Hugging Face's rotate_half convention: within each head of dimension d, element j < d/2 pairs with j + d/2,
// rotated by the angle pos · theta^(−2j/d). cos and sin are [seq, d/2], computed in double, stored in fp32.
void rope_tables(int64_t seq, int64_t head_dim, double theta, float* cos, float* sin);

}  // namespace emu::model
