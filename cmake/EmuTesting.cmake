# Test registration. Unit tests run without MPI; MPI tests run under mpiexec at each of EMU_TEST_RANKS (or the
# RANKS given), oversubscribed, and as root where CI runs them.
#
#   emu_add_unit_test(<name> SOURCES a.cpp b.cpp LIBS emu_device [LABELS x])
#   emu_add_mpi_test(<name> SOURCES a.cpp LIBS emu_collectives [RANKS 1 2 3 4 5 8] [TIMEOUT 300])

# EMU_COLL_TIMEOUT: a collective hung by a failing test ends the job through the watchdog (exit 3) long before
# ctest's own timeout would.
set(EMU_MPIEXEC_ENV
    "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;EMU_COLL_TIMEOUT=120")
if(EMU_SANITIZE)
  # OpenMPI keeps its own allocations to the end of the process: not ours to report.
  list(APPEND EMU_MPIEXEC_ENV "ASAN_OPTIONS=detect_leaks=0" "UBSAN_OPTIONS=print_stacktrace=1")
endif()

function(emu_add_unit_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE EMU_BINARY_DIR="${PROJECT_BINARY_DIR}"
                                             EMU_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                             EMU_MPIEXEC="${MPIEXEC_EXECUTABLE}")
  emu_configure_target(${name})
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS "unit;${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
                                          ENVIRONMENT "${EMU_MPIEXEC_ENV}")
endfunction()

function(emu_add_mpi_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LIBS;RANKS;LABELS" ${ARGN})
  if(NOT ARG_RANKS)
    set(ARG_RANKS ${EMU_TEST_RANKS})
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} emu_mpi_test_main)
  target_compile_definitions(${name} PRIVATE EMU_BINARY_DIR="${PROJECT_BINARY_DIR}"
                                             EMU_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  emu_configure_target(${name})
  foreach(ranks IN LISTS ARG_RANKS)
    add_test(NAME ${name}.np${ranks}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${MPIEXEC_PREFLAGS}
                     $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${name}.np${ranks} PROPERTIES LABELS "mpi;${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
                                                       PROCESSORS ${ranks} ENVIRONMENT "${EMU_MPIEXEC_ENV}")
  endforeach()
endfunction()
