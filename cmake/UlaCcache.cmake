# The compiler cache: ccache as the C++ (and CUDA) compiler launcher, set up by the project
# so that nothing is done by hand and a fresh clone in another folder hits what an earlier
# clone compiled (docs/BENCHMARKS.md, "The test loop").
#
# ULA_CCACHE: AUTO (use ccache where it is found, the default), ON (required) or OFF.
# The launcher runs ccache through `cmake -E env` with
#   CCACHE_CONFIGPATH  the repository's ccache.conf (Debian 12's ccache 4.7 takes no
#                      key=value settings on its command line);
#   CCACHE_BASEDIR     this clone's root, so absolute paths under it hash as relative ones.
# The cache directory is ccache's default: it outlives the clone.
set(ULA_CCACHE "AUTO" CACHE STRING "Compile through ccache: AUTO (where found), ON or OFF")
set_property(CACHE ULA_CCACHE PROPERTY STRINGS AUTO ON OFF)
set(ULA_CCACHE_ENABLED OFF)
if(NOT ULA_CCACHE STREQUAL "OFF")
  find_program(ULA_CCACHE_PROGRAM ccache)
  if(ULA_CCACHE_PROGRAM)
    set(ula_launcher ${CMAKE_COMMAND} -E env CCACHE_CONFIGPATH=${PROJECT_SOURCE_DIR}/ccache.conf
                     CCACHE_BASEDIR=${PROJECT_SOURCE_DIR} ${ULA_CCACHE_PROGRAM})
    set(CMAKE_CXX_COMPILER_LAUNCHER ${ula_launcher})
    set(CMAKE_CUDA_COMPILER_LAUNCHER ${ula_launcher})
    set(ULA_CCACHE_ENABLED ON)
  elseif(ULA_CCACHE STREQUAL "ON")
    message(FATAL_ERROR "ULA_CCACHE=ON but ccache was not found (deps/debian-packages.txt lists it)")
  endif()
endif()
# Debug info names files relative to the clone's root, so that the object is the same
# whichever folder compiled it (and a cached one is right for every clone).
add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fdebug-prefix-map=${PROJECT_SOURCE_DIR}=.>)
message(STATUS "ULA_CCACHE=${ULA_CCACHE}: compiler cache ${ULA_CCACHE_ENABLED}")
