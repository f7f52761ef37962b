"""`router_params`: declared once as a dataclass, from which both the JSON Schema the host
validates against and the parser come (the Rust SDK's serde + schemars, without dependencies:
componentize-py bundles pure Python only).

Supported field types: bool, int, float, str, `typing.Literal[...]` of strings or ints,
`Optional[T]`, `list[T]` and nested dataclasses. A field without a default is required; a
description goes in `field(metadata={"description": "..."})`.
"""

import dataclasses
import json
import math
import typing


class ParamsError(ValueError):
    """`router_params` that do not fit the params class; the message names the key's path."""


@dataclasses.dataclass
class NoParams:
    """Params of a strategy that takes none: only `{}` is accepted."""


def _schema_of(tp):
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin is typing.Union and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return {"anyOf": [_schema_of(inner[0]), {"type": "null"}]}
    if origin is list and len(args) == 1:
        return {"type": "array", "items": _schema_of(args[0])}
    if dataclasses.is_dataclass(tp):
        return _object_schema(tp)
    raise TypeError(f"router params: unsupported field type {tp!r}")


def _default_of(f):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _to_json(value):
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return value


def _object_schema(cls):
    hints = typing.get_type_hints(cls)
    properties = {}
    required = []
    for f in dataclasses.fields(cls):
        prop = _schema_of(hints[f.name])
        description = f.metadata.get("description")
        if description:
            prop["description"] = description
        default = _default_of(f)
        if default is dataclasses.MISSING:
            required.append(f.name)
        else:
            prop["default"] = _to_json(default)
        properties[f.name] = prop
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("):
        schema["description"] = cls.__doc__.strip()
    return schema


def params_schema(cls) -> dict:
    """The JSON Schema (draft 2020-12) of `cls`; the top level rejects unknown keys."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": cls.__name__}
    schema.update(_object_schema(cls))
    return schema


def _type_name(tp):
    return json.dumps(_schema_of(tp))


def _convert(tp, value, path):
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    where = f"{path}: " if path else ""
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ParamsError(f"{where}expected a boolean, got {json.dumps(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ParamsError(f"{where}expected an integer, got {json.dumps(value)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise ParamsError(f"{where}expected a number, got {json.dumps(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ParamsError(f"{where}expected a string, got {json.dumps(value)}")
    if origin is typing.Literal:
        if value in args and not isinstance(value, bool):
            return value
        expected = ", ".join(json.dumps(a) for a in args)
        raise ParamsError(f"{where}expected one of {expected}, got {json.dumps(value)}")
    if origin is typing.Union and type(None) in args:
        if value is None:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, path)
    if origin is list:
        if not isinstance(value, list):
            raise ParamsError(f"{where}expected an array, got {json.dumps(value)}")
        return [_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return _object(tp, value, path)
    raise ParamsError(f"{where}unsupported type {_type_name(tp)}")


def _object(cls, value, path):
    if not isinstance(value, dict):
        where = f"{path}: " if path else ""
        raise ParamsError(f"{where}expected a JSON object, got {json.dumps(value)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in value:
        if key not in fields:
            known = ", ".join(f"`{k}`" for k in fields) or "none"
            at = f"{path}." if path else ""
            raise ParamsError(f"{at}unknown field `{key}`, expected one of {known}")
    kwargs = {}
    for name, f in fields.items():
        sub = f"{path}.{name}" if path else name
        if name in value:
            kwargs[name] = _convert(hints[name], value[name], sub)
        elif _default_of(f) is dataclasses.MISSING:
            raise ParamsError(f"{sub}: missing field")
    return cls(**kwargs)


def parse_params(cls, params_json: str):
    """Parses `router_params` JSON into `cls`; blank counts as `{}`. Raises `ParamsError` with a
    one-line message naming the offending key, e.g. ``fallback_order: expected one of
    "declared", "weighted", got "random"``."""
    text = params_json.strip() or "{}"
    try:
        value = json.loads(text)
    except ValueError as error:
        raise ParamsError(f"invalid router_params: {error}") from None
    try:
        return _object(cls, value, "")
    except ParamsError as error:
        raise ParamsError(f"invalid router_params: {error}") from None
