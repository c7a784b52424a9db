# agentgate: `make run` serves the chat page with embedded defaults; `make test` runs every test.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
# pytest workers (pytest-xdist), a test file to a worker so that its module-wide servers start
# once; TEST_WORKERS=0 runs the suite in one process
TEST_WORKERS ?= 2
HOST ?= 127.0.0.1

.PHONY: setup run test lint typecheck bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

.setup-stamp: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch .setup-stamp

setup: .setup-stamp
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py ensure_demo_user

run: setup
	@echo "Open http://$(HOST):$(PORT)/ and log in as shown above."
	$(BIN)/python manage.py serve --host $(HOST) --port $(PORT)

test: .setup-stamp
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy gatewayproject chat sessions_app
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: .setup-stamp
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: .setup-stamp
	$(BIN)/mypy gatewayproject chat sessions_app

# agentgate beside a bare `websockets` floor server, one table (about 6 minutes on 2 cores; docs/performance.md)
bench: .setup-stamp
	$(BIN)/python bench/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .setup-stamp test_db_*.sqlite3*
