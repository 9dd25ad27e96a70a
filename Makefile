# The two commands of the README: `make demo` and `make test`. Both create the environment first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lock proto vendor bench-peers perf-analyzer train-deps audit clean

# scripts/install.sh is the one install: the Dockerfile's images run it too.
$(STAMP): requirements/lock.txt pyproject.toml scripts/install.sh
	PYTHON="$(PYTHON)" sh scripts/install.sh $(VENV) dev
	touch $(STAMP)

## Run the control plane on embedded defaults (SQLite, in-memory channel layer, in-process tasks) with the demo fleet.
demo: $(STAMP)
	$(BIN)/tessera demo

## Run the whole test suite (service-backed tests use DATABASE_URL / REDIS_URL when set, else skip) on
## TEST_WORKERS pytest-xdist processes, each with its own test database (docs/testing.md).
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

## The inner loop, within two minutes: the engine and the unit tests, without PostgreSQL, Redis, Celery,
## Chromium or the tests that start real processes (the `fast` selection, tests/conftest.py).
.PHONY: test-fast
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m fast $(PYTEST_ARGS)

## Re-pin every dependency after editing pyproject.toml (needs uv: pip install uv): lock.txt for make and CI,
## runtime.txt (the images) constrained by it, so the images run the tested versions.
lock:
	uv pip compile pyproject.toml --extra dev --extra bench --python-version 3.11 --generate-hashes --universal -o requirements/lock.txt
	uv pip compile pyproject.toml --extra build -c requirements/lock.txt --python-version 3.11 --generate-hashes --universal -o requirements/runtime.txt

## Re-vendor the front-end libraries into static/vendor/ from the npm registry (checked in; only to change a version).
vendor:
	bash scripts/vendor_static.sh

## The serving systems benches/dataplane.py --peers compares with, each in its own venv (they conflict), not
## Tessera's dependencies. PyTriton's Python backend stub links the system's libpython3.11, so its venv uses
## the system Python 3.11 (another 3.11 build's standard library does not match it).
PEERS := var/bench-peers
bench-peers:
	python3 -m venv $(PEERS)/mlserver && $(PEERS)/mlserver/bin/pip install --quiet --disable-pip-version-check "mlserver==1.7.1" "onnxruntime>=1.18" numpy
	python3 -m venv $(PEERS)/ray && $(PEERS)/ray/bin/pip install --quiet --disable-pip-version-check "ray[serve]==2.60.0" "onnxruntime>=1.18" numpy
	/usr/bin/python3.11 -m venv $(PEERS)/pytriton && $(PEERS)/pytriton/bin/pip install --quiet --disable-pip-version-check "nvidia-pytriton==0.7.0" "onnxruntime>=1.18" numpy

## NVIDIA's perf_analyzer for benches/oip.py: the binary in tritonclient 2.41.0's manylinux wheel (the last that
## ships it; PyPI's perf-analyzer is a placeholder), libcudart from nvidia-cuda-runtime-cu12 (loaded even without
## a GPU) and Debian's libb64-0d.
## The train extra (tessera scheduler train): PyTorch's CPU build where pip finds one, and stable-baselines3.
## Outside the lock: serving runs the exported ONNX policies and never imports torch.
TORCH ?= torch==2.13.0
train-deps: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH)" "stable-baselines3==2.9.2"

## Regenerate the router's gRPC messages after editing workers/router/proto/oip.proto (protoc from grpcio-tools,
## a dev dependency; tests/workers/test_router_grpc.py checks the committed code matches the .proto).
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. workers/router/proto/oip.proto

perf-analyzer:
	command -v apt-get >/dev/null && { dpkg -s libb64-0d >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -q libb64-0d; } || true
	python3 -m venv $(PEERS)/perf-analyzer && $(PEERS)/perf-analyzer/bin/pip install --quiet --disable-pip-version-check "tritonclient==2.41.0" "nvidia-cuda-runtime-cu12==12.9.79"

## pip-audit over the lock files where PyPI's advisories or OSV can be reached (CI's machines reach neither:
## there tests/security/test_audits.py skips its audit, saying so).
audit: $(STAMP)
	$(BIN)/python -m pytest tests/security/test_audits.py -p no:cacheprovider -rs

clean:
	rm -rf $(VENV) var
