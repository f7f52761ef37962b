// `router_params`, declared once: a small schema builder from which both the JSON Schema the host
// validates against and the parser come (the Rust SDK's serde + schemars).
//
//   static params = {
//     fallback_order: param.enum(["declared", "weighted"], { default: "declared", description: "…" }),
//     skip_open: param.boolean({ default: true }),
//   };
//
// Keys are kept as written (YAML's snake_case). A parameter without `default` is required.

export class ParamsError extends Error {}

function spec(schema, check, opts = {}) {
  const { default: fallback, description, ...rest } = opts;
  const full = { ...schema, ...rest };
  if (description !== undefined) full.description = description;
  if (fallback !== undefined) full.default = fallback;
  return { schema: full, check, fallback, required: fallback === undefined };
}

const show = (value) => JSON.stringify(value) ?? String(value);

export const param = {
  boolean: (opts) =>
    spec({ type: "boolean" }, (v) => (typeof v === "boolean" ? v : fail("a boolean", v)), opts),
  integer: (opts) =>
    spec(
      { type: "integer" },
      (v) => {
        if (!Number.isInteger(v)) fail("an integer", v);
        if (opts?.minimum !== undefined && v < opts.minimum) fail(`an integer >= ${opts.minimum}`, v);
        if (opts?.maximum !== undefined && v > opts.maximum) fail(`an integer <= ${opts.maximum}`, v);
        return v;
      },
      opts,
    ),
  number: (opts) =>
    spec(
      { type: "number" },
      (v) => {
        if (typeof v !== "number" || !Number.isFinite(v)) fail("a number", v);
        if (opts?.minimum !== undefined && v < opts.minimum) fail(`a number >= ${opts.minimum}`, v);
        if (opts?.maximum !== undefined && v > opts.maximum) fail(`a number <= ${opts.maximum}`, v);
        return v;
      },
      opts,
    ),
  string: (opts) => spec({ type: "string" }, (v) => (typeof v === "string" ? v : fail("a string", v)), opts),
  enum: (values, opts) =>
    spec(
      { enum: values },
      (v) => (values.includes(v) ? v : fail(`one of ${values.map(show).join(", ")}`, v)),
      opts,
    ),
  array: (item, opts) =>
    spec(
      { type: "array", items: item.schema },
      (v, path) => {
        if (!Array.isArray(v)) fail("an array", v);
        return v.map((x, i) => at(`${path}[${i}]`, () => item.check(x, `${path}[${i}]`)));
      },
      opts,
    ),
};

function fail(expected, value) {
  throw new ParamsError(`expected ${expected}, got ${show(value)}`);
}

function at(path, f) {
  try {
    return f();
  } catch (e) {
    if (e instanceof ParamsError && !e.located) {
      const located = new ParamsError(`${path}: ${e.message}`);
      located.located = true;
      throw located;
    }
    throw e;
  }
}

/** The JSON Schema (draft 2020-12) of a params declaration; unknown keys are rejected. */
export function paramsSchema(declaration = {}) {
  const properties = {};
  const required = [];
  for (const [key, p] of Object.entries(declaration)) {
    properties[key] = p.schema;
    if (p.required) required.push(key);
  }
  const schema = {
    $schema: "https://json-schema.org/draft/2020-12/schema",
    type: "object",
    properties,
    additionalProperties: false,
  };
  if (required.length > 0) schema.required = required;
  return schema;
}

/** Parses `router_params` JSON (blank counts as `{}`) into an object with defaults filled in. */
export function parseParams(declaration = {}, json = "{}") {
  let value;
  try {
    value = JSON.parse(json.trim() === "" ? "{}" : json);
  } catch (e) {
    throw new ParamsError(`invalid router_params: ${e.message}`);
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new ParamsError("invalid router_params: expected a JSON object");
  }
  const known = Object.keys(declaration);
  for (const key of Object.keys(value)) {
    if (!known.includes(key)) {
      const expected = known.length > 0 ? known.map((k) => `\`${k}\``).join(", ") : "none";
      throw new ParamsError(`invalid router_params: unknown field \`${key}\`, expected one of ${expected}`);
    }
  }
  const parsed = {};
  for (const [key, p] of Object.entries(declaration)) {
    try {
      if (key in value) parsed[key] = at(key, () => p.check(value[key], key));
      else if (p.required) throw new ParamsError(`${key}: missing field`);
      else parsed[key] = structuredCloneSafe(p.fallback);
    } catch (e) {
      if (e instanceof ParamsError) throw new ParamsError(`invalid router_params: ${e.message}`);
      throw e;
    }
  }
  return parsed;
}

// Defaults are JSON values: a copy keeps one router's params from aliasing another's.
function structuredCloneSafe(value) {
  return value !== null && typeof value === "object" ? JSON.parse(JSON.stringify(value)) : value;
}
