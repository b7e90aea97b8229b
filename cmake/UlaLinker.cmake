# The linker of every tree: GNU gold where the C++ compiler takes -fuse-ld=gold (binutils,
# which build-essential brings), else the compiler's default (GNU ld).
#   ULA_LINKER=AUTO (default) gold where it links, DEFAULT the compiler's own, GOLD requires it.
# A warm build compiles nothing (ccache hits) and spends its time linking some 60 programs
# against the static libraries; gold links them in about half of ld's time (docs/BENCHMARKS.md,
# "The test loop"). Only links the C++ compiler drives take the flag (nvcc does not know it).
set(ULA_LINKER "AUTO" CACHE STRING "The linker: AUTO (gold where it links), GOLD or DEFAULT")
set_property(CACHE ULA_LINKER PROPERTY STRINGS AUTO GOLD DEFAULT)
set(ULA_LINKER_USED "default")
if(NOT ULA_LINKER MATCHES "^(AUTO|GOLD|DEFAULT)$")
  message(FATAL_ERROR "ULA_LINKER must be AUTO, GOLD or DEFAULT, not '${ULA_LINKER}'")
elseif(NOT ULA_LINKER STREQUAL "DEFAULT")
  include(CheckLinkerFlag)
  check_linker_flag(CXX -fuse-ld=gold ULA_GOLD_LINKS)
  if(ULA_GOLD_LINKS)
    add_link_options($<$<LINK_LANGUAGE:CXX>:-fuse-ld=gold>)
    set(ULA_LINKER_USED "gold")
  elseif(ULA_LINKER STREQUAL "GOLD")
    message(FATAL_ERROR "ULA_LINKER=GOLD but ${CMAKE_CXX_COMPILER} cannot link with -fuse-ld=gold (binutils' ld.gold)")
  endif()
endif()
message(STATUS "ULA_LINKER=${ULA_LINKER}: linking with ${ULA_LINKER_USED}")
