# Two commands do all setup: `make demo` and `make test` create .venv and install on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The CPU build of torch where no NVIDIA GPU is present; the default (CUDA) build otherwise.
TORCH ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)

.PHONY: demo test serve clean offline-wheels

# torch through pip, which follows the machine's pip settings (where its build comes from), compiled to bytecode
# on every core (pip compiles on one: two thirds of its install); the rest through uv, which resolves and
# installs the same packages in under half of pip's time, compiled as well (where Python writes no bytecode as
# it imports, every process would compile them again).
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip uv
	$(BIN)/python -m pip install --quiet --no-compile "$(TORCH)"
	$(BIN)/python -c "import compileall, importlib.util as u; \
		compileall.compile_dir(u.find_spec('torch').submodule_search_locations[0], quiet=2, workers=0)"
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e ".[test]"
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps flightsql-dbapi==0.2.2  # its metadata pins sqlalchemy<2; its DB-API (what the tests use) runs on 2
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m quail.clients.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

serve: $(STAMP)
	$(BIN)/quail serve

# What a GPU host without a package index needs besides torch (ignored by git): wheels of this tree and
# of the other dependencies (the ADBC driver for bench/server_load.py), the commit Quail's wheel was built
# from (.offline/wheels/COMMIT: results name it), and the embedded model's tokenizer for dummy weights;
# copy .offline/ there with the tree. Not protobuf: the host's own (with its C module) serves the
# Substrait messages; a pure-Python protobuf beside it would meet that C module and fail to import.
offline-wheels: $(STAMP)
	rm -rf build .offline/wheels/quail_server-*.whl
	$(BIN)/python -m pip wheel --quiet --no-deps -w .offline/wheels .
	git rev-parse HEAD > .offline/wheels/COMMIT
	$(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
		--platform manylinux_2_27_x86_64 \
		-d .offline/wheels duckdb==2.0.1 sqlglot==30.30.0 substrait==0.37.1 substrait-protobuf==0.106.0 \
		substrait-extensions==0.106.0 substrait-antlr==0.106.0 antlr4-python3-runtime==4.13.2 \
		pyyaml==6.0.3 adbc-driver-flightsql==1.13.0 adbc-driver-manager==1.13.0 llguidance==1.9.1
	$(BIN)/python -c "from quail.engine.runtime.loading import export_embedded_tokenizer; export_embedded_tokenizer('.offline/tokenizer')"

clean:
	rm -rf $(VENV) build dist *.egg-info
