# The two commands a newcomer needs: `make demo` and `make test`.
.PHONY: demo test lint unit

demo:
	./scripts/demo.sh

# Everything CI checks: formatting, lints, and every test (unit, against a
# real redis-server started per test, and end to end).
test: lint unit

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

unit:
	cargo test --workspace
