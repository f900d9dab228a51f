"""AnyValue to Python, JSON-ish content to Python, and the limits that keep one value from sinking a span."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import orjson
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from plumbline_otel.model import REDACTED, Frozen


@dataclass(frozen=True)
class Limits(Frozen):
    """Per-value limits; a value past them is dropped and reported, never stored half-read."""

    max_value_bytes: int = 16 << 20
    max_depth: int = 32


class ValueRejected(ValueError):
    """One attribute value broke a limit; the message says which."""


def any_value(value: AnyValue, limits: Limits, depth: int = 0) -> Any:
    """Convert an AnyValue (scalar, array, kvlist or bytes) into plain Python."""
    which = value.WhichOneof("value")
    if which == "string_value":
        s = value.string_value
        if len(s) > limits.max_value_bytes:
            raise ValueRejected(f"value of {len(s) / 1e6:.1f} MB exceeds the {limits.max_value_bytes >> 20} MiB limit")
        return s
    if which in ("int_value", "bool_value", "double_value"):
        return getattr(value, which)
    if which is None:
        return None
    if depth >= limits.max_depth:
        raise ValueRejected(f"value nested deeper than {limits.max_depth} levels")
    if which == "array_value":
        return [any_value(v, limits, depth + 1) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: any_value(kv.value, limits, depth + 1) for kv in value.kvlist_value.values}
    if which == "bytes_value":
        raw = value.bytes_value
        if len(raw) > limits.max_value_bytes:
            raise ValueRejected(f"bytes value of {len(raw) / 1e6:.1f} MB exceeds the limit")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(raw).decode("ascii")
    return None  # string_value_strindex and other profiling-only forms carry nothing for us


def maybe_json(value: Any) -> Any:
    """Content attributes arrive as JSON strings or as structures: return the structure either way."""
    if isinstance(value, str):
        stripped = value.lstrip()
        if stripped[:1] in ("{", "[", '"') or stripped in ("true", "false", "null"):
            try:
                return orjson.loads(value)
            except orjson.JSONDecodeError:
                return value
    return value


def is_redacted(value: Any) -> bool:
    """`__REDACTED__` means the producer hid the content; it is not a value."""
    return isinstance(value, str) and value.strip() == REDACTED


def as_text(value: Any) -> str | None:
    """A text field from an attribute of any type: strings exactly as they came, anything else as JSON."""
    return value if value is None or isinstance(value, str) else orjson.dumps(value, default=str).decode()


def text_of(value: Any) -> str | None:
    """A human-readable text for an input/output value: strings as they are, structures as JSON."""
    return None if is_redacted(value) else as_text(value)


_INT64 = range(-(1 << 63), 1 << 63)


def count_of(value: Any) -> int | None:
    """A token count from whatever a producer wrote (7, "7", 7.0); None when it is not one a store can hold."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if number in _INT64 else None


# Each flattened key's path below its prefix (`_path`), by the key's text past the prefix: the same few keys come in
# every span of a producer. Bounded: cleared when full, as an lru_cache would drop them one by one.
_PATHS: dict[str, tuple[str | int, ...]] = {}
_PATHS_MAX = 65536


def _path(rest: str) -> tuple[str | int, ...]:
    path = _PATHS.get(rest)
    if path is None:
        if len(_PATHS) >= _PATHS_MAX:
            _PATHS.clear()
        path = _PATHS[rest] = tuple(int(part) if part.isdigit() else part for part in rest.split("."))
    return path


def unflatten(attrs: dict[str, Any], prefix: str) -> Any:
    """Rebuild a list from flattened keys (`prefix.0.message.role` …) in index order.

    Gaps in the indexes (an SDK's attribute limit cut the list) leave the present items in order.
    A level whose keys are not all indexes stays a map (at the top too: the caller decides what it is).
    A key below a plain value (`prefix.0` and `prefix.0.x`) is not read; below a map value, it is put in it.
    """
    root: dict[Any, Any] = {}
    dotted = prefix + "."
    start = len(dotted)
    for key, val in attrs.items():
        if len(key) <= start or not key.startswith(dotted):
            continue
        path = _path(key[start:])
        last = len(path) - 1
        node: Any = root
        i = 0
        while i < last and isinstance(node, dict):
            part = path[i]
            if part in node:
                node = node[part]
            else:
                child: dict[Any, Any] = {}
                node[part] = child
                node = child
            i += 1
        if isinstance(node, dict):
            node[path[last]] = val
    return _as_list(root) if root else []


def _as_list(node: dict[Any, Any]) -> Any:
    """A node of `unflatten`'s tree: integer-keyed levels become lists in index order (leaves are not visited).

    A level is a list only when every key is an index; a level of names, or of names and indexes, stays a map.
    """
    indexes = True
    for key in node:
        if type(key) is not int:
            indexes = False
            break
    if indexes and node:
        return [v if type(v) is not dict else _as_list(v) for v in [node[k] for k in sorted(node)]]
    return {k: v if type(v) is not dict else _as_list(v) for k, v in node.items()}
