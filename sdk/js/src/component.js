// What componentize-qjs calls: an export named after the `strategy` interface holding its
// functions and the `Router` resource class. `switchyard-strategy build` imports the author's
// module (which calls `exportStrategy`) and re-exports `strategy` from here; authors never see
// these names. Only loaded inside a component.

import host from "switchyard:router/host@0.2.0";
import { _setHostLog, exportedStrategy } from "./index.js";
import { paramsSchema, parseParams } from "./params.js";

_setHostLog((level, message) => host.log(level, message));

function strategyClass() {
  const cls = exportedStrategy();
  if (cls === null) throw "no strategy exported: call exportStrategy(...) in the built module";
  return cls;
}

// A thrown value becomes the call's `err`; the host wants a string.
function message(error) {
  return error instanceof Error ? `${error.name === "Error" ? "" : `${error.name}: `}${error.message}` : String(error);
}

// 64-bit integers: a Number whatever the runtime hands over (QuickJS gives Numbers, other engines
// BigInts); backlogs and timestamps are far below 2^53.
const num = (v) => (typeof v === "bigint" ? Number(v) : v);

function candidates(list) {
  for (const c of list) {
    c.prefillBacklogTokens = num(c.prefillBacklogTokens);
    c.uncachedPromptTokens = num(c.uncachedPromptTokens);
  }
  return list;
}

function request(r) {
  r.callerHash = num(r.callerHash);
  r.nowMs = num(r.nowMs);
  r.prefill.interveneTokens = num(r.prefill.interveneTokens);
  r.prefill.elephantTokens = num(r.prefill.elephantTokens);
  return r;
}

class Router {
  constructor(inner) {
    this.inner = inner;
  }

  static create(modelId, paramsJson) {
    const cls = strategyClass();
    try {
      return new Router(cls.create(modelId, parseParams(cls.params, paramsJson)));
    } catch (e) {
      throw message(e);
    }
  }

  refreshUpstreams(upstreams) {
    this.inner.refreshUpstreams(upstreams);
  }

  select(req, list) {
    let decision;
    try {
      decision = this.inner.select(request(req), candidates(list));
    } catch (e) {
      throw message(e);
    }
    return {
      order: decision.order,
      hedge: decision.hedge ?? null,
      strategyMetadata: decision.strategyMetadata ?? "",
    };
  }

  observe(observation) {
    observation.nowMs = num(observation.nowMs);
    this.inner.observe(observation);
  }

  status() {
    return String(this.inner.status());
  }

  tick(nowMs) {
    this.inner.tick(num(nowMs));
  }
}

export const strategy = {
  info() {
    const { name, version, description } = strategyClass().info();
    return { name: String(name), version: String(version), description: String(description ?? "") };
  },
  paramsSchema() {
    return JSON.stringify(paramsSchema(strategyClass().params));
  },
  Router,
};
