# multiworker — one entry point for setup, tests and the local cluster.
# `make run` and `make test` are the two commands a fresh machine needs (see README).
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
.DEFAULT_GOAL := help
PY ?= python3
VENV := .venv
CLUSTER ?= local
export MW_CACHE ?= $(HOME)/.cache/multiworker
PYTEST := $(VENV)/bin/python -m pytest
CRD := crds/multiworker.dev_multiworkerjobs.yaml
# The chart's copy (a real file: Helm warns on every install about a symlinked one).
CHART_CRD := charts/multiworker-operator/crds/multiworker.dev_multiworkerjobs.yaml
# The pinned Kubernetes' PodTemplateSpec schemas that spec.template's CRD schema is made from.
OPENAPI := operator/src/multiworker/api/podtemplatespec.openapi.json
# The job reference page, generated from the CRD.
REFERENCE := docs/reference.md
# The chart's Grafana dashboard, generated with the foundation SDK (hack/dashboard.py).
DASHBOARD := charts/multiworker-operator/dashboards/multiworker.json
PIP_TOOLS := pip-tools==7.6.2

help: ## list targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

$(VENV)/.installed: operator/pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e 'operator[test]'
	# Keras 2 for the tests of Keras users' code (docs/keras.md), at the installed TensorFlow's
	# version and without resolving: it requires `tensorflow`, which tensorflow-cpu provides.
	$(VENV)/bin/pip install -q --no-deps "tf-keras~=$$($(VENV)/bin/python -c \
	  'from importlib.metadata import version; print(version("tensorflow-cpu").rsplit(".", 1)[0])').0"
	touch $@

venv: $(VENV)/.installed ## create .venv with the package and test dependencies

run: venv ## cluster, images, helm install, then the example job followed until it Succeeds
	hack/run.sh

binaries: ## build the pinned Kubernetes, CoreDNS, helm and kind binaries (cached by version)
	hack/cluster/build-binaries.sh

cluster-up: ## bring up the cluster: CLUSTER=local (.cluster/kubeconfig) or kind (.cluster/kind-kubeconfig)
	case "$(CLUSTER)" in local) hack/cluster/up.sh ;; kind) hack/kind/up.sh ;; \
	  *) echo "CLUSTER must be local or kind, not '$(CLUSTER)'" >&2; exit 2 ;; esac

cluster-down: ## stop the cluster of CLUSTER=local|kind (caches stay; kind: stops the dockerd it started)
	case "$(CLUSTER)" in local) hack/cluster/down.sh ;; kind) hack/kind/down.sh ;; \
	  *) echo "CLUSTER must be local or kind, not '$(CLUSTER)'" >&2; exit 2 ;; esac

kueue-up: ## install Kueue (versions.env) into the cluster CLUSTER names (local|kind), built offline; idempotent
	case "$(CLUSTER)" in local) hack/cluster/kueue.sh ;; kind) hack/cluster/kueue.sh --kind ;; \
	  *) echo "kueue-up: CLUSTER must be local or kind, not '$(CLUSTER)'" >&2; exit 2 ;; esac

images: ## build the images offline (cached by content)
	hack/images/build.sh all

images-load: ## build the images, then import them into the cluster CLUSTER names (local|kind)
	case "$(CLUSTER)" in local) ;; \
	  kind) [ -f .cluster/kind.env ] || { echo "no kind cluster: make cluster-up CLUSTER=kind" >&2; exit 2; } ;; \
	  *) echo "images-load: CLUSTER must be local or kind, not '$(CLUSTER)'" >&2; exit 2 ;; esac
	$(MAKE) images
	if [ "$(CLUSTER)" = kind ]; then source .cluster/kind.env \
	  && hack/images/load.sh --kind multiworker base worker operator; \
	else hack/images/load.sh pause base worker operator; fi

images-smoke: images ## run each image in a private containerd and check it
	hack/images/smoke.sh

image-worker-gpu: ## the GPU worker image (several GB; never built in CI)
	hack/images/build.sh worker-gpu

locks: venv ## re-resolve the images' committed wheel locks (UPGRADE=1: newest releases)
	$(VENV)/bin/pip install -q '$(PIP_TOOLS)'
	hack/images/locks.sh $(if $(filter 1,$(UPGRADE)),--upgrade)

generate: venv ## regenerate derived files: the Kubernetes OpenAPI excerpt, the CRD, the job reference
	PY=$(VENV)/bin/python hack/k8s-openapi.sh > $(OPENAPI).tmp && mv $(OPENAPI).tmp $(OPENAPI)
	$(VENV)/bin/python -m multiworker.api.crd > $(CRD)
	cp $(CRD) $(CHART_CRD)
	$(VENV)/bin/python -m multiworker.api.reference > $(REFERENCE)
	$(VENV)/bin/python hack/dashboard.py > $(DASHBOARD)

