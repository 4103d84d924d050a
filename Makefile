# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: demo test explore lint generate bench bench-class bench-cold bench-box mutation docker docker-cuda docker-check clean FORCE

# scripts/install.sh is the one list of install commands: the Gradescope autograder
# (setup.sh) and docker/Dockerfile run it too, on requirements.txt alone (the grading
# runtime); the venv here also gets the instructors' tools and the dev tools.
# scripts/venv.sh decides whether to install: when the content of what install.sh reads
# changed since the stamp (not the files' dates, which a clone or a copy renews), and, made
# again, when the venv was made for another checkout (copied here, its editable install
# would run that checkout's code).
INSTALL_FROM := requirements.txt requirements-instructor.txt requirements-dev.txt requirements-nodeps.txt pyproject.toml scripts/install.sh
$(STAMP): FORCE
	@bash scripts/venv.sh prepare $(PY) $(VENV) $(INSTALL_FROM); status=$$?; \
	if [ $$status -eq 3 ]; then \
	    bash scripts/install.sh $(BIN)/python requirements-dev.txt && \
	    bash scripts/venv.sh stamp $(VENV) $(INSTALL_FROM); \
	else exit $$status; fi

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

# Two synthetic classes of 40 students x every stage (01-11) through `batch`: one where every notebook
# fails something or leaves something unwritten, one where every notebook passes, per stage side by
# side (issue 27: failing <= 1.3x correct); against nbgrader autograde (the failing class), the floor
# and the self-check latency (issue 9). The mostly-correct class of before:
# ARGS="--classes mix --students 200 --sample 22"; all three: ARGS="--classes failing,correct,mix".
bench-class: $(STAMP)
	$(BIN)/python benchmarks/bench_class.py $(ARGS)

# Cold start (issue 19): a fresh `import torch` against the CLI on one stage-01 submission,
# Gradescope's run_autograder on a temporary root (stage 01; all nine stages against
# `batch --workers 1` per student) and 40 stage-01 notebooks through `batch` against real
# `nbgrader autograde`, mostly correct and (issue 27) all failing: a real mistake each, padding_mask
# unwritten; each target a ratio measured in the same run. ARGS="--repeat 3".
bench-cold: $(STAMP)
	$(BIN)/python benchmarks/bench_cold.py $(ARGS)

# What the job box (issue 25: namespaces, read-only view, cgroup per job) costs a warm
# stage-01 grade, against the process-level sandbox alone, in one process. ARGS="--rounds 30".
bench-box: $(STAMP)
	$(BIN)/python benchmarks/bench_box.py $(ARGS)

# Mutation testing of the hidden cases: every stage's reference mutated (cosmic-ray and
# mutation/operators.py), each mutant graded as a submission; reports in build/mutation/.
# Fails while a stage scores under 97 % or a survivor is unexplained. ARGS="01_attention".
mutation: $(STAMP)
	$(BIN)/python -m mutation $(ARGS)

# The TAs' image (docker/Dockerfile), built offline: the base image made here if missing
# (docker/base.sh), the wheels for its Python downloaded first (docker/wheelhouse.sh, into
# build/wheelhouse-cpu), then `docker build` with no network. bertlab: CPU torch, 1.4 GB.
# The build's first stage (the packages installed from the wheelhouse, 1.8 GB) is kept as
# bertlab:install-cache, named rather than left dangling: it is what makes a rebuild after
# a change to the code take seconds (`docker rmi bertlab:install-cache` frees it).
# DOCKER_BASE: bertlab-base:bookworm, Debian bookworm's Python 3.11 made by debootstrap
# from a Debian mirror (no Docker registry needed; BASE_ROOTFS=DIR imports a tree made
# already), or any image with python3 3.11 and venv (python:3.11-slim, where Docker Hub answers).
DOCKER_BASE ?= bertlab-base:bookworm
docker:
	bash docker/base.sh $(DOCKER_BASE)
	PYTHON=$(PY) bash docker/wheelhouse.sh cpu $(DOCKER_BASE) build/wheelhouse-cpu
	docker build -f docker/Dockerfile --build-arg BASE=$(DOCKER_BASE) -t bertlab .
	docker build -q -f docker/Dockerfile --build-arg BASE=$(DOCKER_BASE) --target install -t bertlab:install-cache .

# The same with torch's CUDA build and its nvidia-* wheels (~6 GB): bertlab:cuda, for
# docker run --gpus all ... bertlab:cuda batch /submissions --device cuda.
docker-cuda:
	bash docker/base.sh $(DOCKER_BASE)
	PYTHON=$(PY) bash docker/wheelhouse.sh cuda $(DOCKER_BASE) build/wheelhouse-cuda
	docker build -f docker/Dockerfile --build-arg BASE=$(DOCKER_BASE) --build-arg VARIANT=cuda -t bertlab:cuda .

# The TAs' path end to end (docker/check.py): builds the CPU image as `make docker` does,
# grades examples/class in it with README.md's docker run command, word for word, and
# compares every score with the host's; no solution in any layer (docker save), the grader
# as root, out/ missing or not mounted, feedback. Needs a Docker engine (else SKIPPED), so
# it is not part of `make test`. ARGS="--cold": a build with no cache, timed.
docker-check: $(STAMP)
	$(BIN)/python docker/check.py --base $(DOCKER_BASE) $(ARGS)

clean:
	rm -rf $(VENV) build
