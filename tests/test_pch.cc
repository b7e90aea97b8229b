// The one source of ula_test_pch (tests/CMakeLists.txt), an executable of no tests: it
// exists to build the precompiled header every test reuses.
