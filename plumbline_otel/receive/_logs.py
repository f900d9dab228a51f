"""OTLP logs over the receiver: GenAI events kept in the store's `logs` table, folded into their spans.

Decoding and the row shape live in `decode/_logs.py` (files carry logs too); the table is part of
the store's schema (version 4); this module is the receiver's entry to both.
"""

from __future__ import annotations

from plumbline_otel.decode._logs import LogRows, decode_logs, log_rows
from plumbline_otel.store import Store


def write_logs(store: Store, rows: LogRows) -> int:
    """Commit the rows in one transaction and mark their traces for re-assembly; return how many were new."""
    return store.write_logs(rows)


__all__ = ["LogRows", "decode_logs", "log_rows", "write_logs"]
