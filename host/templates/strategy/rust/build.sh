#!/bin/sh
# Builds {{name}}.wasm (a component for wasm32-wasip2). Then:
#   cargo test                                  # the logic, natively
#   switchyard strategies test {{name}}.wasm    # the router contract suite, in the host
set -eu
cd "$(dirname "$0")"
rustup target add wasm32-wasip2 >/dev/null 2>&1 || true
cargo build --quiet --target wasm32-wasip2 --release
cp "${CARGO_TARGET_DIR:-target}/wasm32-wasip2/release/{{name}}.wasm" {{name}}.wasm
echo "built {{name}}.wasm"
