# The front end's readers of user input (app/): DeepSpeed configs as DeepSpeed and the Hugging Face Trainer mean them.
emu_add_unit_test(app_deepspeed_config_test SOURCES unit/deepspeed_config_test.cpp LIBS emu_app emu_test_process LABELS app)
# The memory picture's axis of phases (app/svg.cpp), on outcomes made by hand.
emu_add_unit_test(app_svg_axis_test SOURCES unit/svg_axis_test.cpp LIBS emu_app LABELS app)
# pp planned at full scale: llama2-70b on 8 × H100-80GB, 16 bytes per parameter of each stage, by hand.
emu_add_unit_test(app_pipeline_plan_test SOURCES unit/pipeline_plan_test.cpp LIBS emu_app LABELS app)
# The step-time model (app/step_time.h): a GEMM's roofline, a ring all-reduce over NVLink, bucket overlap, by hand.
emu_add_unit_test(app_step_time_test SOURCES unit/step_time_test.cpp LIBS emu_app LABELS app)
# Published throughputs (torchtitan, llm-foundry) and nccl-tests bus bandwidths beside emu's predictions for the same
# configurations: the README's table, recomputed (it prints it).
emu_add_unit_test(app_published_throughput_test SOURCES unit/published_throughput_test.cpp LIBS emu_app LABELS app)
# tp planned at full scale: llama2-70b's local parameters by hand, Megatron's vocabulary padding.
emu_add_unit_test(app_tensor_plan_test SOURCES unit/tensor_plan_test.cpp LIBS emu_app LABELS app)
# PyTorch DDP's autocast recipe for Gemma 2 planned at full scale: gemma-2-9b's saved bytes per block, by hand.
emu_add_unit_test(app_autocast_plan_test SOURCES unit/autocast_plan_test.cpp LIBS emu_app LABELS app)
