#!/usr/bin/env node
// switchyard-strategy build MODULE.js [-o OUT.wasm] [-q] [--skip CALL]... | stamp FILE.wasm [--api-version V] [--skip CALL]...
import { readFileSync, writeFileSync } from "node:fs";

import { API_VERSION } from "../src/index.js";
import { build } from "../src/build.js";
import { declareSkips, stamp } from "../src/stamp.js";

const usage =
  "usage: switchyard-strategy build MODULE.js [-o OUT.wasm] [-q] [--skip CALL]... | stamp FILE.wasm [--api-version V] [--skip CALL]...\n" +
  "  --skip observe|tick|select-single: a call the strategy does without, which the host then skips";

function option(args, names) {
  const at = args.findIndex((a) => names.includes(a));
  if (at < 0) return undefined;
  const value = args[at + 1];
  if (value === undefined) throw new Error(`${args[at]} needs a value\n${usage}`);
  args.splice(at, 2);
  return value;
}

/** Every value of a repeatable option, removed from `args`. */
function repeated(args, name) {
  const values = [];
  for (let value = option(args, [name]); value !== undefined; value = option(args, [name])) values.push(value);
  return values;
}

async function main(argv) {
  const [command, ...args] = argv;
  const skips = repeated(args, "--skip");
  if (command === "build") {
    const output = option(args, ["-o", "--output"]);
    const quiet = args.includes("-q") || args.includes("--quiet");
    const rest = args.filter((a) => a !== "-q" && a !== "--quiet");
    if (rest.length !== 1) throw new Error(usage);
    const out = output ?? rest[0].replace(/\.m?js$/, ".wasm");
    await build(rest[0], out, { quiet });
    writeFileSync(out, declareSkips(new Uint8Array(readFileSync(out)), skips));
  } else if (command === "stamp") {
    const version = option(args, ["--api-version"]) ?? API_VERSION;
    if (args.length !== 1) throw new Error(usage);
    const stamped = stamp(new Uint8Array(readFileSync(args[0])), version);
    writeFileSync(args[0], declareSkips(stamped, skips));
  } else {
    throw new Error(usage);
  }
}

main(process.argv.slice(2)).catch((e) => {
  console.error(`switchyard-strategy: ${e.message ?? e}`);
  process.exit(1);
});
