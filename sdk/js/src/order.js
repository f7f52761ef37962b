// Building blocks for ordering candidates (the Rust SDK's `order` module).
//
// "Position" is a position in the `candidates` array passed to `select`; "index" is an upstream's
// declared index (`candidate.index`), which is what a decision lists. The host may pass candidates
// in any order, so helpers that speak of declared order sort by index.

/** Whether `weight` takes part in weighted choices: finite and strictly positive. */
export function usableWeight(weight) {
  return Number.isFinite(weight) && weight > 0;
}

/**
 * One position drawn with probability proportional to its weight, or `null` (consuming no
 * randomness) when no weight is usable; otherwise consumes exactly one `rng.nextF64()`.
 */
export function weightedDraw(weights, rng) {
  let top = 0;
  for (const w of weights) if (usableWeight(w) && w > top) top = w;
  if (top <= 0) return null;
  let total = 0;
  for (const w of weights) if (usableWeight(w)) total += w / top;
  const target = rng.nextF64() * total;
  let cumulative = 0;
  let last = null;
  for (let position = 0; position < weights.length; position++) {
    const w = weights[position];
    if (!usableWeight(w)) continue;
    const share = w / top;
    if (share <= 0) continue;
    cumulative += share;
    last = position;
    if (target < cumulative) return position;
  }
  // Only reachable through rounding in the running sum.
  return last;
}

/** A weighted random order without replacement (see the Rust SDK's `weighted_shuffle`). */
export function weightedShuffle(weights, rng) {
  const remaining = [];
  for (let p = 0; p < weights.length; p++) if (usableWeight(weights[p])) remaining.push(p);
  const pool = remaining.map((p) => weights[p]);
  const order = [];
  for (;;) {
    const drawn = weightedDraw(pool, rng);
    if (drawn === null) break;
    order.push(remaining.splice(drawn, 1)[0]);
    pool.splice(drawn, 1);
  }
  order.push(...remaining);
  for (let p = 0; p < weights.length; p++) if (!usableWeight(weights[p])) order.push(p);
  return order;
}

/** Candidate positions sorted by declared index (stable). */
export function declaredPositions(candidates) {
  return candidates.map((_, p) => p).sort((a, b) => candidates[a].index - candidates[b].index || a - b);
}

/** The candidates' declared indexes in ascending order: the host's default order. */
export function declaredOrder(candidates) {
  return candidates.map((c) => c.index).sort((a, b) => a - b);
}

/** The declared indexes of the candidates at `positions`, in that order. */
export function orderOfPositions(candidates, positions) {
  return positions.map((p) => candidates[p].index);
}

/** The candidate at position `primary` first, then every other one in declared order. */
export function primaryThenDeclared(candidates, primary) {
  const order = [candidates[primary].index];
  for (const p of declaredPositions(candidates)) if (p !== primary) order.push(candidates[p].index);
  return order;
}

/** The declared index of the candidate session affinity pins the caller to, or `null`. */
export function affinityPinned(candidates) {
  const pinned = candidates.find((c) => c.affinityPinned);
  return pinned === undefined ? null : pinned.index;
}

/** Moves the affinity-pinned candidate (if `order` holds it) to the front, in place. */
export function affinityFirst(candidates, order) {
  const pinned = affinityPinned(candidates);
  const at = pinned === null ? -1 : order.indexOf(pinned);
  if (at > 0) {
    order.splice(at, 1);
    order.unshift(pinned);
  }
}

/** Candidate positions grouped by priority, highest first; declared order within a tier. */
export function priorityTiers(candidates) {
  const positions = declaredPositions(candidates);
  // Array.prototype.sort is stable: declared order survives within a priority.
  positions.sort((a, b) => candidates[b].priority - candidates[a].priority);
  const tiers = [];
  let current = null;
  for (const p of positions) {
    const priority = candidates[p].priority;
    if (tiers.length > 0 && current === priority) tiers[tiers.length - 1].push(p);
    else {
      tiers.push([p]);
      current = priority;
    }
  }
  return tiers;
}
