# The two commands: `make run` and `make test`. Both set up .venv first (idempotent).
PY      := .venv/bin/python
ARGS    ?=
STEPS   := ingest prepare train score evaluate
# DATASET=<spec name or path> runs another data set (conf/datasets/), in output/<name> unless ARGS says otherwise.
ifdef DATASET
DATA_ARGS := --dataset $(DATASET) --output-dir output/$(notdir $(basename $(DATASET)))
endif
# One run id for the five step processes of `make run`; pass RUN_ID=... to resume a run.
ifndef RUN_ID
RUN_ID := make-$(shell date -u +%Y%m%dT%H%M%SZ)
endif

.PHONY: setup run test test-fast pipeline dist docs clean
setup:
	@bash scripts/setup.sh

# Each step is its own process, as a scheduler would run it: scoring loads the saved
# pipeline in a fresh interpreter.
run: setup
	@start=$$(date +%s); \
	for step in $(STEPS); do \
	  $(PY) -m sparkdeep.jobs.$$step --run-id $(RUN_ID) $(DATA_ARGS) $(ARGS) || exit $$?; \
	done; \
	echo "[run] run $(RUN_ID): all steps done in $$(( $$(date +%s) - start ))s; tables, models, reports and runs/$(RUN_ID)/manifest.json under the output folder (default ./output)"

# Two workers, one test module each at a time (--dist loadfile keeps a module's shared
# fixtures in one process); TEST_WORKERS=0 runs everything in this process.
TEST_WORKERS ?= 2
test: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

# Before every commit: what runs in seconds (a test over about 4 s is marked slow and left
# to make test), in the same two workers.
test-fast: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not slow"

pipeline: setup
	$(PY) -m sparkdeep.jobs.pipeline --run-id $(RUN_ID) $(DATA_ARGS) $(ARGS)

# The code for a cluster: a wheel and the same files as a --py-files zip (scripts/submit.sh uses it).
dist: setup
	@bash scripts/package.sh

# The documentation site (docs/, mkdocs.yml) into site/; --strict: any warning fails the
# build (tests/test_docs.py runs the same). NO_MKDOCS_2_WARNING hides Material's end-of-life banner.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf output .pytest_cache dist build
