# Thin front for CMake: `make` builds, `make test` runs every test, `make demo` runs the
# main job. Each first installs the Debian packages it needs (scripts/install-deps).
BUILD ?= build
CMAKE_FLAGS ?=
# UCX names the UCX kvx builds against. wheel (the default): UCX 1.22 from PyPI's libucx-cu12
# wheel, installed once into the project's .venv-ucx (scripts/install-deps --ucx-wheel), the
# UCX kvx measures best on for engines' memory (docs/performance.md); system: the system's
# (1.13 on Debian 12, with verbs); any other value: the prefix of a UCX installed there.
UCX ?= wheel
ifeq ($(UCX),wheel)
ucx_root_cmd = scripts/install-deps --ucx-wheel
else ifeq ($(UCX),system)
ucx_root_cmd = echo
else
ucx_root_cmd = echo $(abspath $(UCX))
endif

.PHONY: all build configure test demo bench clean deps format

all: build

deps:
	@scripts/install-deps --check >/dev/null 2>&1 || scripts/install-deps

# Configures $(BUILD) when it is new, or when it was configured against another UCX than $(UCX)
# names: a build directory from before the default changed would otherwise stay on the old
# one. The prefix is resolved here, not when make reads this file, so that `make clean` installs
# nothing and a failed wheel install stops the build instead of leaving it on the system's.
configure: deps
	@root=$$($(ucx_root_cmd)) || exit 1; \
	if [ ! -f $(BUILD)/CMakeCache.txt ] || \
	   [ "$$(sed -n 's/^KVX_UCX_ROOT:PATH=//p' $(BUILD)/CMakeCache.txt)" != "$$root" ]; then \
	  echo cmake -S . -B $(BUILD) $(CMAKE_FLAGS) -DKVX_UCX_ROOT="$$root"; \
	  cmake -S . -B $(BUILD) $(CMAKE_FLAGS) -DKVX_UCX_ROOT="$$root"; \
	fi

build: configure
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
