"""Stamps the API version into a component: a top-level custom section `switchyard-router-api`
whose payload is the version in UTF-8, which the host reads before compiling (see
`wit/PENDING.md`). Custom sections may sit anywhere in a component, so appending one is a valid
edit that no other section refers to."""

SECTION = "switchyard-router-api"
# The calls a strategy may declare it does without (the host's `SkippedCalls`).
SKIPS_SECTION = "switchyard-router-skips"
SKIPPABLE = ("observe", "tick", "select-single")
_COMPONENT_PREAMBLE = b"\0asm\x0d\x00\x01\x00"


def _leb128(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def custom_section(name: str, payload: bytes) -> bytes:
    """The bytes of one custom section (id 0, size, name, payload)."""
    body = _leb128(len(name.encode())) + name.encode() + payload
    return b"\x00" + _leb128(len(body)) + body


def _sections(data: bytes):
    """(id, name or None, payload) of each top-level section."""
    pos = 8

    def leb():
        nonlocal pos
        result = shift = 0
        while True:
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    while pos < len(data):
        section_id = data[pos]
        pos += 1
        size = leb()
        end = pos + size
        if section_id == 0:
            name_len = leb()
            name = data[pos : pos + name_len].decode("utf-8", "replace")
            yield section_id, name, data[pos + name_len : end]
        else:
            yield section_id, None, None
        pos = end


def _section_text(data: bytes, wanted: str):
    """The payload of the component's top-level custom section `wanted`, or None."""
    for section_id, name, payload in _sections(data):
        if section_id == 0 and name == wanted:
            return payload.decode()
    return None


def stamped_version(data: bytes):
    """The version in the component's top-level section, or None."""
    return _section_text(data, SECTION)


def declared_skips(data: bytes):
    """The words of the component's top-level `switchyard-router-skips` section, or None."""
    text = _section_text(data, SKIPS_SECTION)
    return None if text is None else text.split()


def declare_skips(path: str, skips) -> None:
    """Appends a `switchyard-router-skips` section naming the calls the strategy does without
    (once; a differing declaration is an error). Nothing is written for no words.

    `observe`: its `observe` does nothing. `tick`: its `tick` does nothing. `select-single`: with
    one candidate, `select` orders that candidate alone, with no hedge and empty metadata, and
    changes no state. The host then does not make those calls; `switchyard strategies test`
    checks `select-single` against the component."""
    words = list(dict.fromkeys(skips))
    unknown = [w for w in words if w not in SKIPPABLE]
    if unknown:
        raise ValueError(f"cannot skip {', '.join(unknown)} (known: {', '.join(SKIPPABLE)})")
    if words:
        _append_once(path, SKIPS_SECTION, " ".join(words), "already declares skips")


def stamp(path: str, version: str) -> None:
    """Appends the section to the component at `path` (once; a differing stamp is an error)."""
    _append_once(path, SECTION, version, "is already stamped with API version")


def _append_once(path: str, name: str, text: str, differing: str) -> None:
    """Appends section `name` holding `text` to the component at `path`, unless it holds it already;
    a section of that name with other text is an error (`differing`, then that text)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != _COMPONENT_PREAMBLE:
        raise ValueError(f"{path} is not a WebAssembly component")
    existing = _section_text(data, name)
    if existing == text:
        return
    if existing is not None:
        raise ValueError(f"{path} {differing} {existing}")
    with open(path, "ab") as f:
        f.write(custom_section(name, text.encode()))
