#!/usr/bin/env node
// switchyard-strategy build MODULE.js [-o OUT.wasm] [-q] | stamp FILE.wasm [--api-version V]
import { readFileSync, writeFileSync } from "node:fs";

import { API_VERSION } from "../src/index.js";
import { build } from "../src/build.js";
import { stamp } from "../src/stamp.js";

const usage = "usage: switchyard-strategy build MODULE.js [-o OUT.wasm] [-q] | stamp FILE.wasm [--api-version V]";

function option(args, names) {
  const at = args.findIndex((a) => names.includes(a));
  if (at < 0) return undefined;
  const value = args[at + 1];
  if (value === undefined) throw new Error(`${args[at]} needs a value\n${usage}`);
  args.splice(at, 2);
  return value;
}

async function main(argv) {
  const [command, ...args] = argv;
  if (command === "build") {
    const output = option(args, ["-o", "--output"]);
    const quiet = args.includes("-q") || args.includes("--quiet");
    const rest = args.filter((a) => a !== "-q" && a !== "--quiet");
    if (rest.length !== 1) throw new Error(usage);
    await build(rest[0], output ?? rest[0].replace(/\.m?js$/, ".wasm"), { quiet });
  } else if (command === "stamp") {
    const version = option(args, ["--api-version"]) ?? API_VERSION;
    if (args.length !== 1) throw new Error(usage);
    writeFileSync(args[0], stamp(new Uint8Array(readFileSync(args[0])), version));
  } else {
    throw new Error(usage);
  }
}

main(process.argv.slice(2)).catch((e) => {
  console.error(`switchyard-strategy: ${e.message ?? e}`);
  process.exit(1);
});
