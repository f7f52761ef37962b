"""Stamps the API version into a component: a top-level custom section `switchyard-router-api`
whose payload is the version in UTF-8, which the host reads before compiling (see
`wit/PENDING.md`). Custom sections may sit anywhere in a component, so appending one is a valid
edit that no other section refers to."""

SECTION = "switchyard-router-api"
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


def stamped_version(data: bytes):
    """The version in the component's top-level section, or None."""
    for section_id, name, payload in _sections(data):
        if section_id == 0 and name == SECTION:
            return payload.decode()
    return None


def stamp(path: str, version: str) -> None:
    """Appends the section to the component at `path` (once; a differing stamp is an error)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != _COMPONENT_PREAMBLE:
        raise ValueError(f"{path} is not a WebAssembly component")
    existing = stamped_version(data)
    if existing == version:
        return
    if existing is not None:
        raise ValueError(f"{path} is already stamped with API version {existing}")
    with open(path, "ab") as f:
        f.write(custom_section(SECTION, version.encode()))
