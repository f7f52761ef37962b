// `{{name}}`: a weighted, prefill-aware primary, the rest in declared order, and (by default) the
// caller's affinity-pinned upstream first. Scaffolded by `switchyard strategies new`; change
// `select` to route your way.

import {
  Decision,
  Rng,
  Strategy,
  affinityFirst,
  declaredOrder,
  exportStrategy,
  param,
  prefillAwarePrimary,
  primaryThenDeclared,
} from "switchyard-strategy";

export class Router extends Strategy {
  static params = {
    honour_affinity: param.boolean({
      default: true,
      description: "Put the caller's affinity-pinned upstream (its warm prompt cache) first.",
    }),
  };

  static info() {
    return {
      name: "{{name}}",
      version: "0.1.0",
      description: "Weighted prefill-aware primary, declared fallbacks.",
    };
  }

  static create(_modelId, params) {
    return new Router(params.honour_affinity);
  }

  constructor(honourAffinity) {
    super();
    this.honourAffinity = honourAffinity;
  }

  select(request, candidates) {
    const primary = prefillAwarePrimary(candidates, request.prefill, Rng.forRequest(request));
    const order = primary === null ? declaredOrder(candidates) : primaryThenDeclared(candidates, primary);
    if (this.honourAffinity) affinityFirst(candidates, order);
    return new Decision(order);
  }
}

exportStrategy(Router);
