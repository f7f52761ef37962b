// Stamps the API version into a component: a top-level custom section `switchyard-router-api`
// whose payload is the version in UTF-8, read by the host before compiling (see wit/PENDING.md).
// Custom sections may sit anywhere in a component, so appending one is a valid edit that no
// other section refers to.

export const SECTION = "switchyard-router-api";
// The calls a strategy may declare it does without (the host's `SkippedCalls`).
export const SKIPS_SECTION = "switchyard-router-skips";
export const SKIPPABLE = ["observe", "tick", "select-single"];
const PREAMBLE = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

function leb128(n) {
  const out = [];
  do {
    let byte = n & 0x7f;
    n = Math.floor(n / 128);
    if (n > 0) byte |= 0x80;
    out.push(byte);
  } while (n > 0);
  return out;
}

/** The bytes of one custom section (id 0, size, name, payload). */
export function customSection(name, payload) {
  const nameBytes = [...new TextEncoder().encode(name)];
  const body = [...leb128(nameBytes.length), ...nameBytes, ...payload];
  return Uint8Array.from([0, ...leb128(body.length), ...body]);
}

/** The payload of the component's top-level custom section `wanted`, as text, or null. */
function sectionText(bytes, wanted) {
  let pos = 8;
  const leb = () => {
    let result = 0;
    let scale = 1;
    for (;;) {
      const byte = bytes[pos++];
      result += (byte & 0x7f) * scale;
      if ((byte & 0x80) === 0) return result;
      scale *= 128;
    }
  };
  while (pos < bytes.length) {
    const id = bytes[pos++];
    const size = leb();
    const end = pos + size;
    if (id === 0) {
      const nameLength = leb();
      const name = new TextDecoder().decode(bytes.subarray(pos, pos + nameLength));
      if (name === wanted) return new TextDecoder().decode(bytes.subarray(pos + nameLength, end));
    }
    pos = end;
  }
  return null;
}

/** The version in the component's top-level section, or null. */
export function stampedVersion(bytes) {
  return sectionText(bytes, SECTION);
}

/** The words of the component's top-level `switchyard-router-skips` section, or null. */
export function declaredSkips(bytes) {
  const text = sectionText(bytes, SKIPS_SECTION);
  return text === null ? null : text.split(/\s+/).filter(Boolean);
}

/**
 * `bytes` with a `switchyard-router-skips` section naming the calls the strategy does without
 * (unchanged for no words, or when already declared alike). `observe`: its `observe` does
 * nothing. `tick`: its `tick` does nothing. `select-single`: with one candidate, `select` orders
 * that candidate alone, with no hedge and empty metadata, and changes no state. The host then does
 * not make those calls; `switchyard strategies test` checks `select-single` against the component.
 */
export function declareSkips(bytes, skips) {
  const words = [...new Set(skips)];
  const unknown = words.filter((w) => !SKIPPABLE.includes(w));
  if (unknown.length > 0) throw new Error(`cannot skip ${unknown.join(", ")} (known: ${SKIPPABLE.join(", ")})`);
  if (words.length === 0) return bytes;
  if (!PREAMBLE.every((b, i) => bytes[i] === b)) throw new Error("not a WebAssembly component");
  const existing = declaredSkips(bytes);
  if (existing !== null) {
    if (existing.join(" ") === words.join(" ")) return bytes;
    throw new Error(`already declares skips ${existing.join(" ")}`);
  }
  return append(bytes, customSection(SKIPS_SECTION, new TextEncoder().encode(words.join(" "))));
}

function append(bytes, section) {
  const out = new Uint8Array(bytes.length + section.length);
  out.set(bytes);
  out.set(section, bytes.length);
  return out;
}

/** `bytes` with the section appended (unchanged when already stamped with `version`). */
export function stamp(bytes, version) {
  if (!PREAMBLE.every((b, i) => bytes[i] === b)) throw new Error("not a WebAssembly component");
  const existing = stampedVersion(bytes);
  if (existing === version) return bytes;
  if (existing !== null) throw new Error(`already stamped with API version ${existing}`);
  return append(bytes, customSection(SECTION, new TextEncoder().encode(version)));
}
