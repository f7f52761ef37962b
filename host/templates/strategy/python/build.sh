#!/bin/sh
# Builds {{name}}.wasm with the Python SDK (componentize-py, pinned by the SDK) in .venv, which
# this script creates once. Then:
#   .venv/bin/python -m unittest                 # the logic, natively
#   switchyard strategies test {{name}}.wasm     # the router contract suite, in the host
set -eu
cd "$(dirname "$0")"
if [ ! -x .venv/bin/switchyard-strategy ]; then
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check "{{sdk}}/python"
fi
.venv/bin/switchyard-strategy build {{name}}.py -o {{name}}.wasm
