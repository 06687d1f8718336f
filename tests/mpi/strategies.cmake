# Strategies under MPI: the equivalence ladder against single-device training at 1, 2, 3, 4, 5 and 8 ranks.
emu_add_mpi_test(strategy_equivalence_test SOURCES mpi/strategy_equivalence_test.cpp
                 LIBS emu_strategies RANKS 1 2 3 4 5 8)
emu_add_mpi_test(strategy_memory_test SOURCES mpi/strategy_memory_test.cpp LIBS emu_strategies RANKS 1 2 3 4 8)
# The case that needs 4 ranks runs as its own test, skipped at 1, 2 and 3 ranks.
emu_add_mpi_test(strategy_oom_test SOURCES mpi/strategy_oom_test.cpp LIBS emu_strategies RANKS 1 2 3 4 8
                 SEPARATE Oom.CapBetweenTwoStrategiesNeedsFitsOneAndNotTheOther)
