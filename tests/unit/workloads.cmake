# The scaled-down transformer (workloads/model): layers, whole-model gradients, shapes and presets, memory
# accounting and shrinking, training.
emu_add_unit_test(model_layers_test SOURCES unit/model_layers_test.cpp LIBS emu_workloads LABELS model)
emu_add_unit_test(model_grad_test SOURCES unit/model_grad_test.cpp LIBS emu_workloads LABELS model)
emu_add_unit_test(model_config_test SOURCES unit/model_config_test.cpp LIBS emu_workloads emu_test_process LABELS model)
emu_add_unit_test(model_memory_test SOURCES unit/model_memory_test.cpp LIBS emu_workloads LABELS model)
emu_add_unit_test(model_train_test SOURCES unit/model_train_test.cpp LIBS emu_workloads LABELS model)
emu_add_unit_test(model_ops_test SOURCES unit/model_ops_test.cpp LIBS emu_workloads LABELS model)
# Against the saved activations and loss bytes recorded from Hugging Face's modelling code
# (scripts/oracle/saved_activations.py, fixture in tests/data/oracle/).
emu_add_unit_test(hf_oracle_test SOURCES unit/hf_oracle_test.cpp LIBS emu_workloads nlohmann_json::nlohmann_json
                  LABELS model)
# Against transformers' loss on tiny models of every accepted family (scripts/oracle/hf_loss.py, fixture in
# tests/data/oracle/hf_loss.json).
emu_add_unit_test(hf_loss_test SOURCES unit/hf_loss_test.cpp LIBS emu_workloads emu_test_process nlohmann_json::nlohmann_json
                  LABELS model)
