# emu_configure_target(<target> [HARNESS]): the warnings, sanitizers and include root every emu target shares.
# HARNESS marks a test executable that checks emu from outside, as a child process (tests/e2e): under the
# sanitizers it links their runtime, for the instrumented libraries it may link, but its own sources are compiled
# without them. The emu processes it starts are instrumented; the harness's JSON parsing and GoogleTest
# assertions would only double its build time (20 s a file under asan, 12 s without).
function(emu_configure_target target)
  cmake_parse_arguments(ARG "HARNESS" "" "" ${ARGN})
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wno-unused-parameter>)
  if(EMU_NATIVE AND EMU_HAS_MARCH_NATIVE)
    # This CPU's instructions up to AVX2 and FMA, tuned for x86-64 in general. GCC 12 miscompiles here: its SLP
    # vectorizer built the std::vector literal {1, 1, 0, 0} as a broadcast of 1 (coll_topology_test), with AVX-512
    # on (-march=x86-64-v4) and, with it off, under -mtune=icelake-client/rocketlake, which -march=native picks on
    # those CPUs; AVX2 with generic tuning builds it right, and already gives the element-wise math most of the gain.
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=native -mno-avx512f -mtune=generic>)
  endif()
  if((EMU_SANITIZE OR EMU_FUZZ) AND NOT ARG_HARNESS)
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer
                                             -fno-sanitize-recover=undefined)
  endif()
  if(EMU_SANITIZE OR EMU_FUZZ)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
  # Under EMU_FUZZ every target carries libFuzzer's coverage instrumentation, so the fuzzers are guided through
  # the library code they call, except the sources tests/fuzz/coverage_ignore.txt names, which no fuzzer reaches;
  # only the fuzz targets themselves link libFuzzer (-fsanitize=fuzzer, tests/fuzz).
  if(EMU_FUZZ AND NOT ARG_HARNESS)
    target_compile_options(${target} PRIVATE -fsanitize=fuzzer-no-link
                                             -fsanitize-coverage-ignorelist=${PROJECT_SOURCE_DIR}/tests/fuzz/coverage_ignore.txt)
  endif()
endfunction()
