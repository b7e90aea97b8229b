# The linker of every tree: LLVM's lld where the C++ compiler takes -fuse-ld=lld (Debian's
# `lld`, deps/debian-packages.txt), else GNU gold (binutils' ld.gold, which build-essential
# brings), else the compiler's default (GNU ld).
#   ULA_LINKER=AUTO (default) lld, else gold, where it links; LLD or GOLD requires that
#   linker; DEFAULT the compiler's own. Another value is refused.
# A warm build compiles nothing (ccache hits) and spends its time linking some 60 programs
# against the static libraries: gold links them in about half of ld's time, lld in about half
# of gold's (docs/BENCHMARKS.md, "The test loop"). Only links the C++ compiler drives take the
# flag (nvcc does not know it).
set(ULA_LINKER "AUTO" CACHE STRING "The linker: AUTO (lld, else gold, where it links), LLD, GOLD or DEFAULT")
set_property(CACHE ULA_LINKER PROPERTY STRINGS AUTO LLD GOLD DEFAULT)
set(ULA_LINKER_USED "default")
if(NOT ULA_LINKER MATCHES "^(AUTO|LLD|GOLD|DEFAULT)$")
  message(FATAL_ERROR "ULA_LINKER must be AUTO, LLD, GOLD or DEFAULT, not '${ULA_LINKER}'")
elseif(NOT ULA_LINKER STREQUAL "DEFAULT")
  include(CheckLinkerFlag)
  if(ULA_LINKER MATCHES "^(AUTO|LLD)$")
    check_linker_flag(CXX -fuse-ld=lld ULA_LLD_LINKS)
    if(ULA_LLD_LINKS)
      set(ULA_LINKER_USED "lld")
    elseif(ULA_LINKER STREQUAL "LLD")
      message(FATAL_ERROR "ULA_LINKER=LLD but ${CMAKE_CXX_COMPILER} cannot link with -fuse-ld=lld (Debian's lld)")
    endif()
  endif()
  if(ULA_LINKER MATCHES "^(AUTO|GOLD)$" AND ULA_LINKER_USED STREQUAL "default")
    check_linker_flag(CXX -fuse-ld=gold ULA_GOLD_LINKS)
    if(ULA_GOLD_LINKS)
      set(ULA_LINKER_USED "gold")
    elseif(ULA_LINKER STREQUAL "GOLD")
      message(FATAL_ERROR
              "ULA_LINKER=GOLD but ${CMAKE_CXX_COMPILER} cannot link with -fuse-ld=gold (binutils' ld.gold)")
    endif()
  endif()
  if(NOT ULA_LINKER_USED STREQUAL "default")
    add_link_options($<$<LINK_LANGUAGE:CXX>:-fuse-ld=${ULA_LINKER_USED}>)
  endif()
endif()
message(STATUS "ULA_LINKER=${ULA_LINKER}: linking with ${ULA_LINKER_USED}")
