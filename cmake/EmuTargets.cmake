# emu_configure_target(<target>): the warnings, sanitizers and include root every emu target shares.
function(emu_configure_target target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wno-unused-parameter>)
  if(EMU_NATIVE AND EMU_HAS_MARCH_NATIVE)
    # This CPU's instructions up to AVX2 and FMA. AVX-512 stays off: GCC 12's AVX-512 code failed a plain unit
    # test here (coll_topology_test read a std::vector literal back wrong at -O3 -march=x86-64-v4, and passed at
    # x86-64-v3), and AVX2 already gives the element-wise math most of the gain (README, benchmark).
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=native -mno-avx512f>)
  endif()
  if(EMU_SANITIZE OR EMU_FUZZ)
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer
                                             -fno-sanitize-recover=undefined)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
  # Under EMU_FUZZ every target carries libFuzzer's coverage instrumentation, so the fuzzers are guided through
  # the library code they call; only the fuzz targets themselves link libFuzzer (-fsanitize=fuzzer, tests/fuzz).
  if(EMU_FUZZ)
    target_compile_options(${target} PRIVATE -fsanitize=fuzzer-no-link)
  endif()
endfunction()
