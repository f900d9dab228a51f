"""Record mode: an untraced agent's model and MCP calls become traffic plumbline can take tasks from.

An agent with no instrumentation exports nothing, so there is no run to replay. Behind
``plumbline proxy --otlp-file F`` (or ``--endpoint``) its calls are written as GenAI spans, one
trace per *conversation*: calls whose request starts with the same system prompt and first user
message, each carrying at least as many messages as the last, are one conversation (one run);
a call that starts over (a new first request, or fewer messages) begins the next. Ingested, each
run's input is its first user request, so ``plumbline replay`` takes it as a task. A tool call
through the MCP proxy joins the conversation whose model last proposed that tool (else the latest).

The spans carry no trial identity (no ``plumbline.study``): this is ordinary traffic, not a study.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import SpanContext, TraceFlags

from plumbline_otel.replay.proxy.wire import Api, input_messages


@dataclass
class _Conversation:
    context: SpanContext
    messages: int
    tools: set[str] = field(default_factory=set)


class ConversationRecorder:
    """Which conversation (trace) each call belongs to; thread-safe (the proxy serves calls on many threads)."""

    def __init__(self) -> None:
        self._by_key: dict[str, _Conversation] = {}
        self._latest: _Conversation | None = None
        self._lock = threading.Lock()
        self.conversations = 0

    @staticmethod
    def _key(messages: list[dict[str, Any]]) -> str:
        """The conversation's identity: its system prompt and first user message."""
        head = [m for m in messages if m.get("role") == "system"][:1]
        head += [m for m in messages if m.get("role") == "user"][:1]
        return hashlib.sha256(repr([(m.get("role"), m.get("parts")) for m in head]).encode()).hexdigest()

    def model_call(self, api: Api, body: Mapping[str, object]) -> SpanContext:
        """The parent context of a model call's span: its conversation's (a new one when the call starts over)."""
        messages = input_messages(api, body)
        key = self._key(messages)
        with self._lock:
            conversation = self._by_key.get(key)
            if conversation is None or len(messages) < conversation.messages:
                conversation = _Conversation(SpanContext(secrets.randbits(128), secrets.randbits(64), is_remote=True,
                                                         trace_flags=TraceFlags(TraceFlags.SAMPLED)), len(messages))
                self._by_key[key] = conversation
                self.conversations += 1
            conversation.messages = len(messages)
            self._latest = conversation
            return conversation.context

    def proposed(self, context: SpanContext, tools: list[str]) -> None:
        """The model of this conversation proposed these tools: their calls through the MCP proxy join it."""
        with self._lock:
            for conversation in self._by_key.values():
                if conversation.context == context:
                    conversation.tools.update(tools)

    def tool_call(self, tool: str) -> SpanContext | None:
        """The parent context of a tool call's span: the latest conversation that proposed ``tool``, else the latest one."""
        with self._lock:
            if self._latest is not None and tool in self._latest.tools:
                return self._latest.context
            for conversation in reversed(list(self._by_key.values())):
                if tool in conversation.tools:
                    return conversation.context
            return self._latest.context if self._latest is not None else None
