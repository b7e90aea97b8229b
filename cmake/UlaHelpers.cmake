# ula_add_component(NAME DEPS...)
#   A static library `ula_NAME` built from every *.cc of the calling folder (not its
#   subfolders), public headers in include/. It joins ULA_COMPONENTS so that `ula::ula`
#   links it. Adding a source file to a component never edits a CMakeLists.txt.
function(ula_add_component name)
  cmake_parse_arguments(ARG "" "" "DEPS" ${ARGN})
  file(GLOB sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cc)
  if(NOT sources)
    message(STATUS "component ${name}: no sources yet, skipped")
    return()
  endif()
  add_library(ula_${name} STATIC ${sources})
  # The TSan tree builds only the threaded tests, and a library only when one of them links it.
  if(ULA_SANITIZE MATCHES "thread")
    set_target_properties(ula_${name} PROPERTIES EXCLUDE_FROM_ALL ON)
  endif()
  target_include_directories(ula_${name}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(ula_${name} PUBLIC ${ARG_DEPS})
  if(ULA_SANITIZE AND ULA_SANITIZE_LIB_OPT_FLAGS)  # the top CMakeLists.txt says why
    separate_arguments(lib_opt UNIX_COMMAND "${ULA_SANITIZE_LIB_OPT_FLAGS}")
    target_compile_options(ula_${name} PRIVATE ${lib_opt})
  endif()
  # Exported: a consumer of the installed package compiles the headers as C++23.
  target_compile_features(ula_${name} PUBLIC cxx_std_23)
  set(ULA_COMPONENTS ${ULA_COMPONENTS} ula_${name} PARENT_SCOPE)
endfunction()

# ula_add_test(NAME SOURCES... LIBS... [THREADED] [TIMEOUT seconds] [COST seconds])
#   One GoogleTest executable registered with ctest. THREADED tests also run under
#   ThreadSanitizer; in the TSan tree only THREADED tests are built.
function(ula_add_test name)
  cmake_parse_arguments(ARG "THREADED" "TIMEOUT;COST" "SOURCES;LIBS" ${ARGN})
  if(ULA_SANITIZE MATCHES "thread" AND NOT ARG_THREADED)
    return()
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  # Every test compiles with the one precompiled header (tests/CMakeLists.txt) and OpenMP,
  # so that its flags are the header's.
  target_link_libraries(${name} PRIVATE OpenMP::OpenMP_CXX)
  if(TARGET ula_test_pch)
    target_precompile_headers(${name} REUSE_FROM ula_test_pch)
  endif()
  if(TARGET ula_tsan_gomp_annotations)
    target_link_libraries(${name} PRIVATE ula_tsan_gomp_annotations)
  endif()
  # The release tree compiles a test's own sources at -O1 (its set-up, drivers and
  # assertions; the libraries under test stay -O3): 30-50 % less compile time per test
  # source (docs/BENCHMARKS.md, "The test loop"), and no test is timed.
  if(CMAKE_BUILD_TYPE STREQUAL "Release" AND NOT ULA_SANITIZE)
    target_compile_options(${name} PRIVATE -O1)
  endif()
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  set(labels unit)
  if(ARG_THREADED)
    list(APPEND labels threaded)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${labels}")
  # COST: a fresh clone has no ctest cost data, so `ctest -j` starts tests in declaration
  # order and would leave the longest running alone at the end; a COST (seconds in the
  # sanitizer trees, from a fresh-clone run's CTestCostData) starts them first.
  if(ARG_COST)
    set_tests_properties(${name} PROPERTIES COST ${ARG_COST})
  endif()
  # A randomized program (one of its sources includes tests/test_seed.h) must refuse a
  # malformed ULA_TEST_SEED in every test that draws a seed (scripts/check_seed_refusal.py).
  # Checked in the unsanitized tree only: the refusal is the program's own logic, the same in
  # every tree, and the check runs the whole program (each test that draws no seed runs in
  # full), which costs a sanitized tree a second run of it (docs/BENCHMARKS.md "The test loop").
  if(ULA_SANITIZE)
    return()
  endif()
  foreach(src ${ARG_SOURCES})
    file(READ ${CMAKE_CURRENT_SOURCE_DIR}/${src} text)
    string(FIND "${text}" "#include \"test_seed.h\"" at)
    if(NOT at EQUAL -1)
      find_package(Python3 REQUIRED COMPONENTS Interpreter)
      add_test(NAME test_seed_refuses_malformed_${name}
               COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/check_seed_refusal.py $<TARGET_FILE:${name}>)
      set_tests_properties(test_seed_refuses_malformed_${name} PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${labels};seed")
      if(ARG_THREADED)
        set_tests_properties(test_seed_refuses_malformed_${name} PROPERTIES ENVIRONMENT OMP_WAIT_POLICY=passive)
      endif()
      break()
    endif()
  endforeach()
endfunction()

# ula_add_mpi_test(NAME NP n COMMAND cmd... [LAUNCHER wrapper...] [PASS_REGULAR_EXPRESSION re]
#                  [TIMEOUT seconds])
#   `cmd` under mpirun with n processes (`wrapper... mpirun ... cmd` with a LAUNCHER) (--allow-run-as-root --oversubscribe: CI runs as
#   root on 2 cores), labelled `mpi`. Never in the sanitizer trees (OpenMPI is not
#   sanitizer-clean) nor with -DULA_WITH_MPI=OFF. When MPI or mpirun was not found
#   (ULA_MPI_MISSING, src/tp/mpi), the test is registered anyway and fails with the
#   reason: MPI tests never silently disappear.
function(ula_add_mpi_test name)
  cmake_parse_arguments(ARG "" "NP;TIMEOUT;PASS_REGULAR_EXPRESSION" "COMMAND;LAUNCHER" ${ARGN})
  if(ULA_SANITIZE OR NOT ULA_WITH_MPI)
    return()
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  if(ULA_MPI_MISSING)
    add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} "-DMESSAGE=${name}: ${ULA_MPI_MISSING}"
                                  -P ${PROJECT_SOURCE_DIR}/cmake/FailTest.cmake)
  else()
    add_test(NAME ${name} COMMAND ${ARG_LAUNCHER} ${ULA_MPIRUN} --allow-run-as-root --oversubscribe -np ${ARG_NP} ${ARG_COMMAND})
    if(ARG_PASS_REGULAR_EXPRESSION)
      set_tests_properties(${name} PROPERTIES PASS_REGULAR_EXPRESSION "${ARG_PASS_REGULAR_EXPRESSION}")
    endif()
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "mpi")
endfunction()
