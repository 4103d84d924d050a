# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: demo test explore lint generate bench bench-class mutation clean

# scripts/install.sh is the one list of install commands: the Gradescope autograder
# (setup.sh) and docker/Dockerfile run it too, on requirements.txt alone.
$(STAMP): requirements.txt requirements-dev.txt requirements-nodeps.txt pyproject.toml scripts/install.sh
	$(PY) -m venv $(VENV)
	bash scripts/install.sh $(BIN)/python requirements-dev.txt
	touch $(STAMP)

# Grade the bundled example class (each student on the stages it handed in):
# one row per student, one results file each.
demo: $(STAMP)
	$(BIN)/python -m autograder grade examples/class/*/ --results-dir build/demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n 2 -q

# The property tests with new random examples each run, 10 times as many as `make test` draws
# (which draws the same ones every run: tests/conftest.py has both profiles); a failure is
# kept in .hypothesis/ and tried first next time. ARGS="-k compare" to narrow it.
explore: $(STAMP)
	HYPOTHESIS_PROFILE=explore $(BIN)/python -m pytest -n 2 -q -m hypothesis $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

# Regenerate student notebooks and public self-check data from solutions + specs.
generate: $(STAMP)
	$(BIN)/python -m autograder generate

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_grade.py

# A synthetic class (200 students x 9 stages) through `batch`, against nbgrader autograde,
# the floor and the self-check latency (issue 9). ARGS="--students 50 --sample 10" to shorten.
bench-class: $(STAMP)
	$(BIN)/python benchmarks/bench_class.py $(ARGS)

# Mutation testing of the hidden cases: every stage's reference mutated (cosmic-ray and
# mutation/operators.py), each mutant graded as a submission; reports in build/mutation/.
# Fails while a stage scores under 97 % or a survivor is unexplained. ARGS="01_attention".
mutation: $(STAMP)
	$(BIN)/python -m mutation $(ARGS)

clean:
	rm -rf $(VENV) build
