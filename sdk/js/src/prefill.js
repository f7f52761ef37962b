// Prefill-aware choice of a primary (the Rust SDK's `prefill` module): load wins over weights only
// when it matters, with the host's thresholds from `request.prefill`.

import { weightedDraw } from "./order.js";

/** Power of two choices over `positions` (see the Rust SDK's `p2c`); a position or `null`. */
export function p2c(candidates, positions, interveneTokens, rng) {
  const weights = positions.map((p) => candidates[p].weight);
  const a = weightedDraw(weights, rng);
  if (a === null) return null;
  const first = positions[a];
  const second = positions[weightedDraw(weights, rng)];
  if (first === second) return first;
  const [heavier, lighter] =
    candidates[first].prefillBacklogTokens >= candidates[second].prefillBacklogTokens
      ? [first, second]
      : [second, first];
  const heavy = candidates[heavier].prefillBacklogTokens;
  if (heavy >= interveneTokens && candidates[lighter].prefillBacklogTokens < heavy) return lighter;
  return first;
}

/** The position with the smallest backlog (ties: fewest elephants, then declared order). */
export function leastLoaded(candidates, positions) {
  let best = null;
  for (const p of positions) {
    const c = candidates[p];
    if (best === null) {
      best = p;
      continue;
    }
    const b = candidates[best];
    const key = [c.prefillBacklogTokens, c.inflightElephants, c.index];
    const bestKey = [b.prefillBacklogTokens, b.inflightElephants, b.index];
    if (key[0] < bestKey[0] || (key[0] === bestKey[0] && (key[1] < bestKey[1] || (key[1] === bestKey[1] && key[2] < bestKey[2])))) {
      best = p;
    }
  }
  return best;
}

/** The primary position under the host's prefill policy (see the Rust SDK). */
export function prefillAwarePrimary(candidates, policy, rng) {
  const all = candidates.map((_, p) => p);
  if (!policy.enabled) return weightedDraw(candidates.map((c) => c.weight), rng);
  const open = all.filter(
    (p) =>
      candidates[p].uncachedPromptTokens < policy.elephantTokens ||
      candidates[p].inflightElephants < policy.elephantLimit,
  );
  if (open.length === 0) return leastLoaded(candidates, all);
  const chosen = p2c(candidates, open, policy.interveneTokens, rng);
  return chosen !== null ? chosen : leastLoaded(candidates, open);
}
