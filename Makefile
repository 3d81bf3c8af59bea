# The front door: `make up` runs GPU Warden locally; `make test` runs every check CI runs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install dev up serve services test lint unit integration acceptance clean

# Two stamps: the runtime (what `make up` needs) and the dev extra on top (lint and tests).
# uv, itself installed from PyPI by pip inside the venv (so a fresh machine needs nothing but
# Python), installs the dependencies in parallel and says what it resolved and installed; where
# uv cannot be had, pip does it (slower). pip's own chatter goes to $(VENV)/install.log, shown
# only when it fails.
DEV_STAMP := $(VENV)/.installed-dev
LOG := $(VENV)/install.log
PIP_QUIET := -q --disable-pip-version-check
# A venv made by an older `make` or by uv may lack pip or uv: both are put in place first.
GET_UV := test -x $(BIN)/uv || { $(BIN)/python -m pip --version || $(BIN)/python -m ensurepip; \
	$(BIN)/python -m pip install $(PIP_QUIET) uv; } >> $(LOG) 2>&1
INSTALL = if $(GET_UV); then VIRTUAL_ENV=$(VENV) $(BIN)/uv pip install --python $(BIN)/python $(1); \
	else echo "(uv is not available: pip installs, quietly)"; \
	$(BIN)/python -m pip install $(PIP_QUIET) $(1) >> $(LOG) 2>&1 || { cat $(LOG); exit 1; }; fi

$(STAMP): pyproject.toml
	@echo "[1/3] creating $(VENV) with $(PY) ..."
	@$(PY) -m venv $(VENV)
	@echo "[2/3] installing the installer (uv) into $(VENV) (log: $(LOG)) ..."
	@$(GET_UV) || echo "(no uv: pip will install)"
	@echo "[3/3] installing GPU Warden and its runtime dependencies ..."
	@$(call INSTALL,-e .)
	@touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	@echo "installing the test tool chain (the dev extra: pytest, mypy, playwright, ...) ..."
	@$(call INSTALL,-e '.[dev]')
	@touch $(DEV_STAMP)

install: $(STAMP)

dev: $(DEV_STAMP)

up: $(STAMP)
	@$(BIN)/gpuwarden up

serve: $(STAMP)
	$(BIN)/gpuwarden serve --migrate

lint: $(DEV_STAMP)
	$(BIN)/ruff check service tests bench migrations
	$(BIN)/ruff format --check service tests bench migrations
	$(BIN)/mypy
	$(BIN)/lint-imports

services:
	bash scripts/test-services.sh

# Every test but the GPU ones, the schema fuzz included (a plain `pytest` leaves it out), over
# $(TEST_WORKERS) pytest-xdist workers; each test file stays on one worker, in its order (its
# module fixtures built once). TEST_WORKERS=0 runs them in this one process.
TEST_WORKERS ?= 3
test: services lint
	$(BIN)/pytest -m "not gpu" -n $(TEST_WORKERS) --dist loadfile

unit: $(DEV_STAMP)
	$(BIN)/pytest tests/unit

integration: $(DEV_STAMP) services
	$(BIN)/pytest tests/integration

acceptance: $(DEV_STAMP) services
	$(BIN)/pytest tests/acceptance

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache gpuwarden.db* gpuwarden-data
