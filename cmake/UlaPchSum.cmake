# The checksum file ccache reads instead of a precompiled header (ccache.conf,
# pch_external_checksum; docs/BENCHMARKS.md, "The test loop").
#
# On a cache hit ccache checks every file the cached object was compiled from, and a
# precompiled header is one of them: 114 MB for the tests' header, hashed again by every
# test source of every tree, about one second each. With pch_external_checksum ccache hashes
# `<header>.gch.sum` instead, when it exists. This file writes it: the SHA-256 of the .gch's
# bytes, so two clones whose headers are the same bytes share entries, and a changed header
# changes the sum.
#
# ula_pch_sum(TARGET) runs after TARGET is built, so every target that reuses TARGET's
# header (REUSE_FROM, which depends on TARGET) compiles with the sum of the header it uses.
# TARGET's own sources compile before the sum is rewritten: its one source must include
# nothing of its own (tests/test_pch.cc, tools/ula/pch/cli_pch.cc).
#
# Script mode: cmake -DGCH=<path to .gch> -P UlaPchSum.cmake
if(CMAKE_SCRIPT_MODE_FILE)
  if(EXISTS "${GCH}")
    file(SHA256 "${GCH}" sum)
    set(old "")
    if(EXISTS "${GCH}.sum")
      file(READ "${GCH}.sum" old)
    endif()
    if(NOT old STREQUAL sum)
      file(WRITE "${GCH}.sum" "${sum}")
    endif()
  else()
    file(REMOVE "${GCH}.sum")
  endif()
  return()
endif()

function(ula_pch_sum target)
  set(gch "${CMAKE_CURRENT_BINARY_DIR}/CMakeFiles/${target}.dir/cmake_pch.hxx.gch")
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -DGCH=${gch} -P ${PROJECT_SOURCE_DIR}/cmake/UlaPchSum.cmake
    VERBATIM)
endfunction()
