# LaissezCloud. `make demo` and `make test` work on a fresh Debian machine:
# each target installs missing Debian packages first (scripts/install-deps.sh).
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test test-asan bench reliability fuzz clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j$(JOBS)

demo: build
	./$(BUILD)/laissez demo story

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

# The same tests under AddressSanitizer and UndefinedBehaviorSanitizer.
test-asan: deps
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DLAISSEZ_SANITIZE=ON -DLAISSEZ_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug"

bench: build
	./$(BUILD)/laissez bench engine --nodes 100000 --ops 2000000

# Crash recovery under load with 100 SIGKILL points (CI runs 3 in `make test`).
reliability: build
	bash tests/reliability/crash_recovery.sh --points 100 --build $(BUILD)

# libFuzzer over request decoding and validation (clang++), bounded in time.
FUZZ_SECONDS ?= 60
fuzz: build
	bash tests/fuzz/run.sh $(BUILD) $(FUZZ_SECONDS)

clean:
	rm -rf build build-asan
