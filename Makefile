# Two commands matter: `make demo` (the main job) and `make test` (every test).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint protos bench clean tools

# Python keeps the bytecode of what it compiled (__pycache__, ignored by git). Where the
# environment says not to (PYTHONDONTWRITEBYTECODE, which some CI images set), every process a
# test starts -- controllers, agents, trainers, the CLI, about 1,600 in `make test` -- compiles the
# repository's modules again: half a controller's start-up CPU, and on two cores minutes of the
# suite. So make's commands write it, and `test` compiles the repository once before it starts.
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): pyproject.toml requirements-test.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements-test.txt
	$(BIN)/pip install -q -e '.[train,demo]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fthsdp demo $(DEMO_ARGS)

# Three pytest workers, on two cores: the tests that start torch trainers run on one, in turn
# (tests/scheduling.py); the other two share the rest, which mostly wait on sockets and processes.
# Then the `solo` end-to-end runs, one at a time (tests/conftest.py). Exit code 5 is "nothing
# selected" (a PYTEST_ARGS that names only tests of the other part).
PYTEST_WORKERS ?= 3
test: $(STAMP) tools
	$(BIN)/lint-imports
	$(BIN)/python -m compileall -q -j 0 agent bench controller examples ftar_kernels fthsdp protos tests > /dev/null
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -m "not solo" $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(BIN)/python -m pytest -m solo $(PYTEST_ARGS) || [ $$? -eq 5 ]

# Tools some tests drive, from Debian's packages: chromium (the status-page test), kubectl
# (rendering the kustomizations the docs apply), g++ (the CUDA kernels emulated on the CPU), and
# for the chaos run's test network (tests/chaos/network.py) iproute2 (ip, tc), nftables (nft),
# iptables (its NFQUEUE delays packets) and faketime (a skewed clock). Each is command:package. Installed here when missing (as root, as on
# CI); anyone else is told the one command to run.
TOOLS := chromium:chromium kubectl:kubectl g++:g++ ip:iproute2 tc:iproute2 nft:nftables iptables:iptables faketime:faketime
tools:
	@missing="$$(for t in $(TOOLS); do command -v $${t%%:*} >/dev/null 2>&1 || printf '%s ' $${t#*:}; done)"; \
	[ -z "$$missing" ] || { [ "$$(id -u)" = 0 ] && apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; } || \
	  { echo "make test: some tests need $$missing: run 'apt-get install $$missing' as root" >&2; exit 1; }

protos: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. protos/controller.proto
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. protos/replica.proto

clean:
	rm -rf $(VENV) build *.egg-info
