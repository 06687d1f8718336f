# The collectives' pure parts (no MPI), and the watchdog on a real job started from the test.
emu_add_unit_test(coll_topology_test SOURCES unit/coll_topology_test.cpp LIBS emu_collectives)
# The traffic ledger's bookkeeping: moved and expected bytes kept apart, totals, the table's expected column.
emu_add_unit_test(coll_ledger_entries_test SOURCES unit/coll_ledger_entries_test.cpp LIBS emu_collectives)

add_executable(coll_watchdog_probe unit/coll_watchdog_probe.cpp)
target_link_libraries(coll_watchdog_probe PRIVATE emu_collectives)
emu_configure_target(coll_watchdog_probe)
emu_add_unit_test(coll_watchdog_test SOURCES unit/coll_watchdog_test.cpp TIMEOUT 60)
target_compile_definitions(coll_watchdog_test PRIVATE EMU_COLL_PROBE="$<TARGET_FILE:coll_watchdog_probe>")
add_dependencies(coll_watchdog_test coll_watchdog_probe)

emu_add_unit_test(coll_nccl_select_test SOURCES unit/coll_nccl_select_test.cpp LIBS emu_coll_backend)

emu_add_unit_test(coll_teach_test SOURCES unit/coll_teach_test.cpp LIBS emu_coll_teach)
# The α-β-γ cost model against hand arithmetic, its crossovers and its fit.
emu_add_unit_test(coll_cost_test SOURCES unit/coll_cost_test.cpp LIBS emu_collectives)
