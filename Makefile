# Two commands matter: `make demo` (the main job) and `make test` (every test).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint protos bench clean browser

$(STAMP): pyproject.toml requirements-test.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements-test.txt
	$(BIN)/pip install -q -e '.[train,demo]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fthsdp demo $(DEMO_ARGS)

test: $(STAMP) browser
	$(BIN)/lint-imports
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The status-page test drives a real headless Chromium: Debian's package, installed here when
# missing (as root, as on CI); anyone else is told the one command to run.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium; } || \
	  { echo "make test: the UI test needs Chromium: run 'apt-get install chromium' as root" >&2; exit 1; }

protos: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. protos/controller.proto

clean:
	rm -rf $(VENV) build *.egg-info
