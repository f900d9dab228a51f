"""JSON as the replay wing carries it (cassette entries, provider wire bodies, evidence, ledger rows), typed once.

    JsonValue   any value JSON can hold
    JsonObject  a JSON object, as a module builds or owns one (``dict[str, JsonValue]``)

A function that only reads an object takes ``Mapping[str, object]`` (any dict passes); one that builds or returns one
says ``JsonObject``. This module imports nothing, so every module of the wing (the ledger and the cache included) can
name the type without an import cycle; ``contracts`` re-exports it.
"""

from __future__ import annotations

from typing import TypeAlias

JsonValue: TypeAlias = "None | bool | int | float | str | list[JsonValue] | dict[str, JsonValue]"
JsonObject: TypeAlias = "dict[str, JsonValue]"


def to_int(value: object) -> int:
    """``int(value)`` for a JSON value (a number, or a number's text); TypeError for anything else, as ``int`` gives."""
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"int() argument must be a string or a number, not '{type(value).__name__}'")


def to_float(value: object) -> float:
    """``float(value)`` for a JSON value (a number, or a number's text); TypeError for anything else, as ``float`` gives."""
    if isinstance(value, int | float | str):
        return float(value)
    raise TypeError(f"float() argument must be a string or a real number, not '{type(value).__name__}'")
