# emu_configure_target(<target>): the warnings, sanitizers and include root every emu target shares.
function(emu_configure_target target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wno-unused-parameter>)
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
