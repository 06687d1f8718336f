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
             "broadcast;tree;5" "reduce;ring;5" "reduce;tree;5" "all_to_all;pairwise;5" "all_reduce;ring;8" "all_reduce;rhd;8"
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
# The ring reduce cut into 16 pieces of 16 B: its contents still end as reduce defines, and its pipelined cost
# (N+k-2 = 18 rounds; S + S/k = 272 B on a middle rank's links) agrees with the run.
add_test(NAME coll_teach_cli.reduce_ring_pieces.np4
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 $<TARGET_FILE:coll-teach> --kind reduce
                 --algorithm ring --count 64 --slice 16 --root 0)
set_tests_properties(coll_teach_cli.reduce_ring_pieces.np4 PROPERTIES LABELS "mpi" TIMEOUT 60 PROCESSORS 4
                     ENVIRONMENT "${EMU_MPIEXEC_ENV}" PASS_REGULAR_EXPRESSION
                     "at the end: as reduce defines.*executed: 18 rounds, 272 B.*B: agrees\nresult: correct on every rank")
# The cost model's table: on 8 ranks with the default link the tree all-reduce wins below 147 KiB (150,588 B by
# hand: 8α = S(4.25β + 2.125γ)), the ring above.
add_test(NAME coll_teach_cost.np1 COMMAND $<TARGET_FILE:coll-teach> --kind all_reduce --cost --ranks 8)
set_tests_properties(coll_teach_cost.np1 PROPERTIES LABELS "mpi" TIMEOUT 60 ENVIRONMENT "${EMU_MPIEXEC_ENV}"
                     PASS_REGULAR_EXPRESSION "tree is faster below 147[.]06 KiB, ring above")
# The hierarchical all-reduce on 2 nodes of 4: its contents end as all-reduce defines, its cost model agrees with its
# rounds and bytes, and the bytes it counted between nodes are the ones it declared: by hand 2·(2-1)/2 of a rank's
# shard, the shard itself, which for 11 floats in blocks of 2,2,2,1,1,1,1,1 (a shard: two blocks) is 16 B on r0 and
# r4, 12 B on r1 and r5, 8 B on the others.
add_test(NAME coll_teach_cli.all_reduce_hier.np8
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 8 $<TARGET_FILE:coll-teach> --kind all_reduce
                 --algorithm hier --ranks-per-node 4 --count 11)
set_tests_properties(coll_teach_cli.all_reduce_hier.np8 PROPERTIES LABELS "mpi" TIMEOUT 60 PROCESSORS 8
                     ENVIRONMENT "${EMU_MPIEXEC_ENV}"
                     PASS_REGULAR_EXPRESSION
                     "at the end: as all_reduce defines.*r0 +[0-9]+ B / [0-9]+ B [(][0-9]+ B / [0-9]+ B[)]; 16 B / 16 B [(]16 B / 16 B[)].*r7 +[0-9]+ B / [0-9]+ B [(][0-9]+ B / [0-9]+ B[)]; 8 B / 8 B [(]8 B / 8 B[)].*B: agrees\nresult: correct on every rank")
# A --slice below the payload cuts the ring's blocks into pieces: the run is still checked (correct on every rank, exit
# 0), the contents view and the one-piece cost model are shown with a note instead of failing the run (exit 1 before).
add_test(NAME coll_teach_cli.reduce_scatter_sliced.np4
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 $<TARGET_FILE:coll-teach> --kind reduce_scatter
                 --algorithm ring --count 64 --slice 16)
set_tests_properties(coll_teach_cli.reduce_scatter_sliced.np4 PROPERTIES LABELS "mpi" TIMEOUT 60 PROCESSORS 4
                     ENVIRONMENT "${EMU_MPIEXEC_ENV}" PASS_REGULAR_EXPRESSION
                     "note: --slice 16 B cuts the 1.00 KiB payload into pieces.*result: correct on every rank")
add_test(NAME coll_teach_cli.reduce_scatter_sliced_exit.np4
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 sh -c
                 "$<TARGET_FILE:coll-teach> --kind reduce_scatter --algorithm ring --count 64 --slice 16 >/dev/null 2>&1; echo \"exit $?\"")
set_tests_properties(coll_teach_cli.reduce_scatter_sliced_exit.np4 PROPERTIES LABELS "mpi" TIMEOUT 60 PROCESSORS 4
                     ENVIRONMENT "${EMU_MPIEXEC_ENV}" PASS_REGULAR_EXPRESSION
                     "exit 0[^!]*exit 0[^!]*exit 0[^!]*exit 0")
