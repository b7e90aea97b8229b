# cmake -P script: install, then configure, build and run against the installed package
# (as an engine's build would, with no C++ standard set by the consumer: the exported
# targets require C++23):
#   1. the tiny consumer of ula::ula (tests/install/consumer);
#   2. the README's examples (examples/cpp): dp, tp_local_buffer, tp_at_home, and, when
#      the package has ula::mpi (HAS_MPI), tp_mpi under `MPIRUN -np 2`.
# CCACHE (the program, or empty), CCACHE_CONFIG and CCACHE_BASE: both builds compile through
# the project's compiler cache (cmake/UlaCcache.cmake), its settings in their environment.
file(REMOVE_RECURSE ${WORK_DIR})
set(launcher "")
set(build_env ${CMAKE_COMMAND} -E env)
if(CCACHE)
  set(launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE})
  list(APPEND build_env CCACHE_CONFIGPATH=${CCACHE_CONFIG} CCACHE_BASEDIR=${CCACHE_BASE})
endif()
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
run(${CMAKE_COMMAND} --install ${ULA_BUILD_DIR} --prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix ${launcher})
run(${build_env} ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/ula_consumer)
# The Python package lands in the prefix's site-packages and imports from there. (No ';'
# in the code: run() passes its arguments on as a CMake list.)
if(PYTHON)
  run(${CMAKE_COMMAND} -E env PYTHONPATH=${WORK_DIR}/prefix/${PYTHON_INSTALL_DIR} PYTHONDONTWRITEBYTECODE=1
      ${PYTHON} -c "
import sys
import ulacache
assert ulacache.__file__.startswith(sys.argv[1]), ulacache.__file__
assert ulacache.DESCRIPTOR_DTYPE.itemsize == 48
print('ulacache imported from the prefix:', ulacache.__file__[len(sys.argv[1]):])
" ${WORK_DIR}/prefix)
endif()

run(${CMAKE_COMMAND} -S ${EXAMPLES_SOURCE_DIR} -B ${WORK_DIR}/examples -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix ${launcher})
run(${build_env} ${CMAKE_COMMAND} --build ${WORK_DIR}/examples)
foreach(example dp tp_local_buffer tp_at_home)
  run(${WORK_DIR}/examples/${example})
endforeach()
if(HAS_MPI)
  if(NOT EXISTS ${WORK_DIR}/examples/tp_mpi)
    message(FATAL_ERROR "the package has ula::mpi but examples/cpp built no tp_mpi")
  endif()
  if(MPIRUN)
    run(${MPIRUN} --allow-run-as-root --oversubscribe -np 2 ${WORK_DIR}/examples/tp_mpi)
  endif()
endif()
