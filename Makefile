# The front door: `make up` runs GPU Warden locally; `make test` runs every check CI runs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install up serve services test lint unit integration acceptance clean

# pip's own chatter goes to $(VENV)/install.log, shown only when the install fails.
PIP_QUIET := -q --disable-pip-version-check
$(STAMP): pyproject.toml
	@echo "installing GPU Warden into $(VENV) (log: $(VENV)/install.log) ..."
	@$(PY) -m venv $(VENV)
	@$(BIN)/pip install $(PIP_QUIET) --upgrade pip > $(VENV)/install.log 2>&1 \
		|| { cat $(VENV)/install.log; exit 1; }
	@$(BIN)/pip install $(PIP_QUIET) -e '.[dev]' >> $(VENV)/install.log 2>&1 \
		|| { cat $(VENV)/install.log; exit 1; }
	@touch $(STAMP)

install: $(STAMP)

up: $(STAMP)
	@$(BIN)/gpuwarden up

serve: $(STAMP)
	$(BIN)/gpuwarden serve --migrate

lint: $(STAMP)
	$(BIN)/ruff check service tests bench migrations
	$(BIN)/ruff format --check service tests bench migrations
	$(BIN)/mypy
	$(BIN)/lint-imports

services:
	bash scripts/test-services.sh

test: services lint
	$(BIN)/pytest

unit: $(STAMP)
	$(BIN)/pytest tests/unit

integration: $(STAMP) services
	$(BIN)/pytest tests/integration

acceptance: $(STAMP) services
	$(BIN)/pytest tests/acceptance

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache gpuwarden.db* gpuwarden-data
