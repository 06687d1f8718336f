# Collectives over MPI: every algorithm of every kind against MPI's own, at 1, 2, 3, 4, 5 and 8 ranks; the ledger.
emu_add_mpi_test(coll_algorithms_test SOURCES mpi/coll_algorithms_test.cpp LIBS emu_collectives RANKS 1 2 3 4 5 8)
# The cases that skip at some rank counts (rhd off powers of two, send/recv and the buffers' cap at one rank)
# run as their own tests.
emu_add_mpi_test(coll_ledger_test SOURCES mpi/coll_ledger_test.cpp LIBS emu_collectives RANKS 1 2 3 4 5 8
                 SEPARATE Ledger.RhdMovesTheRingVolumeOnPowersOfTwo Ledger.SendAndRecvAreCountedOnTheirOwnSide
                          Ledger.CommBuffersCountAgainstTheCap)

# The command-line tools end to end on small sizes: the teaching view and a short benchmark sweep (correctness
# and exit code only; the benchmark's numbers are not a test).
# Each run also follows every rank's buffer symbolically (which ranks' inputs each block holds after each round) to
# the collective's definition, and checks the algorithm's α-β-γ closed form against the rounds and bytes it really
# took ("agrees").
foreach(case "all_reduce;ring;5" "all_reduce;rhd;5" "all_reduce;tree;5" "reduce_scatter;ring;5" "all_gather;ring;5"
             "broadcast;tree;5" "reduce;tree;5" "all_to_all;pairwise;5" "all_reduce;ring;8" "all_reduce;rhd;8"
             "all_reduce;tree;8" "all_reduce;dbtree;5" "all_reduce;dbtree;8")
  list(GET case 0 kind)
  list(GET case 1 algorithm)
  list(GET case 2 ranks)
  add_test(NAME coll_teach_cli.${kind}_${algorithm}.np${ranks}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} $<TARGET_FILE:coll-teach> --kind ${kind}
                   --algorithm ${algorithm} --count 11 --root 3
                   --trace coll_teach_${kind}_${algorithm}_${ranks}.json)
  set_tests_properties(coll_teach_cli.${kind}_${algorithm}.np${ranks} PROPERTIES LABELS "mpi" TIMEOUT 60
                       PROCESSORS ${ranks} ENVIRONMENT "${EMU_MPIEXEC_ENV}"
                       PASS_REGULAR_EXPRESSION "at the end: as ${kind} defines.*B: agrees\nresult: correct on every rank")
endforeach()
# The cost model's table: on 8 ranks with the default link the tree all-reduce wins below 147 KiB (150,588 B by
# hand: 8α = S(4.25β + 2.125γ)), the ring above.
add_test(NAME coll_teach_cost.np1 COMMAND $<TARGET_FILE:coll-teach> --kind all_reduce --cost --ranks 8)
set_tests_properties(coll_teach_cost.np1 PROPERTIES LABELS "mpi" TIMEOUT 60 ENVIRONMENT "${EMU_MPIEXEC_ENV}"
                     PASS_REGULAR_EXPRESSION "tree is faster below 147[.]06 KiB, ring above")
# The pictures (--svg, --html) against the text view of the same run, the HTML page rendered by headless Chromium
# with its slider driven to each step; a visible skip (77) where no Chromium is installed (scripts/setup.sh
# installs chromium-headless-shell).
add_test(NAME coll_teach_pictures
         COMMAND ${PROJECT_SOURCE_DIR}/tests/e2e/teach_pictures.py ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:coll-teach>
                 ${CMAKE_CURRENT_BINARY_DIR}/coll_teach_pictures)
set_tests_properties(coll_teach_pictures PROPERTIES LABELS "mpi" TIMEOUT 300 PROCESSORS 5 SKIP_RETURN_CODE 77
                     ENVIRONMENT "${EMU_MPIEXEC_ENV}")
# Rank 0 alone holds the verdicts on the contents, the cost and the files; every rank must still exit with them
# (a file that cannot be written: 2 on each of the 3 ranks, not 2 on rank 0 and 0 elsewhere).
add_test(NAME coll_teach_every_rank_exits.np3
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 3 sh -c
                 "$<TARGET_FILE:coll-teach> --count 6 --svg /nonexistent-dir/x.svg >/dev/null; echo \"exit $?\"")
set_tests_properties(coll_teach_every_rank_exits.np3 PROPERTIES LABELS "mpi" TIMEOUT 60 PROCESSORS 3
                     ENVIRONMENT "${EMU_MPIEXEC_ENV}" PASS_REGULAR_EXPRESSION "exit 2[^!]*exit 2[^!]*exit 2"
                     FAIL_REGULAR_EXPRESSION "exit [013]")
if(TARGET coll-perf)
  add_test(NAME coll_perf_smoke.np4
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 $<TARGET_FILE:coll-perf>
                   --kind all_reduce,reduce_scatter,all_gather,broadcast,reduce,all_to_all -b 4 -e 64K -f 64 -w 1 -n 2
                   --dtype bfloat16 --json coll_perf_smoke.json --fit)
  set_tests_properties(coll_perf_smoke.np4 PROPERTIES LABELS "mpi" TIMEOUT 120 PROCESSORS 4
                       ENVIRONMENT "${EMU_MPIEXEC_ENV}"
                       PASS_REGULAR_EXPRESSION "fit over 27 rows of our algorithms.*all_reduce +tree.*all results correct")
  # Sizes as emu reads them (one parser, emu/units.h): 1KiB to 4KB is 1024 and 2048 bytes; a bad size is named.
  add_test(NAME coll_perf_sizes.np2
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:coll-perf> --kind all_reduce
                   -b 1KiB -e 4KB -f 2 -w 1 -n 1)
  set_tests_properties(coll_perf_sizes.np2 PROPERTIES LABELS "mpi" TIMEOUT 60 PROCESSORS 2
                       ENVIRONMENT "${EMU_MPIEXEC_ENV}" PASS_REGULAR_EXPRESSION "\n +2048 +512 +float32")
  add_test(NAME coll_perf_bad_size.np2
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:coll-perf> --kind all_reduce
                   -b 64Mx -e 4KB)
  set_tests_properties(coll_perf_bad_size.np2 PROPERTIES LABELS "mpi" TIMEOUT 60 PROCESSORS 2
                       ENVIRONMENT "${EMU_MPIEXEC_ENV}" PASS_REGULAR_EXPRESSION "size '64Mx' is not a size; accepted")
endif()

# The ledgers of our algorithms against the bytes the MPI profiling layer sees them send (tests/support/pmpi_counter).
add_library(emu_pmpi_counter OBJECT support/pmpi_counter.cpp)
target_include_directories(emu_pmpi_counter PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(emu_pmpi_counter PUBLIC MPI::MPI_CXX)
emu_configure_target(emu_pmpi_counter)
emu_add_mpi_test(coll_pmpi_test SOURCES mpi/coll_pmpi_test.cpp LIBS emu_collectives emu_pmpi_counter
                 RANKS 1 2 3 4 5 8 SEPARATE LedgerAtTheProfilingLayer.SendAndRecvAreWhatMpiWasHanded)
