# hybridnb: the README's commands. `make demo` and `make test` do all the set-up they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.stamp-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
TORCH_PAIR := torch==2.11.0 torchaudio==2.11.0
DEEPSPEED  := deepspeed==0.19.8

IPYWIDGETS7 := $(VENV)/ipywidgets7

.PHONY: setup demo test lab bench browser wheel clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_PAIR)
	$(PIP) install -q -e '.[dev,lab,demo]' $(TORCH_PAIR)
	@# DeepSpeed (strategy="deepspeed", and its tests): the sdist imports torch while it builds,
	@# so no build isolation; DS_BUILD_OPS=0 compiles no kernels now (DeepSpeed JIT-builds them)
	$(PIP) install -q wheel setuptools
	DS_BUILD_OPS=0 $(PIP) install -q --no-build-isolation $(DEEPSPEED) $(TORCH_PAIR)
	@# Colab's widget stack for tests/live/test_live_ipywidgets7.py: ipywidgets 7.7.1 in a folder
	@# of its own, put first on a subprocess's PYTHONPATH (the venv keeps ipywidgets 8)
	@$(PIP) install -q --no-deps --upgrade --target $(IPYWIDGETS7) ipywidgets==7.7.1 ipython_genutils==0.2.0 \
	  || echo "ipywidgets 7.7.1 could not be installed; tests/live/test_live_ipywidgets7.py will be skipped"
	@$(MAKE) --no-print-directory browser
	@rm -f $(VENV)/.stamp-* && touch $@

# Chromium for the browser test: Debian's package, installed when missing and allowed (root).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "chromium could not be installed; the browser test will be skipped"; \
	  else echo "chromium missing and not root; the browser test will be skipped"; fi; }

# A wheel of this package (hybridnb, data_prep, hybridnb_tools) in dist/, for a venv, JupyterLab or
# Colab: pip install dist/hybridnb-*.whl (README, "Install"). Needs only pip, not `make setup`.
wheel:
	rm -rf build dist/hybridnb-*.whl
	$(PYTHON) -m pip wheel -q --no-deps --wheel-dir dist .

demo: setup
	$(PY) -m hybridnb_tools.demo

# Unit tests run in the normal mode (the Trainer caps epochs in quick mode). nbval runs every
# notebook top to bottom first, in quick mode (--nbval-lax: a cell that raises fails; outputs are
# not compared), and tests/nbval_record.py keeps that run for tests/test_notebooks.py, which checks
# what each notebook computed and showed, so the notebooks run once and hold no output and no
# assertion. tests/test_docs.py builds the reference with mkdocs --strict.
# Two pytest-xdist workers (one on a 1-core machine): most tests wait on the child processes
# they start; each test file runs whole in one worker, the notebooks and test_notebooks.py in one.
# The sources are byte-compiled first: where PYTHONDONTWRITEBYTECODE is set, every child process
# would compile hybridnb again (0.45 s each here).
test: setup
	$(VENV)/bin/ruff check hybridnb data_prep hybridnb_tools examples tests bench
	$(PY) -m compileall -q hybridnb data_prep hybridnb_tools tests
	env -u HYBRIDNB_QUICK $(PY) -m pytest -q -n auto --maxprocesses=2 -p tests.nbval_record --nbval-lax --nbval-current-env notebooks tests --durations=20

lab: setup
	$(VENV)/bin/jupyter lab notebooks

# Lightning is a peer in bench/bench_peers.py only: installed here, never a runtime dependency.
bench: setup
	@$(PY) -c "import lightning" 2>/dev/null || $(PIP) install -q lightning $(TORCH_PAIR)
	$(PY) -m bench

clean:
	rm -rf $(VENV) runs .pytest_cache build dist
