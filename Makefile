# The two commands: `make run` and `make test`. Both install missing Debian packages
# (deps/debian-packages.txt), build, and then run the main job or every test.
JOBS   ?= $(shell nproc)
BUILD  ?= build
ASAN   ?= build-asan
TSAN   ?= build-tsan
ULA     = $(BUILD)/tools/ula/ula

.PHONY: all deps build run test test-release test-asan test-tsan bench mutation fuzz clean

all: build

# Every phase of `make test` runs under scripts/phase.sh, which records its wall time; `make
# test` ends by printing them with the compiler cache's hit rate (docs/BENCHMARKS.md, "The
# test loop"). ULA_CCACHE=AUTO|ON|OFF (cmake/UlaCcache.cmake) passes through to every tree.
PHASE       = ./scripts/phase.sh run
ULA_CCACHE ?= AUTO

deps:
	@$(PHASE) "packages" ./scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DULA_CCACHE=$(ULA_CCACHE) >/dev/null
	@$(PHASE) "release: build" cmake --build $(BUILD) -j $(JOBS)

# The main job on the embedded default: one process, CPU backend — the serving comparison
# (tables on stdout, CSV and one PNG per config in compare-out/).
run: build
	$(ULA) compare

test:
	@./scripts/phase.sh start
	@$(MAKE) --no-print-directory test-release test-asan test-tsan; rc=$$?; ./scripts/phase.sh report; \
	  if [ $$rc -ne 0 ]; then exit $$rc; fi
	@echo "all test trees passed (release, asan+ubsan, tsan)"

test-release: build
	@$(PHASE) "release: tests" ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# AddressSanitizer + UndefinedBehaviorSanitizer: the whole suite, in its own tree (its `ula`
# has no bench subcommands, ULA_CLI_BENCH; the verifiers run fewer ops there: BENCHMARKS.md).
test-asan: deps
	@cmake -S . -B $(ASAN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DULA_SANITIZE=address,undefined -DULA_BUILD_BENCH=OFF \
	  -DULA_CCACHE=$(ULA_CCACHE) >/dev/null
	@$(PHASE) "asan+ubsan: build" cmake --build $(ASAN) -j $(JOBS)
	@$(PHASE) "asan+ubsan: tests" ctest --test-dir $(ASAN) --output-on-failure -j $(JOBS)

# ThreadSanitizer: the tests of threaded code (labelled `threaded`), with libgomp's fork, join
# and barriers annotated for TSan (tests/tsan_gomp_annotations.cc).
test-tsan: deps
	@cmake -S . -B $(TSAN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DULA_SANITIZE=thread -DULA_BUILD_BENCH=OFF -DULA_BUILD_TOOLS=OFF \
	  -DULA_CCACHE=$(ULA_CCACHE) >/dev/null
	@$(PHASE) "tsan: build" cmake --build $(TSAN) -j $(JOBS)
	@$(PHASE) "tsan: tests" ctest --test-dir $(TSAN) --output-on-failure -j $(JOBS) -L threaded

# Deliberate bugs (tests/mutations.json), one at a time, each rebuilt in its own tree
# (build-mutation/) with the tests that must catch it: prints `caught N of N`. Not part of
# `make test` (it rebuilds once per mutation).
mutation: deps
	python3 scripts/mutation.py --jobs $(JOBS)

# libFuzzer harnesses (fuzz/), built with Debian's clang-19 in their own tree, each run for
# FUZZ_SECONDS from the committed corpus (scripts/fuzz.sh). `make test` only replays the
# corpora (ctest fuzz_replay_*, plain g++), it never fuzzes.
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
fuzz:
	@./scripts/install-deps.sh fuzz
	@cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-19 -DULA_FUZZ=ON \
	  -DULA_BUILD_TESTS=OFF -DULA_BUILD_TOOLS=OFF -DULA_BUILD_BENCH=OFF -DULA_WITH_MPI=OFF >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS)
	./scripts/fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

bench: build
	$(BUILD)/bench/ula_bench

clean:
	rm -rf $(BUILD) $(ASAN) $(TSAN) build-mutation build-fuzz
