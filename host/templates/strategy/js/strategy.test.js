// The logic of `{{name}}`, in Node: `npm test`.
import assert from "node:assert/strict";
import { test } from "node:test";

import { candidate, parseParams, requestWithSeed } from "switchyard-strategy";

import { Router } from "./{{name}}.js";

const router = (params = "{}") => Router.create("m", parseParams(Router.params, params));

test("every candidate once, and the same seed the same order", () => {
  const candidates = [candidate(2, 1), candidate(0, 3), candidate(1, 0)];
  for (let seed = 0; seed < 200; seed++) {
    const order = router().select(requestWithSeed(seed), candidates).order;
    assert.deepEqual([...order].sort(), [0, 1, 2]);
    assert.notEqual(order[0], 1, "weight 0 is never the primary");
    assert.deepEqual(order, router().select(requestWithSeed(seed), candidates).order);
  }
});

test("the pinned upstream leads unless told otherwise", () => {
  const candidates = [candidate(0, 1), candidate(1, 1, { affinityPinned: true })];
  for (let seed = 0; seed < 50; seed++) {
    assert.equal(router().select(requestWithSeed(seed), candidates).order[0], 1);
  }
  const free = router('{"honour_affinity": false}');
  const primaries = new Set();
  for (let seed = 0; seed < 50; seed++) primaries.add(free.select(requestWithSeed(seed), candidates).order[0]);
  assert.equal(primaries.size, 2, "both are drawn when affinity is ignored");
});
