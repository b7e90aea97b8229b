# cmake -P script: install, configure the consumer against the installed package, build, run.
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
run(${CMAKE_COMMAND} --install ${ULA_BUILD_DIR} --prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
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
