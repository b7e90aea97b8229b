# cmake -P script: Result/Status are [[nodiscard]]. The compiler must reject a dropped
# Status under -Werror=unused-result and accept the same call when its Status is used
# (so the failure is the attribute, not a broken include path).
function(compile src expect_ok)
  execute_process(COMMAND ${CXX} -std=c++23 -fsyntax-only -Werror=unused-result -I${INCLUDE_DIR} ${src}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(expect_ok AND NOT rc EQUAL 0)
    message(FATAL_ERROR "${src} should compile:\n${err}")
  elseif(NOT expect_ok AND (rc EQUAL 0 OR NOT err MATCHES "nodiscard"))
    message(FATAL_ERROR "${src} should be rejected for a dropped [[nodiscard]] Status (rc ${rc}):\n${err}")
  endif()
endfunction()
compile(${SOURCE_DIR}/kept_status.cc TRUE)
compile(${SOURCE_DIR}/dropped_status.cc FALSE)
message(STATUS "a dropped Status is rejected, a used one compiles")
