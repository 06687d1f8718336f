# Strategies under MPI: the equivalence ladder against single-device training at 1, 2, 3, 4, 5 and 8 ranks.
emu_add_mpi_test(strategy_equivalence_test SOURCES mpi/strategy_equivalence_test.cpp
                 LIBS emu_strategies RANKS 1 2 3 4 5 8)
emu_add_mpi_test(strategy_memory_test SOURCES mpi/strategy_memory_test.cpp LIBS emu_strategies RANKS 1 2 3 4 8)
# The case that needs 4 ranks runs as its own test, skipped at 1, 2 and 3 ranks.
emu_add_mpi_test(strategy_oom_test SOURCES mpi/strategy_oom_test.cpp LIBS emu_strategies RANKS 1 2 3 4 8
                 SEPARATE Oom.CapBetweenTwoStrategiesNeedsFitsOneAndNotTheOther)
# Every strategy's measured, planned and predicted memory against an independent oracle (tests/oracle/), and the
# ZeRO paper's Figure 1 on a 7.5B model.
emu_add_mpi_test(strategy_oracle_test SOURCES mpi/strategy_oracle_test.cpp oracle/memory_oracle.cpp
                 LIBS emu_strategies emu_app RANKS 2 4 8)
# FSDP2's per-parameter dim-0 padding, buffers and offload against the shapes by hand, at ranks that pad.
emu_add_mpi_test(strategy_fsdp2_test SOURCES mpi/strategy_fsdp2_test.cpp LIBS emu_strategies RANKS 1 3 4 8)
emu_add_mpi_test(strategy_fsdp2_reshard_test SOURCES mpi/strategy_fsdp2_reshard_test.cpp LIBS emu_strategies RANKS 4 8)
# When each strategy makes and frees its gradients (the root's head first, its embeddings last; FSDP1's shards at
# the reduce-scatter; ZeRO-2's one .grad at a time), from the shapes by hand, at ranks the tiny units divide by.
emu_add_mpi_test(strategy_gradient_timing_test SOURCES mpi/strategy_gradient_timing_test.cpp LIBS emu_strategies
                 RANKS 2 4)
# Pipeline parallelism: p2p bytes per step, activations in flight per stage under GPipe and 1F1B, per-stage model
# states against the predictor.
emu_add_mpi_test(strategy_pipeline_test SOURCES mpi/strategy_pipeline_test.cpp LIBS emu_strategies RANKS 2 3 4)
emu_add_mpi_test(strategy_tensor_test SOURCES mpi/strategy_tensor_test.cpp LIBS emu_strategies RANKS 1 2 4 8)
# tp and pp composed with data parallelism and each other (TP 2 x DP 2|4, PP 2 x DP 2|4, TP 2 x PP 2 at 4 ranks; TP 2 x
# PP 2 x DP 2 at 8; ZeRO-1/2 over TP 2, ZeRO-2 over TP 4 at 8): the same numbers as a single device, each
# group's traffic against closed forms.
emu_add_mpi_test(strategy_parallel_test SOURCES mpi/strategy_parallel_test.cpp LIBS emu_strategies RANKS 4 8
                 SEPARATE ZeroOverTensorParallel.Tp4SameAsSingleDevice)
