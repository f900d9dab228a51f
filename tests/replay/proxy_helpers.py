"""Shared pieces of the model-proxy tests: trials, the real SDK clients pointed at a route, a tool list."""

from __future__ import annotations

from typing import Any

import anthropic
import openai

from plumbline_otel.replay.adapters import Trial
from plumbline_otel.replay.identity import TrialIdentity
from plumbline_otel.replay.proxy import ProxyRoute
from plumbline_otel.replay.tasks import ReplayTask

TASK = ReplayTask("INV-1029", "Please pay INV-1029.", "src-1", tools=("lookup_invoice", "pay_invoice"))
OPENAI_MODEL = "gpt-4o-mini"
ANTHROPIC_MODEL = "claude-haiku-4-5"

LOOKUP = {"name": "lookup_invoice", "description": "Look up an invoice by id.",
          "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}
PAY = {"name": "pay_invoice", "description": "Pay an invoice by id.",
       "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}


def trial(k: int = 0, perturbation: str = "baseline", attempt: int = 1, **metadata: Any) -> Trial:
    identity = TrialIdentity(f"s/INV-1029/{perturbation}/0-abc/k{k}", perturbation, "0-abc", "s", k, "INV-1029", attempt=attempt)
    return Trial(identity, TASK, TASK.input, dict(metadata))


def openai_client(route: ProxyRoute, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=route.openai_base_url, api_key="agent-key", max_retries=kwargs.pop("max_retries", 0), **kwargs)


def anthropic_client(route: ProxyRoute, **kwargs: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=route.anthropic_base_url, api_key="agent-key", max_retries=kwargs.pop("max_retries", 0), **kwargs)


def chat_tools(*specs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": s["name"], "description": s["description"], "parameters": s["input_schema"]}}
            for s in specs]


def responses_tools(*specs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "name": s["name"], "description": s["description"], "parameters": s["input_schema"], "strict": False}
            for s in specs]
