# The two commands: `make run` and `make test`. Both set up .venv first (idempotent).
PY      := .venv/bin/python
ARGS    ?=
STEPS   := ingest prepare train score evaluate

.PHONY: setup run test test-fast pipeline clean
setup:
	@bash scripts/setup.sh

# Each step is its own process, as a scheduler would run it: scoring loads the saved
# pipeline in a fresh interpreter.
run: setup
	@start=$$(date +%s); \
	for step in $(STEPS); do \
	  $(PY) -m sparkdeep.jobs.$$step $(ARGS) || exit $$?; \
	done; \
	echo "[run] all steps done in $$(( $$(date +%s) - start ))s; tables, models and reports under the output folder (default ./output)"

test: setup
	$(PY) -m pytest

test-fast: setup
	$(PY) -m pytest -m "not slow"

pipeline: setup
	$(PY) -m sparkdeep.jobs.pipeline $(ARGS)

clean:
	rm -rf output .pytest_cache
