// The ASan tree's run-time defaults, compiled into each of its programs (CMakeLists.txt,
// ULA_ASAN_OPTIONS): ASan reads them before $ASAN_OPTIONS, which still overrides them.
//
// quarantine_size_mb=16 (ASan's default is 256): a freed block stays poisoned until 16 MiB of
// later frees have pushed it out, so a use after free is reported within that distance
// (tests/asan: asan_use_after_free_is_reported, after 4 MiB). The suite allocates and frees whole
// pools per run; at 256 MiB the quarantine's recycling was a quarter of the ASan tree's CPU
// (docs/BENCHMARKS.md, "The test loop").
extern "C" const char* __asan_default_options() { return ULA_ASAN_OPTIONS; }
