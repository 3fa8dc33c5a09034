# The two commands a newcomer needs: `make demo` and `make test`.
.PHONY: demo test lint unit tools

demo:
	./scripts/demo.sh

# Everything CI checks: formatting, lints, and every test (unit, against a
# real redis-server started per test, end to end, and the Helm chart with
# the real helm).
test: tools lint unit

# helm for the chart tests: the one on PATH, else installed into target/tools/bin.
tools:
	./scripts/install-helm.sh

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

unit:
	cargo test --workspace
