# A test that fails and says why: ctest runs `cmake -DMESSAGE=... -P FailTest.cmake` in the
# place of a test that cannot run in this tree (ula_add_mpi_test when MPI is missing).
message(FATAL_ERROR "${MESSAGE}")