# Nodes of unequal size are refused, with the value and what is accepted, on every rank (exit 2).
add_test(NAME coll_teach_cli.all_reduce_hier_uneven.np6
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 6 sh -c
                 "$<TARGET_FILE:coll-teach> --algorithm hier --ranks-per-node 4 --count 8 >/dev/null 2>&1; echo \"exit $?\"")
set_tests_properties(coll_teach_cli.all_reduce_hier_uneven.np6 PROPERTIES LABELS "mpi" TIMEOUT 60 PROCESSORS 6
                     ENVIRONMENT "${EMU_MPIEXEC_ENV}" PASS_REGULAR_EXPRESSION
                     "exit 2[^!]*exit 2[^!]*exit 2[^!]*exit 2[^!]*exit 2[^!]*exit 2"
                     FAIL_REGULAR_EXPRESSION "exit [013]")
add_test(NAME coll_teach_cli.all_reduce_hier_uneven_message.np1
         COMMAND $<TARGET_FILE:coll-teach> --kind all_reduce --cost --ranks 6 --ranks-per-node 4 --hardware
                 h100-80gb-sxm)
set_tests_properties(coll_teach_cli.all_reduce_hier_uneven_message.np1 PROPERTIES LABELS "mpi" TIMEOUT 60
                     ENVIRONMENT "${EMU_MPIEXEC_ENV}" PASS_REGULAR_EXPRESSION
                     "hier +left out: all_reduce=hier: 4 ranks per node do not divide the group's 6 ranks; accepted: a divisor of 6")
# Two links: NVLink-like within a node (α 2 µs, 300 GB/s), NIC-like between (α 10 µs, 25 GB/s), reduction 40 GB/s.
# On 2 nodes of 4 the hierarchical all-reduce has fewer rounds and bytes at the network than any flat one; on 16
# nodes of 8 its 30 network rounds lose to the binomial tree's 14 below 264.17 KiB, by hand: 188 µs =
# S (14/25e9 + 7/40e9 - 1.75/300e9 - 0.234375/25e9 - (0.875 + 0.1171875)/40e9) s/B, S = 270,509 B.
add_test(NAME coll_teach_cost_nodes.np1
         COMMAND $<TARGET_FILE:coll-teach> --kind all_reduce --cost --ranks 8 --ranks-per-node 4 --alpha-us 2
                 --bandwidth 300 --net-alpha-us 10 --net-bandwidth 25)
set_tests_properties(coll_teach_cost_nodes.np1 PROPERTIES LABELS "mpi" TIMEOUT 60 ENVIRONMENT "${EMU_MPIEXEC_ENV}"
                     PASS_REGULAR_EXPRESSION "2 nodes of 4.*hier is never slower than ring")
add_test(NAME coll_teach_cost_many_nodes.np1
         COMMAND $<TARGET_FILE:coll-teach> --kind all_reduce --cost --ranks 128 --ranks-per-node 8 --alpha-us 2
                 --bandwidth 300 --net-alpha-us 10 --net-bandwidth 25)
set_tests_properties(coll_teach_cost_many_nodes.np1 PROPERTIES LABELS "mpi" TIMEOUT 60 ENVIRONMENT "${EMU_MPIEXEC_ENV}"
                     PASS_REGULAR_EXPRESSION "tree is faster below 264[.]17 KiB, hier above")
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
                       PASS_REGULAR_EXPRESSION "fit over 33 rows of our algorithms.*all_reduce +tree.*all results correct")
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
# One tensor-parallel layer's collectives (coll-teach --tp-layer) at t = 2, 3, 4 and 8, with and without sequence
# parallelism, against the closed forms written in the script: 4 all-reduces of S = b·s·h·e at 2(t-1)/t·S per rank,
# or 4 reduce-scatters and 6 all-gathers at (t-1)/t·S; shapes that do not split refused with exit 2 on every rank.
add_test(NAME coll_teach_tp_layer
         COMMAND ${PROJECT_SOURCE_DIR}/tests/e2e/teach_tp_layer.py ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:coll-teach>)
set_tests_properties(coll_teach_tp_layer PROPERTIES LABELS "mpi" TIMEOUT 300 PROCESSORS 8
                     ENVIRONMENT "${EMU_MPIEXEC_ENV}")
