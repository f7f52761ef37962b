// Write Switchyard routing strategies in JavaScript, as WebAssembly components.
//
// The same shape as the Rust SDK (`switchyard-sdk`): extend `Strategy`, declare `static params`
// once (the JSON Schema and the parser both come from it), implement `static info()`,
// `static create(modelId, params)` and `select(request, candidates)` (`refreshUpstreams`,
// `observe`, `status` and `tick` are optional), and call `exportStrategy` on the class.
// `switchyard-strategy build my_strategy.js -o my_strategy.wasm` makes the component (QuickJS,
// through componentize-qjs); everything also runs in Node, so the logic is unit-tested there.
//
// Records arrive with camelCase fields (`candidate.prefillBacklogTokens`); the SDK turns 64-bit
// integers into Numbers before your code sees them, except `request.seed`, which `Rng` takes as
// it comes.

export { Rng } from "./rng.js";
export {
  usableWeight,
  weightedDraw,
  weightedShuffle,
  declaredPositions,
  declaredOrder,
  orderOfPositions,
  primaryThenDeclared,
  affinityPinned,
  affinityFirst,
  priorityTiers,
} from "./order.js";
export { p2c, leastLoaded, prefillAwarePrimary } from "./prefill.js";
export { param, paramsSchema, parseParams, ParamsError } from "./params.js";
import { paramsSchema } from "./params.js";

/**
 * Version of the `switchyard:router` WIT package this SDK implements; `switchyard-strategy build`
 * stamps it into the component's `switchyard-router-api` section. The package version follows it.
 */
export const API_VERSION = "0.2.0";

/** Log levels of the host's `log`. */
export const LogLevel = Object.freeze({
  trace: "trace",
  debug: "debug",
  info: "info",
  warn: "warn",
  error: "error",
});

let hostLog = null;

/** Called by the component glue with the host's `log` import. Not for authors. */
export function _setHostLog(f) {
  hostLog = f;
}

/** Sends a message to the host's log, tagged with the strategy and model. A no-op in Node. */
export function log(level, message) {
  if (hostLog !== null) hostLog(level, String(message));
}

/** The upstreams to try, primary first, as declared indexes of candidates. */
export class Decision {
  constructor(order) {
    this.order = order;
    this.hedge = null;
    this.strategyMetadata = "";
  }

  /** Asks the host to race `backup` when the primary has not answered after `afterMs`. */
  withHedge(afterMs, backup) {
    this.hedge = { afterMs, backup };
    return this;
  }

  /** Metadata the host hands back in this request's observations. */
  withMetadata(metadata) {
    this.strategyMetadata = String(metadata);
    return this;
  }
}

/**
 * A routing strategy: one instance per canonical model, owned by the host for the life of the
 * model. Calls on one instance never overlap. An exception thrown by `create` or `select` is the
 * call's error for the host (`select` then falls back to declared order).
 */
export class Strategy {
  /** `router_params` declaration (see `param`); none by default. */
  static params = {};

  /** `{ name, version, description }`. */
  static info() {
    throw new Error(`${this.name}.info() is not implemented`);
  }

  static create(_modelId, _params) {
    throw new Error(`${this.name}.create() is not implemented`);
  }

  refreshUpstreams(_upstreams) {}

  select(_request, _candidates) {
    throw new Error(`${this.constructor.name}.select() is not implemented`);
  }

  observe(_observation) {}

  status() {
    return "{}";
  }

  tick(_nowMs) {}
}

let exported = null;

/** Makes `cls` the strategy of the component being built; call it once. Returns `cls`. */
export function exportStrategy(cls) {
  if (typeof cls !== "function" || !(cls.prototype instanceof Strategy)) {
    throw new TypeError("exportStrategy expects a class that extends Strategy");
  }
  // Fail at build time, not in the host, when the params cannot be described.
  paramsSchema(cls.params);
  exported = cls;
  return cls;
}

/** The class passed to `exportStrategy`, or null. */
export function exportedStrategy() {
  return exported;
}

/** A healthy candidate with no load (for tests); the host fills in every field. */
export function candidate(index, weight, fields = {}) {
  return {
    index,
    weight,
    priority: 0,
    availability: 1,
    circuit: "closed",
    prefillBacklogTokens: 0,
    inflightElephants: 0,
    uncachedPromptTokens: 0,
    ttftMs: null,
    latencyMs: null,
    inflightRequests: 0,
    affinityPinned: false,
    ...fields,
  };
}

/** The host's default prefill policy. */
export const DEFAULT_PREFILL = Object.freeze({
  enabled: true,
  interveneTokens: 50000,
  elephantTokens: 200000,
  elephantLimit: 1,
});

/** A text-only request with the given seed and every other field zero (for tests). */
export function requestWithSeed(seed, fields = {}) {
  return {
    callerHash: 0,
    promptTokens: 0,
    maxTokens: null,
    stream: false,
    modalities: { image: false, audio: false, video: false },
    seed,
    nowMs: 0,
    prefill: { ...DEFAULT_PREFILL },
    remainingBudgetUsd: null,
    ...fields,
  };
}
