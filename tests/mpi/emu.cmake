# Agreement across ranks on errors, node-local groups.
emu_add_mpi_test(emu_mpi_env_test SOURCES mpi/mpi_env_test.cpp LIBS emu_device)
