# Test registration. Unit tests run without MPI; MPI tests run under mpiexec at each of EMU_TEST_RANKS (or the
# RANKS given), oversubscribed, and as root where CI runs them.
#
#   emu_add_unit_test(<name> SOURCES a.cpp b.cpp LIBS emu_device [LABELS x] [SEPARATE Suite.Case Suite2.*])
#   emu_add_mpi_test(<name> SOURCES a.cpp LIBS emu_collectives [RANKS 1 2 3 4 5 8] [TIMEOUT 300] [SEPARATE ...])
#
# Skips are visible: the test mains (tests/support/*_main.cpp) exit 77 when nothing failed and some case skipped
# (GTEST_SKIP), and every test is registered with SKIP_RETURN_CODE 77, so ctest reports it skipped, never passed;
# a failure anywhere still fails it. An executable that skips some cases and runs others (at some rank count, or
# without a GPU) names the skipping cases under SEPARATE: each pattern (a --gtest_filter) becomes its own ctest
# test, <name>.<Suite.Case>[.npN], and the plain <name>[.npN] runs the rest, so ctest shows exactly which case
# skipped where (SEPARATE also splits a long executable, whose parts ctest then runs side by side). A pattern that
# matches no case fails (test_exit.h): a renamed case cannot drop out silently.

# EMU_COLL_TIMEOUT: a collective hung by a failing test ends the job through the watchdog (exit 3) long before
# ctest's own timeout would. pml ob1, as scripts/mpirun names it: the one Open MPI picks on one machine, without
# probing the network libraries first (0.2 s of every job's start). odls_base_sigkill_timeout 0, as
# tests/support/process.h explains: a test main that exits non-zero (77 for a skip) costs its job no 2 s wait.
set(EMU_MPIEXEC_ENV
    "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;EMU_COLL_TIMEOUT=120"
    "OMPI_MCA_pml=ob1;OMPI_MCA_odls_base_sigkill_timeout=0")
if(EMU_SANITIZE)
  # OpenMPI keeps its own allocations to the end of the process: not ours to report.
  list(APPEND EMU_MPIEXEC_ENV "ASAN_OPTIONS=detect_leaks=0" "UBSAN_OPTIONS=print_stacktrace=1")
endif()

set(EMU_SKIP_RETURN_CODE 77)

# Sanitized code runs several times slower (AddressSanitizer's checked allocations most: the plans' caching-allocator
# replay took 43 s in release and more than 300 s under asan on a 2-core machine), so a sanitized build gives every
# test that many times its time limit.
set(EMU_TIMEOUT_FACTOR 1)
if(EMU_SANITIZE)
  set(EMU_TIMEOUT_FACTOR 3)
endif()

# Adds `command` as ctest test <name><suffix> for the cases outside SEPARATE and <name>.<pattern><suffix> for each
# SEPARATE pattern; the names go to `out` for the caller's properties.
function(_emu_add_cases name suffix command separate out)
  set(names)
  set(rest)
  foreach(pattern IN LISTS separate)
    string(REPLACE ".*" "" label "${pattern}")
    string(REPLACE "*" "" label "${label}")
    add_test(NAME ${name}.${label}${suffix} COMMAND ${command} --gtest_filter=${pattern})
    list(APPEND names ${name}.${label}${suffix})
    list(APPEND rest ${pattern})
  endforeach()
  if(rest)
    list(JOIN rest ":" excluded)
    add_test(NAME ${name}${suffix} COMMAND ${command} --gtest_filter=-${excluded})
  else()
    add_test(NAME ${name}${suffix} COMMAND ${command})
  endif()
  list(APPEND names ${name}${suffix})
  set(${out} ${names} PARENT_SCOPE)
endfunction()

function(emu_add_unit_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LIBS;LABELS;SEPARATE" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  math(EXPR ARG_TIMEOUT "${ARG_TIMEOUT} * ${EMU_TIMEOUT_FACTOR}")
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} emu_unit_test_main)
  target_compile_definitions(${name} PRIVATE EMU_MPIEXEC="${MPIEXEC_EXECUTABLE}")
  set(harness)
  if("e2e" IN_LIST ARG_LABELS)
    set(harness HARNESS)  # an end-to-end test checks emu as a child process (cmake/EmuTargets.cmake)
  endif()
  emu_configure_target(${name} ${harness})
  _emu_add_cases(${name} "" "$<TARGET_FILE:${name}>" "${ARG_SEPARATE}" tests)
  set_tests_properties(${tests} PROPERTIES LABELS "unit;${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
                                           ENVIRONMENT "${EMU_MPIEXEC_ENV}" SKIP_RETURN_CODE ${EMU_SKIP_RETURN_CODE})
  if(harness)
    # The end-to-end tests run longest (one to three minutes under asan): ctest starts them first, by their time
    # limit, so that a fresh build, which has no record of earlier test times, does not end on one of them alone.
    set_tests_properties(${tests} PROPERTIES COST ${ARG_TIMEOUT})
  endif()
endfunction()

function(emu_add_mpi_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LIBS;RANKS;LABELS;SEPARATE" ${ARGN})
  if(NOT ARG_RANKS)
    set(ARG_RANKS ${EMU_TEST_RANKS})
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  math(EXPR ARG_TIMEOUT "${ARG_TIMEOUT} * ${EMU_TIMEOUT_FACTOR}")
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} emu_mpi_test_main)
  emu_configure_target(${name})
  foreach(ranks IN LISTS ARG_RANKS)
    set(command ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}>
                ${MPIEXEC_POSTFLAGS})
    _emu_add_cases(${name} ".np${ranks}" "${command}" "${ARG_SEPARATE}" tests)
    set_tests_properties(${tests} PROPERTIES LABELS "mpi;${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT} PROCESSORS ${ranks}
                                             ENVIRONMENT "${EMU_MPIEXEC_ENV}" SKIP_RETURN_CODE ${EMU_SKIP_RETURN_CODE})
  endforeach()
endfunction()

# Every test of the calling directory runs its mpiexec with a session directory of its own under the build tree:
# Open MPI 4 makes <tmpdir>/ompi.<host>.<uid>/pid.<pid> and removes the shared top directory when its job ends, so
# two jobs of `ctest -j` racing there could fail to start ("orte_session_dir failed"). Called last in each
# directory that registers tests.
function(emu_own_session_dirs)
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(test IN LISTS tests)
    set_property(TEST ${test} APPEND PROPERTY ENVIRONMENT
                 "OMPI_MCA_orte_tmpdir_base=${CMAKE_BINARY_DIR}/mpi-session/${test}")
  endforeach()
endfunction()
