# The two commands: `make run` (main job) and `make test` (whole suite). `make bench` runs the
# long benchmarks against their baselines; `make sanitize` runs the suite under ASan+UBSan and the
# threaded tests under TSan (build-asan/, build-tsan/); `make deps` installs missing Debian packages.
BUILD ?= build
MESON_OPTS ?= --wrap-mode=nofallback
TRACE ?= ../shared/data/mooncake_conversation_trace.jsonl
PROFILE ?= profiles/default.json

.PHONY: all deps build run test sanitize bench clean

all: build

deps:
	@.ci/install-deps

$(BUILD)/build.ninja:
	meson setup $(BUILD) $(MESON_OPTS)

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

run: build
	@if [ -f "$(TRACE)" ]; then \
	  echo "== tierbench replay of $(TRACE) on $(PROFILE)"; \
	  $(BUILD)/apps/tierbench/tierbench replay --profile $(PROFILE) --trace $(TRACE); \
	else \
	  echo "== tierbench replay (built-in conversation workload) on $(PROFILE)"; \
	  $(BUILD)/apps/tierbench/tierbench replay --profile $(PROFILE); \
	fi

test: build
	@.ci/test $(BUILD)

sanitize: deps
	@.ci/sanitize

bench: build
	@.ci/bench $(BUILD)

clean:
	rm -rf $(BUILD) $(BUILD)-hip-check
