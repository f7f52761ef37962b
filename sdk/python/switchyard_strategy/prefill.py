"""Prefill-aware choice of a primary (the Rust SDK's `prefill` module): load wins over weights
only when it matters, with the host's thresholds from `request.prefill`."""

from .order import weighted_draw


def p2c(candidates, positions, intervene_tokens, rng):
    """Power of two choices: two weighted draws over `positions`; the lighter backlog wins only
    when the heavier one has at least `intervene_tokens` pending. Returns a position or None."""
    weights = [candidates[p].weight for p in positions]
    first = weighted_draw(weights, rng)
    if first is None:
        return None
    second = weighted_draw(weights, rng)
    first, second = positions[first], positions[second]
    if first == second:
        return first
    a, b = candidates[first], candidates[second]
    if a.prefill_backlog_tokens >= b.prefill_backlog_tokens:
        heavier, lighter = first, second
    else:
        heavier, lighter = second, first
    heavy = candidates[heavier].prefill_backlog_tokens
    if heavy >= intervene_tokens and candidates[lighter].prefill_backlog_tokens < heavy:
        return lighter
    return first


def least_loaded(candidates, positions):
    """The position with the smallest backlog (ties: fewest elephants, then declared order)."""
    if not positions:
        return None
    return min(
        positions,
        key=lambda p: (
            candidates[p].prefill_backlog_tokens,
            candidates[p].inflight_elephants,
            candidates[p].index,
        ),
    )


def prefill_aware_primary(candidates, policy, rng):
    """The primary position under the host's prefill policy (see the Rust SDK's
    `prefill_aware_primary`): elephants avoid endpoints at the elephant limit, then `p2c`;
    least-loaded when no weight is usable."""
    everything = list(range(len(candidates)))
    if not policy.enabled:
        return weighted_draw([c.weight for c in candidates], rng)
    open_ = [
        p
        for p in everything
        if candidates[p].uncached_prompt_tokens < policy.elephant_tokens
        or candidates[p].inflight_elephants < policy.elephant_limit
    ]
    if not open_:
        return least_loaded(candidates, everything)
    chosen = p2c(candidates, open_, policy.intervene_tokens, rng)
    return chosen if chosen is not None else least_loaded(candidates, open_)
