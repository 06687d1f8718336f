# Strategy building blocks: shard arithmetic, bucket assignment.
emu_add_unit_test(strategy_shard_test SOURCES unit/strategy_shard_test.cpp LIBS emu_strategies)
