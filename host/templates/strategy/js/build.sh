#!/bin/sh
# Builds {{name}}.wasm with the JavaScript SDK (QuickJS through componentize-qjs, pinned by the
# SDK), installing it into node_modules once. Then:
#   npm test                                     # the logic, in Node
#   switchyard strategies test {{name}}.wasm     # the router contract suite, in the host
set -eu
cd "$(dirname "$0")"
if [ ! -e node_modules/.bin/switchyard-strategy ]; then
    # --install-links copies the SDK (and installs its dependencies) instead of linking the folder.
    npm install --silent --no-audit --no-fund --install-links
fi
npm run --silent build
