# Strategy building blocks: shard arithmetic, bucket assignment.
emu_add_unit_test(strategy_shard_test SOURCES unit/strategy_shard_test.cpp LIBS emu_strategies)
# Shrink stays exact: every preset and accepted config, every strategy, shrunk × k² against the full-scale plan.
emu_add_unit_test(shrink_fidelity_test SOURCES unit/shrink_fidelity_test.cpp LIBS emu_app TIMEOUT 300)
emu_add_unit_test(prediction_matrix_test SOURCES unit/prediction_matrix_test.cpp LIBS emu_app TIMEOUT 300)
emu_add_unit_test(strategy_pipeline_schedule_test SOURCES unit/pipeline_schedule_test.cpp LIBS emu_strategies)
emu_add_unit_test(zero3_modules_test SOURCES unit/zero3_modules_test.cpp LIBS emu_strategies)
