# Thin wrapper around the README's two commands.
#   make run   — install what is missing, build, fetch the default model, run the main job
#   make test  — install what is missing, build, run every test (and the fuzzers, briefly)
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps build models run test fuzz format clean

all: build

deps:
	bash scripts/deps.sh

build: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

models: build
	bash scripts/fetch_model.sh $(BUILD)/smolrt || echo "models: default model unavailable; commands fall back to synth" >&2

run: models
	bash scripts/main_job.sh $(BUILD)/smolrt

test: models
	bash scripts/test.sh $(BUILD)

fuzz: deps
	bash scripts/fuzz.sh

format: build
	cmake --build $(BUILD) --target format

clean:
	rm -rf $(BUILD) build-fuzz
