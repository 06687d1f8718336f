// Whether this test binary was built with AddressSanitizer (the asan preset, scripts/test.sh's part 5), where every
// allocation costs ~10x. The tests that sweep thousands of option combinations on shapes (prediction_matrix_test,
// shrink_fidelity_test) check every one in the release build and an evenly spread fifth of them here, and say so:
// the sanitizers look for memory errors on the code paths, which every option value still takes.
#pragma once

#include <cstddef>

namespace emu::testing {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// 1 in the release build; 5 under AddressSanitizer (coprime with the 2- and 3-valued option axes, so that every
// value of each comes up).
inline constexpr size_t kSweepStride = kSanitized ? 5 : 1;

}  // namespace emu::testing
