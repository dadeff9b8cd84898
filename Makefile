# Thin front for CMake: `make` builds, `make test` runs every test, `make demo` runs the
# main job. Each first installs the Debian packages it needs (scripts/install-deps).
BUILD ?= build
CMAKE_FLAGS ?=
# UCX=wheel builds against UCX 1.22 from PyPI's libucx wheel (scripts/install-deps
# --ucx-wheel) instead of the system's; UCX=PREFIX against a UCX installed there.
UCX ?= system
ifeq ($(UCX),wheel)
override CMAKE_FLAGS += -DKVX_UCX_ROOT=$(shell scripts/install-deps --ucx-wheel)
else ifneq ($(UCX),system)
override CMAKE_FLAGS += -DKVX_UCX_ROOT=$(UCX)
endif

.PHONY: all build test demo bench clean deps format

all: build

deps:
	@scripts/install-deps --check >/dev/null 2>&1 || scripts/install-deps

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j$$(nproc)

test: build
	cd $(BUILD) && ctest --output-on-failure -j$$(nproc)

demo: build
	$(BUILD)/kvx demo

bench: build
	$(BUILD)/bench/bench_register
	@echo "transfers: $(BUILD)/kvx bench [--workload]; against the machine's limits: bench/limits.sh $(BUILD)"

format:
	clang-format -i include/*.h src/*.[ch] tools/*.[ch] tests/*.[ch] tests/support/*.[ch] bench/*.c fuzz/*.c

clean:
	rm -rf $(BUILD)
