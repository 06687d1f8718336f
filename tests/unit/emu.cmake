# The emulated device: capped memory, categories, OOM errors, cap specifications, bf16.
emu_add_unit_test(emu_memory_test SOURCES unit/memory_test.cpp LIBS emu_device)
emu_add_unit_test(emu_cap_spec_test SOURCES unit/cap_spec_test.cpp LIBS emu_device)
# The hardware descriptions (hardware/*.json): read, consistent, refused by field when edited wrong.
emu_add_unit_test(emu_hardware_test SOURCES unit/hardware_test.cpp LIBS emu_device emu_test_process)
emu_add_unit_test(emu_dtype_test SOURCES unit/dtype_test.cpp LIBS emu_device)
# The run header's BLAS line: OpenBLAS kernels that leave the CPU's vector units unused, and the core to name.
emu_add_unit_test(emu_blas_info_test SOURCES unit/blas_info_test.cpp LIBS emu_device emu_openblas)
# The CPU attention's score products written out: in order, fused, causal only, sgemm's bits.
emu_add_unit_test(emu_cpu_ordered_products_test SOURCES unit/cpu_ordered_products_test.cpp LIBS emu_device emu_openblas)
emu_add_unit_test(emu_caching_allocator_test SOURCES unit/caching_allocator_test.cpp LIBS emu_device)
# Where MPI placed the ranks: hosts as nodes of consecutive ranks, or not.
emu_add_unit_test(emu_placement_test SOURCES unit/placement_test.cpp LIBS emu_device)
