# Two commands matter: `make demo` (the main job) and `make test` (every test).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint protos bench clean

$(STAMP): pyproject.toml requirements-test.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements-test.txt
	$(BIN)/pip install -q -e '.[train,demo]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fthsdp demo $(DEMO_ARGS)

test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/python -m pytest $(PYTEST_ARGS)

protos: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. protos/controller.proto

clean:
	rm -rf $(VENV) build *.egg-info
