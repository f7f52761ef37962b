"""Building blocks for ordering candidates (the Rust SDK's `order` module).

"Position" is a position in the `candidates` list passed to `select`; "index" is an upstream's
declared index (`candidate.index`), which is what a `Decision` lists. The host may pass candidates
in any order, so helpers that speak of declared order sort by index.
"""

import math


def usable_weight(weight: float) -> bool:
    """Whether `weight` takes part in weighted choices: finite and strictly positive."""
    return math.isfinite(weight) and weight > 0.0


def weighted_draw(weights, rng):
    """One position drawn with probability proportional to its weight, or None (consuming no
    randomness) when no weight is usable. Consumes exactly one `rng.next_f64()` otherwise."""
    usable = [w for w in weights if usable_weight(w)]
    if not usable:
        return None
    top = max(usable)
    # Scaled to (0, 1] so the sum cannot overflow.
    total = sum(w / top for w in usable)
    target = rng.next_f64() * total
    cumulative = 0.0
    last = None
    for position, weight in enumerate(weights):
        if not usable_weight(weight):
            continue
        share = weight / top
        if share <= 0.0:
            continue
        cumulative += share
        last = position
        if target < cumulative:
            return position
    # Only reachable through rounding in the running sum.
    return last


def weighted_shuffle(weights, rng):
    """A weighted random order without replacement: every position once, usable weights first
    (repeated `weighted_draw`s), then the others in their original order."""
    remaining = [p for p in range(len(weights)) if usable_weight(weights[p])]
    pool = [weights[p] for p in remaining]
    order = []
    while True:
        drawn = weighted_draw(pool, rng)
        if drawn is None:
            break
        order.append(remaining.pop(drawn))
        pool.pop(drawn)
    order.extend(remaining)
    order.extend(p for p in range(len(weights)) if not usable_weight(weights[p]))
    return order


def declared_positions(candidates):
    """Candidate positions sorted by declared index (stable)."""
    return sorted(range(len(candidates)), key=lambda p: candidates[p].index)


def declared_order(candidates):
    """The candidates' declared indexes in ascending order: the host's default order."""
    return sorted(c.index for c in candidates)


def order_of_positions(candidates, positions):
    """The declared indexes of the candidates at `positions`, in that order."""
    return [candidates[p].index for p in positions]


def primary_then_declared(candidates, primary):
    """The candidate at position `primary` first, then every other one in declared order."""
    return [candidates[primary].index] + [
        candidates[p].index for p in declared_positions(candidates) if p != primary
    ]


def affinity_pinned(candidates):
    """The declared index of the candidate session affinity pins the caller to, or None."""
    for c in candidates:
        if c.affinity_pinned:
            return c.index
    return None


def affinity_first(candidates, order):
    """Moves the affinity-pinned candidate (if `order` holds it) to the front, in place."""
    pinned = affinity_pinned(candidates)
    if pinned is not None and pinned in order:
        order.remove(pinned)
        order.insert(0, pinned)


def priority_tiers(candidates):
    """Candidate positions grouped by priority, highest first; declared order within a tier."""
    positions = sorted(declared_positions(candidates), key=lambda p: -candidates[p].priority)
    tiers = []
    current = None
    for p in positions:
        priority = candidates[p].priority
        if tiers and current == priority:
            tiers[-1].append(p)
        else:
            tiers.append([p])
            current = priority
    return tiers
