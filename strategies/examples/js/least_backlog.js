// `least_backlog` in JavaScript: the primary is the candidate with the least prefill backlog in
// the highest priority tier; ties go to a weighted draw seeded by the request; the rest follow in
// declared order. The same strategy as `../python/least_backlog.py`.

import {
  Decision,
  Rng,
  Strategy,
  exportStrategy,
  param,
  primaryThenDeclared,
  priorityTiers,
  weightedDraw,
} from "switchyard-strategy";

export class LeastBacklog extends Strategy {
  static params = {
    tolerance_tokens: param.integer({
      default: 0,
      minimum: 0,
      description: "Backlogs within this many tokens of the least tie.",
    }),
  };

  static info() {
    return {
      name: "least_backlog_js",
      version: "0.1.0",
      description: "Least prefill backlog in the top tier; weight breaks ties.",
    };
  }

  static create(_modelId, params) {
    return new LeastBacklog(params.tolerance_tokens);
  }

  constructor(tolerance) {
    super();
    this.tolerance = tolerance;
    this.selects = 0;
  }

  select(request, candidates) {
    this.selects += 1;
    if (candidates.length === 0) return new Decision([]);
    const top = priorityTiers(candidates)[0];
    const least = Math.min(...top.map((p) => candidates[p].prefillBacklogTokens));
    const tied = top.filter((p) => candidates[p].prefillBacklogTokens <= least + this.tolerance);
    const drawn = weightedDraw(
      tied.map((p) => candidates[p].weight),
      Rng.forRequest(request),
    );
    return new Decision(primaryThenDeclared(candidates, drawn === null ? tied[0] : tied[drawn]));
  }

  status() {
    return JSON.stringify({ selects: this.selects });
  }
}

exportStrategy(LeastBacklog);
