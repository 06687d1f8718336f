# Workload support around the model: AdamW and precision recipes, token data, safetensors.
emu_add_unit_test(optim_adamw_test SOURCES unit/optim_adamw_test.cpp LIBS emu_workloads)
emu_add_unit_test(optim_state_test SOURCES unit/optim_state_test.cpp LIBS emu_workloads)
emu_add_unit_test(data_synthetic_test SOURCES unit/data_synthetic_test.cpp LIBS emu_workloads)
emu_add_unit_test(data_token_file_test SOURCES unit/data_token_file_test.cpp LIBS emu_workloads)
emu_add_unit_test(safetensors_roundtrip_test SOURCES unit/safetensors_roundtrip_test.cpp LIBS emu_workloads)
emu_add_unit_test(safetensors_malformed_test SOURCES unit/safetensors_malformed_test.cpp LIBS emu_workloads)
emu_add_unit_test(model_weights_test SOURCES unit/model_weights_test.cpp LIBS emu_workloads)
