// Unit tests of the JavaScript SDK, in Node: `node --test sdk/js/test/`.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  Decision,
  Rng,
  Strategy,
  candidate,
  declaredOrder,
  exportStrategy,
  param,
  paramsSchema,
  parseParams,
  prefillAwarePrimary,
  primaryThenDeclared,
  priorityTiers,
  requestWithSeed,
  weightedDraw,
  weightedShuffle,
  affinityFirst,
  DEFAULT_PREFILL,
} from "../src/index.js";
import { SECTION, declareSkips, declaredSkips, stamp, stampedVersion } from "../src/stamp.js";

test("Rng matches the reference SplitMix64 sequence (and the Rust and Python SDKs)", () => {
  const rng = new Rng(0n);
  assert.equal(rng.nextU64(), 0xe220a8397b1dcdafn);
  assert.equal(rng.nextU64(), 0x6e789e6aa1b965f4n);
  assert.equal(rng.nextU64(), 0x06c45d188009454fn);
  // A Number seed is the same seed.
  assert.equal(new Rng(42).nextU64(), new Rng(42n).nextU64());
  const bounded = new Rng(3);
  for (let i = 0; i < 1000; i++) assert.ok(bounded.below(5) < 5);
  assert.equal(bounded.below(0), 0);
});

function shares(weights, draws) {
  const counts = weights.map(() => 0);
  for (let seed = 0; seed < draws; seed++) {
    const p = weightedDraw(weights, new Rng(seed));
    if (p !== null) counts[p] += 1;
  }
  return counts.map((n) => n / draws);
}

test("weightedDraw follows weights and never draws unusable ones", () => {
  const s = shares([0.7, 0.3], 10000);
  assert.ok(Math.abs(s[0] - 0.7) < 0.03, String(s));
  for (let seed = 0; seed < 200; seed++) {
    assert.equal(weightedDraw([0, -1, NaN, Infinity, 2], new Rng(seed)), 4);
  }
  const rng = new Rng(9);
  assert.equal(weightedDraw([0, 0], rng), null);
  assert.equal(rng.state, new Rng(9).state, "no randomness consumed");
});

test("weightedShuffle is a permutation with unusable weights last", () => {
  for (let seed = 0; seed < 200; seed++) {
    const order = weightedShuffle([0, 3, 1, NaN, 2], new Rng(seed));
    assert.deepEqual([...order].sort(), [0, 1, 2, 3, 4]);
    assert.deepEqual(order.slice(3), [0, 3]);
    assert.equal(order[0], weightedDraw([0, 3, 1, NaN, 2], new Rng(seed)));
  }
});

test("declared helpers and tiers sort by index", () => {
  const c = (index, priority) => candidate(index, 1, { priority });
  const cands = [c(4, 0), c(1, 0), c(3, 0)];
  assert.deepEqual(declaredOrder(cands), [1, 3, 4]);
  assert.deepEqual(primaryThenDeclared(cands, 2), [3, 1, 4]);
  const tiered = [c(5, 1), c(0, -2), c(2, 10), c(1, 1), c(3, 10)];
  assert.deepEqual(priorityTiers(tiered), [[2, 4], [3, 0], [1]]);
  const order = [2, 0, 1];
  const pinned = [candidate(0, 1), candidate(1, 1, { affinityPinned: true }), candidate(2, 1)];
  affinityFirst(pinned, order);
  assert.deepEqual(order, [1, 2, 0]);
});

test("prefillAwarePrimary: at the threshold the lighter endpoint wins 3/4", () => {
  const cands = [candidate(0, 1, { prefillBacklogTokens: 50000 }), candidate(1, 1)];
  let first = 0;
  for (let seed = 0; seed < 4000; seed++) {
    if (prefillAwarePrimary(cands, DEFAULT_PREFILL, new Rng(seed)) === 0) first += 1;
  }
  assert.ok(Math.abs(first / 4000 - 0.25) < 0.03, String(first));
});

test("params: one declaration gives the schema and the parser", () => {
  const declaration = {
    order: param.enum(["declared", "weighted"], { default: "declared", description: "fallbacks" }),
    limit: param.integer({ minimum: 1 }),
    skip: param.boolean({ default: true }),
  };
  const schema = paramsSchema(declaration);
  assert.equal(schema.additionalProperties, false);
  assert.deepEqual(schema.required, ["limit"]);
  assert.equal(schema.properties.order.default, "declared");
  assert.deepEqual(parseParams(declaration, '{"limit": 2}'), { order: "declared", limit: 2, skip: true });
  assert.throws(() => parseParams(declaration, '{"limit": 2, "weights": 1}'), /unknown field `weights`/);
  assert.throws(() => parseParams(declaration, '{"limit": 0}'), /limit: expected an integer >= 1, got 0/);
  assert.throws(() => parseParams(declaration, '{"limit": 1, "order": "random"}'), /order: expected one of/);
  assert.throws(() => parseParams(declaration, "{}"), /limit: missing field/);
  assert.throws(() => parseParams(declaration, "[]"), /expected a JSON object/);
  assert.deepEqual(parseParams({}, ""), {});
});

test("exportStrategy takes only Strategy classes; Decision builders", () => {
  class First extends Strategy {
    static info() {
      return { name: "first", version: "1", description: "" };
    }
    static create() {
      return new First();
    }
    select(_request, candidates) {
      return new Decision(declaredOrder(candidates));
    }
  }
  assert.equal(exportStrategy(First), First);
  assert.throws(() => exportStrategy({}), TypeError);
  const router = First.create("m", {});
  const decision = router.select(requestWithSeed(1), [candidate(2, 1), candidate(0, 1)]);
  assert.deepEqual(decision.order, [0, 2]);
  const hedged = new Decision([1, 0]).withHedge(250, 0).withMetadata("m");
  assert.deepEqual(hedged.hedge, { afterMs: 250, backup: 0 });
  assert.equal(hedged.strategyMetadata, "m");
  assert.equal(router.status(), "{}");
});

test("stamp appends the API version section once", () => {
  const component = Uint8Array.from([0, 0x61, 0x73, 0x6d, 0x0d, 0, 1, 0]);
  const stamped = stamp(component, "0.2.0");
  assert.equal(stampedVersion(stamped), "0.2.0");
  assert.equal(stamp(stamped, "0.2.0"), stamped, "stamping twice is a no-op");
  assert.throws(() => stamp(stamped, "0.3.0"), /already stamped with API version 0.2.0/);
  assert.throws(() => stamp(Uint8Array.from([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0]), "0.2.0"), /not a WebAssembly component/);
  // id 0, size, name length, name, payload.
  const tail = [...stamped.slice(8)];
  assert.deepEqual(tail.slice(0, 3), [0, 1 + SECTION.length + 5, SECTION.length]);
});

test("skips are declared once, and only calls the host can skip", () => {
  const component = Uint8Array.from([0, 0x61, 0x73, 0x6d, 0x0d, 0, 1, 0]);
  assert.equal(declareSkips(component, []), component, "no words, no section");
  assert.equal(declaredSkips(component), null);
  const declared = declareSkips(component, ["observe", "tick", "observe"]);
  assert.deepEqual(declaredSkips(declared), ["observe", "tick"]);
  assert.equal(declareSkips(declared, ["observe", "tick"]), declared, "declaring alike twice is a no-op");
  assert.throws(() => declareSkips(declared, ["select-single"]), /already declares skips observe tick/);
  assert.throws(() => declareSkips(component, ["obsreve"]), /known: observe, tick, select-single/);
});
