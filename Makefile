# Two commands set up everything on a fresh machine (Python 3.10+, pip, a C compiler):
#   make demo   optimize a sample model end to end and show the report
#   make test   run the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Extras installed by `make install`: dev tools, the TVM stack (its stage is tested), and
# TensorRT-RTX, which builds TensorRT engines without a GPU so the build path is tested too.
EXTRAS ?= dev,tvm,tensorrt-rtx

.PHONY: install demo test lint format samples clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $@

demo: install
	$(BIN)/lto inspect sample_models/resnet_tiny.onnx --shape batch=1
	$(BIN)/lto optimize sample_models/resnet_tiny.onnx --target-ms 1.0 -o reports/demo-resnet_tiny ; \
	  rc=$$?; if [ $$rc -ne 0 ] && [ $$rc -ne 3 ]; then exit $$rc; fi
	$(BIN)/lto bench --artifact reports/demo-resnet_tiny --compare sample_models/resnet_tiny.onnx \
	  --time 5 -o reports/demo-artifact-vs-original.json
	$(BIN)/lto report reports/demo-resnet_tiny/report.json -o reports/demo-resnet_tiny.md
	@echo "artifact: reports/demo-resnet_tiny/  report: reports/demo-resnet_tiny.md"

test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

samples: install
	$(BIN)/python sample_models/build.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
