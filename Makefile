# minidist: `make lab` to learn, `make test` to prove every lab works.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-test
# Tests and notebooks run many small ops in several processes on few cores: one BLAS thread per
# process is both faster and deterministic there.
SERIAL := OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
# Tests and notebooks run side by side, one worker per core (`make test JOBS=1` runs them one at a time). A
# notebook's cells must stay together on one worker, in order: --dist loadscope keeps each notebook whole.
JOBS   ?= auto
PAR    := $(if $(filter 1,$(JOBS)),,-n $(JOBS))
# The torch used by `make bench` for the autograd ratio; set TORCH= to skip it.
TORCH  ?= torch==2.13.0

.PHONY: help venv lab check test test-slow test-fast test-portability test-pythons test-browser bench labs labs-check lint clean

help:
	@echo "make lab        create .venv, install minidist, open JupyterLab on labs/"
	@echo "make check LAB=08  run your labs/08_*.ipynb and say which exercises are done"
	@echo "make test       create/refresh .venv and run every test, nbval over solutions/ included"
	@echo "make test-slow  the exhaustive ends of the sweeps (8-rank layouts of the composition grid, ...); CI runs it"
	@echo "make test-browser  the interactive labs in headless Chromium (installs chromium, chromedriver, selenium); CI runs it"
	@echo "make bench      benchmarks (collectives vs MPICH, autograd vs PyTorch, estimator calibration)"
	@echo "make labs       regenerate labs/ from solutions/"
	@echo "make labs-check fail if labs/ is out of date with solutions/"
	@echo "make test-portability  nbval under other BLAS kernels and SIMD levels (maintainers, by hand)"
	@echo "make test-pythons  make test under Python 3.10, 3.12 and 3.13, each in its own venv (maintainers, by hand)"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@# MPI as packages (mpi4py and MPICH): the MPI backend's tests run when it installs, and say why they skip if not
	$(BIN)/python -m pip install -q -e '.[mpi]' || echo "note: the mpi extra did not install; the MPI tests will be skipped"
	touch $(STAMP)

venv: $(STAMP)

# Jupyter refuses to run as root unless told; containers often run as root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
LAB_ARGS ?=

lab: $(STAMP)
	$(SERIAL) $(BIN)/jupyter lab $(ROOT_FLAG) $(LAB_ARGS) labs/

LAB ?=
check: $(STAMP)
	@if [ -z "$(LAB)" ]; then echo "usage: make check LAB=08   (the number of a lab in labs/)"; exit 2; fi
	@$(SERIAL) $(BIN)/python -m minidist.labs.progress $(LAB)

lint: $(STAMP)
	$(BIN)/ruff check minidist tests

labs: $(STAMP)
	@if [ "$(FORCE)" != 1 ] && git rev-parse --git-dir >/dev/null 2>&1 && ! git diff --quiet -- labs/; then \
	  echo "labs/ has uncommitted changes (your answers?); commit or stash them, or run 'make labs FORCE=1'"; \
	  exit 1; fi
	$(BIN)/python -m minidist.labs.build

labs-check: $(STAMP)
	$(BIN)/python -m minidist.labs.build --check

test: $(STAMP) lint labs-check
	$(SERIAL) $(BIN)/python -m pytest -q $(PAR) -m "not slow" --ignore=tests/browser tests
	@if ls solutions/*.ipynb >/dev/null 2>&1; then \
	  $(SERIAL) $(BIN)/python -m pytest -q $(PAR) $(if $(PAR),--dist loadscope) --nbval --nbval-current-env \
	    -p tests.nb_timing -p tests.nb_kernels solutions/; \
	else echo "(no solution notebooks yet)"; fi

test-fast: $(STAMP)
	$(SERIAL) $(BIN)/python -m pytest -q -x --ignore=tests/browser tests

# Saved outputs must not depend on the CPU. This reruns nbval as if on other machines: other OpenBLAS
# kernels, numpy without its AVX-512/AVX2 loops, and ranks started by spawn (macOS's and Windows' default).
# Slow (one full nbval run per setting); not in CI.
PORTABILITY := "OPENBLAS_CORETYPE=Haswell" "OPENBLAS_CORETYPE=Zen" "OPENBLAS_CORETYPE=Sandybridge" \
  "OPENBLAS_CORETYPE=Haswell NPY_DISABLE_CPU_FEATURES=X86_V4,AVX512_ICL" \
  "OPENBLAS_CORETYPE=Sandybridge NPY_DISABLE_CPU_FEATURES=X86_V4,AVX512_ICL,X86_V3" \
  "MINIDIST_START_METHOD=spawn"
test-portability: $(STAMP)
	@status=0; for setting in $(PORTABILITY); do echo "== $$setting"; \
	  out=$$(env $(SERIAL) $$setting $(BIN)/python -m pytest -q --nbval --nbval-current-env -p tests.nb_kernels solutions/ 2>&1) \
	    || status=1; echo "$$out" | grep -E "^FAILED|passed|failed"; done; exit $$status

# make test under other Pythons, each in its own venv (.venv-3.X); maintainers, by hand, not in CI. PYTHONS lists
# the interpreters (default: python3.10, 3.12 and 3.13 where they are on PATH).
PYTHONS ?= $(foreach v,3.10 3.12 3.13,$(shell command -v python$(v)))
test-pythons:
	@test -n "$(strip $(PYTHONS))" || { echo "no other Python found: make test-pythons PYTHONS='/path/to/python3.X ...'"; exit 2; }
	@status=0; for py in $(PYTHONS); do v=$$($$py -c 'import sys; print("%d.%d" % sys.version_info[:2])') || exit 2; \
	  echo "== Python $$v ($$py)"; $(MAKE) --no-print-directory test PYTHON=$$py VENV=.venv-$$v || status=1; done; \
	  exit $$status

bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,bench]' || echo "note: the bench extra (mpi4py, MPICH) did not install; the MPICH columns are skipped"
	@if [ -n "$(TORCH)" ]; then $(BIN)/python -c "import torch" 2>/dev/null || \
	  $(BIN)/python -m pip install -q "$(TORCH)" || echo "(torch not installed: PyTorch ratios are skipped)"; fi
	$(BIN)/python -m tests.bench

test-slow: $(STAMP)
	$(SERIAL) $(BIN)/python -m pytest -q $(PAR) -m slow --ignore=tests/browser tests

# Debian's Chromium and ChromeDriver (root or sudo), selenium into the venv; JupyterLab opens the widget labs.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
test-browser: $(STAMP)
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium chromium-driver >/dev/null; }
	$(BIN)/python -m pip install -q -e '.[test,browser]'
	$(SERIAL) $(BIN)/python -m pytest -q tests/browser

clean:
	rm -rf $(VENV) .venv-3.* build *.egg-info
