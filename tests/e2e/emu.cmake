# End to end: the emu executable under mpiexec — exit codes, messages, the run header.
add_library(emu_test_process STATIC support/process.cpp support/json_schema.cpp)
target_include_directories(emu_test_process PUBLIC ${PROJECT_SOURCE_DIR})
target_compile_definitions(emu_test_process PRIVATE EMU_MPIEXEC="${MPIEXEC_EXECUTABLE}")
target_include_directories(emu_test_process PUBLIC ${CMAKE_CURRENT_BINARY_DIR}/generated)
target_link_libraries(emu_test_process PUBLIC nlohmann_json::nlohmann_json fmt::fmt)
emu_configure_target(emu_test_process HARNESS)

# The validator every emu JSON is checked with (read_json), and the schema itself: documented, and strict.
emu_add_unit_test(json_schema_test SOURCES unit/json_schema_test.cpp LIBS emu_test_process LABELS unit)

emu_add_unit_test(emu_cli_test SOURCES e2e/cli_test.cpp LIBS emu_test_process emu_device nlohmann_json::nlohmann_json
                  LABELS e2e TIMEOUT 300)
add_dependencies(emu_cli_test emu)

emu_add_unit_test(emu_run_test SOURCES e2e/run_test.cpp LIBS emu_test_process nlohmann_json::nlohmann_json
                  LABELS e2e TIMEOUT 600 SEPARATE *BadInputRanks.* Plan.*)
add_dependencies(emu_run_test emu)

emu_add_unit_test(emu_trace_test SOURCES e2e/trace_test.cpp LIBS emu_test_process nlohmann_json::nlohmann_json
                  LABELS e2e TIMEOUT 300)
add_dependencies(emu_trace_test emu)

emu_add_unit_test(emu_fault_test SOURCES e2e/fault_test.cpp LIBS emu_test_process nlohmann_json::nlohmann_json
                  LABELS e2e TIMEOUT 300)
add_dependencies(emu_fault_test emu)

emu_add_unit_test(emu_inputs_test SOURCES e2e/inputs_test.cpp LIBS emu_test_process emu_workloads
                  nlohmann_json::nlohmann_json LABELS e2e TIMEOUT 600)
add_dependencies(emu_inputs_test emu)

emu_add_unit_test(emu_outputs_test SOURCES e2e/outputs_test.cpp LIBS emu_test_process LABELS e2e TIMEOUT 600)
add_dependencies(emu_outputs_test emu)

emu_add_unit_test(emu_allocator_test SOURCES e2e/allocator_test.cpp LIBS emu_test_process nlohmann_json::nlohmann_json
                  LABELS e2e TIMEOUT 300)
add_dependencies(emu_allocator_test emu)

# emu against numbers recorded from real PyTorch and DeepSpeed (tests/data/oracle/, scripts/oracle/).
emu_add_unit_test(framework_oracle_test SOURCES e2e/framework_oracle_test.cpp oracle/memory_oracle.cpp
                  LIBS emu_test_process fmt::fmt nlohmann_json::nlohmann_json LABELS e2e TIMEOUT 300)
add_dependencies(framework_oracle_test emu)

# The course (docs/course/*.md): every command of its lessons runs and prints what the lesson says to look for.
add_test(NAME course COMMAND ${PROJECT_SOURCE_DIR}/tests/e2e/course.sh ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/bin)
set_tests_properties(course PROPERTIES LABELS "e2e" TIMEOUT 600 COST 600 PROCESSORS 4 ENVIRONMENT "${EMU_MPIEXEC_ENV}")

# The advisor: advice when nothing fits, each suggestion's command line run and held to what the advice said.
emu_add_unit_test(emu_advisor_test SOURCES e2e/advisor_test.cpp LIBS emu_test_process nlohmann_json::nlohmann_json
                  LABELS e2e TIMEOUT 600)
add_dependencies(emu_advisor_test emu)