verify: venv binaries ## lint, type-check, import layering, generated-file drift, the docs site (strict)
	$(VENV)/bin/ruff check operator tests hack/dashboard.py
	$(VENV)/bin/mypy --config-file operator/pyproject.toml operator/src
	$(VENV)/bin/lint-imports operator/pyproject.toml
	$(MW_CACHE)/bin/helm lint --strict charts/multiworker-operator
	PY=$(VENV)/bin/python hack/k8s-openapi.sh | cmp -s $(OPENAPI) - \
		|| { echo "$(OPENAPI) is stale: run make generate"; exit 1; }
	$(VENV)/bin/python -m multiworker.api.crd | diff -u $(CRD) - \
		|| { echo "crds/ is stale: run make generate"; exit 1; }
	cmp -s $(CRD) $(CHART_CRD) || { echo "$(CHART_CRD) differs from $(CRD): run make generate"; exit 1; }
	$(VENV)/bin/python -m multiworker.api.reference | diff -u $(REFERENCE) - \
		|| { echo "$(REFERENCE) is stale: run make generate"; exit 1; }
	$(VENV)/bin/python hack/dashboard.py | diff -u $(DASHBOARD) - \
		|| { echo "$(DASHBOARD) is stale: run make generate"; exit 1; }
	site=$$(mktemp -d) && trap 'rm -rf "$$site"' EXIT \
		&& $(VENV)/bin/mkdocs build --strict --quiet -f mkdocs.yml -d "$$site"

test-unit: venv binaries ## unit and runtime tests (no cluster)
	$(PYTEST) tests/unit tests/runtime

test-integration: venv ## integration tests on a real cluster (CLUSTER=local|kind|existing)
	CLUSTER=$(CLUSTER) $(PYTEST) tests/integration

test-e2e: venv binaries ## e2e tests with real TensorFlow pods (CLUSTER=local|kind|existing)
	rc=0; CLUSTER=$(CLUSTER) $(PYTEST) tests/e2e || rc=$$?; \
	if [ "$(CLUSTER)" = kind ] && [ -z "$(KEEP_CLUSTER)" ]; then hack/kind/down.sh; fi; exit $$rc

chaos: venv binaries ## the full chaos suite on the local cluster (sizes: CHAOS_* variables, tests/chaos/config.py)
	CHAOS_SEED=$${CHAOS_SEED:-$$(date +%s)} CHAOS_ROUNDS=$${CHAOS_ROUNDS:-3} \
	CHAOS_KILLS=$${CHAOS_KILLS:-60} CHAOS_JOBS=$${CHAOS_JOBS:-8} CHAOS_SPECS=$${CHAOS_SPECS:-5000} \
	CHAOS_ABUSE_SECONDS=$${CHAOS_ABUSE_SECONDS:-120} CLUSTER=$(CLUSTER) $(PYTEST) tests/chaos

# make test: first the tests marked `alone` (tests.support.alone: they stop the control plane,
# add fake nodes, take most of the node or time themselves), one at a time; then every other
# test, in TEST_WORKERS pytest-xdist workers (tests that share one resource hold its lock and
# run in one worker: tests.support.USES_NODE_GPUS). The serial part comes first because it
# mostly waits: what runs beside make test (CI's Go builds and its kind tier) takes the CPU it
# leaves, and is done sooner for the parallel part. Both always run; the exit code is the
# first failure's. TEST_WORKERS (default: two more than the cores, at most 4: the tests mostly
# wait on the cluster and TensorFlow: with three on 2 cores, 17 % of the CPU stayed idle)
# =0 runs the second part in one process, without xdist.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); n=$$((n + 2)); [ "$$n" -le 4 ] || n=4; echo $$n)

test: venv binaries ## everything CI runs: verify, then all test tiers on the local real cluster
	$(MAKE) verify
	rc=0; \
	CLUSTER=$(CLUSTER) $(PYTEST) -m alone tests || rc=$$?; \
	CLUSTER=$(CLUSTER) $(PYTEST) -n $(TEST_WORKERS) --dist loadgroup -m "not alone" tests \
	  || { r=$$?; [ $$rc -ne 0 ] || rc=$$r; }; \
	exit $$rc

clean: cluster-down ## stop the cluster and remove local state (caches stay)
	rm -rf .cluster test-logs

.PHONY: help run locks binaries venv cluster-up cluster-down kueue-up images images-load images-smoke image-worker-gpu generate verify test-unit test-integration test-e2e test chaos clean
