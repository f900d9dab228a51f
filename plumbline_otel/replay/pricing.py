"""What a model call cost, from the provider's full usage: input, output, cache reads and writes.

The seed meter priced ``input_tokens`` and ``output_tokens`` only, so Anthropic prompt-cache
tokens (``cache_creation_input_tokens``, ``cache_read_input_tokens``) went unpriced ($1.59 at
list price against a $0.50 cap, ledger $0.048) and streamed calls were not metered at all. Here
one function, ``extract_usage``, reads a ``Usage`` from any of the three APIs the proxy speaks,
whole body or SSE stream, and ``price`` turns it into dollars with a tested table.

The two providers count differently, and ``Usage`` normalises both to disjoint buckets:

- Anthropic's ``input_tokens`` excludes cached tokens; cache reads and writes are separate
  counts (writes split into 5-minute and 1-hour TTLs when ``cache_creation`` says so).
- OpenAI's ``prompt_tokens`` (Chat) / ``input_tokens`` (Responses) *include* the cached tokens
  (``*_tokens_details.cached_tokens``); OpenAI does not charge for cache writes.

So ``Usage.input_tokens`` is always the uncached input, priced at the full input rate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace

from plumbline_otel.replay.jsonvalue import JsonObject


@dataclass(frozen=True)
class ModelPrice:
    """USD per million tokens. ``cache_write`` is Anthropic's 5-minute write; ``cache_write_1h`` its 1-hour one.

    ``long_context_over`` (input tokens, cached included) switches to ``long`` prices, as Anthropic
    charges Sonnet 4 prompts past 200K tokens.
    """

    input: float
    output: float
    cache_read: float
    cache_write: float = 0.0
    cache_write_1h: float = 0.0
    long_context_over: int | None = None
    long: ModelPrice | None = None


def _anthropic(inp: float, out: float) -> ModelPrice:
    """Anthropic's published multipliers: cache read 0.1x input, 5-minute write 1.25x, 1-hour write 2x."""
    return ModelPrice(inp, out, round(inp * 0.1, 6), round(inp * 1.25, 6), round(inp * 2, 6))


def _openai(inp: float, cached: float, out: float) -> ModelPrice:
    return ModelPrice(inp, out, cached)


_SONNET_4 = replace(_anthropic(3.0, 15.0), long_context_over=200_000, long=_anthropic(6.0, 22.5))

# List prices, USD per million tokens. A model id resolves to its longest matching prefix, so a
# dated snapshot ("claude-sonnet-4-5-20250929", "gpt-4o-2024-08-06") finds its family.
PRICE_TABLE: dict[str, ModelPrice] = {
    # Anthropic
    "claude-opus-4-6": _anthropic(5.0, 25.0),
    "claude-opus-4-5": _anthropic(5.0, 25.0),
    "claude-opus-4-1": _anthropic(15.0, 75.0),
    "claude-opus-4": _anthropic(15.0, 75.0),
    "claude-sonnet-4-6": _anthropic(3.0, 15.0),
    "claude-sonnet-4-5": _SONNET_4,
    "claude-sonnet-4": _SONNET_4,
    "claude-3-7-sonnet": _anthropic(3.0, 15.0),
    "claude-3-5-sonnet": _anthropic(3.0, 15.0),
    "claude-haiku-4-5": _anthropic(1.0, 5.0),
    "claude-3-5-haiku": _anthropic(0.8, 4.0),
    "claude-3-haiku": ModelPrice(0.25, 1.25, 0.03, 0.30, 0.50),
    "claude-3-opus": _anthropic(15.0, 75.0),
    # OpenAI (cached input as published; cache writes are free)
    "gpt-5.2": _openai(1.75, 0.175, 14.0),
    "gpt-5.1": _openai(1.25, 0.125, 10.0),
    "gpt-5": _openai(1.25, 0.125, 10.0),
    "gpt-5-mini": _openai(0.25, 0.025, 2.0),
    "gpt-5-nano": _openai(0.05, 0.005, 0.40),
    "gpt-4.1": _openai(2.0, 0.50, 8.0),
    "gpt-4.1-mini": _openai(0.40, 0.10, 1.60),
    "gpt-4.1-nano": _openai(0.10, 0.025, 0.40),
    "gpt-4o": _openai(2.50, 1.25, 10.0),
    "gpt-4o-mini": _openai(0.15, 0.075, 0.60),
    "o4-mini": _openai(1.10, 0.275, 4.40),
    "o3": _openai(2.0, 0.50, 8.0),
    "o3-mini": _openai(1.10, 0.55, 4.40),
    "o1": _openai(15.0, 7.50, 60.0),
    "o1-mini": _openai(1.10, 0.55, 4.40),
    "gpt-4-turbo": _openai(10.0, 10.0, 30.0),
    "gpt-3.5-turbo": _openai(0.50, 0.50, 1.50),
    # the offline simulated models cost nothing
    "simulated-": ModelPrice(0.0, 0.0, 0.0),
}


def model_price(model: str | None, table: Mapping[str, ModelPrice] = PRICE_TABLE) -> ModelPrice | None:
    """The price of ``model`` (longest matching prefix, provider path stripped), or None when unpriced."""
    if not model:
        return None
    name = model.rsplit("/", 1)[-1].lower().removeprefix("anthropic.").removeprefix("openai.")
    matches = [p for p in table if name.startswith(p)]
    return table[max(matches, key=len)] if matches else None


@dataclass(frozen=True)
class Usage:
    """Tokens of one call (or a sum of calls), in disjoint buckets each priced at its own rate."""

    input_tokens: int = 0  # uncached input
    output_tokens: int = 0  # reasoning included, as providers bill it
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0  # Anthropic 5-minute TTL (or TTL unstated)
    cache_write_1h_tokens: int = 0
    reasoning_tokens: int = 0  # informational: already inside output_tokens
    model: str | None = None  # the model that answered, when the response said

    @property
    def prompt_tokens(self) -> int:
        """Every input token, cached or not (the GenAI ``gen_ai.usage.input_tokens``)."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens + self.cache_write_1h_tokens

    def __add__(self, other: Usage) -> Usage:
        counts = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self) if f.name != "model"}
        models = {m for m in (self.model, other.model) if m}
        return Usage(**counts, model=models.pop() if len(models) == 1 else None)  # a sum over several models names none

    def as_dict(self) -> JsonObject:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def price(model: str | None, usage: Usage, table: Mapping[str, ModelPrice] = PRICE_TABLE) -> float | None:
    """USD for ``usage`` on ``model`` (``usage.model`` when ``model`` is None); None if unpriced."""
    rates = model_price(model or usage.model, table)
    if rates is None:
        return None
    if rates.long is not None and rates.long_context_over is not None and usage.prompt_tokens > rates.long_context_over:
        rates = rates.long
    total = (usage.input_tokens * rates.input + usage.output_tokens * rates.output
             + usage.cache_read_tokens * rates.cache_read + usage.cache_write_tokens * rates.cache_write
             + usage.cache_write_1h_tokens * (rates.cache_write_1h or rates.cache_write))
    return total / 1_000_000


# --- extraction ------------------------------------------------------------------------------


def _int(value: object) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _anthropic_usage(usage: Mapping[str, object], model: str | None) -> Usage:
    split = usage.get("cache_creation")
    write_5m, write_1h = _int(usage.get("cache_creation_input_tokens")), 0
    if isinstance(split, Mapping) and ("ephemeral_1h_input_tokens" in split or "ephemeral_5m_input_tokens" in split):
        write_5m, write_1h = _int(split.get("ephemeral_5m_input_tokens")), _int(split.get("ephemeral_1h_input_tokens"))
    return Usage(input_tokens=_int(usage.get("input_tokens")), output_tokens=_int(usage.get("output_tokens")),
                 cache_read_tokens=_int(usage.get("cache_read_input_tokens")), cache_write_tokens=write_5m,
                 cache_write_1h_tokens=write_1h, model=model)


def _openai_usage(usage: Mapping[str, object], model: str | None) -> Usage:
    """Chat (``prompt_tokens``) or Responses (``input_tokens``); the cached part is carved out of the input."""
    chat = "prompt_tokens" in usage
    total_in = _int(usage.get("prompt_tokens" if chat else "input_tokens"))
    details = usage.get("prompt_tokens_details" if chat else "input_tokens_details")
    out_details = usage.get("completion_tokens_details" if chat else "output_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
    reasoning = _int(out_details.get("reasoning_tokens")) if isinstance(out_details, Mapping) else 0
    return Usage(input_tokens=max(0, total_in - cached), output_tokens=_int(usage.get("completion_tokens" if chat else "output_tokens")),
                 cache_read_tokens=cached, reasoning_tokens=reasoning, model=model)


def _is_anthropic(usage: Mapping[str, object]) -> bool:
    return any(k in usage for k in ("cache_read_input_tokens", "cache_creation_input_tokens", "cache_creation")) or (
        "input_tokens" in usage and "input_tokens_details" not in usage and "total_tokens" not in usage)


def usage_from_body(body: Mapping[str, object]) -> Usage | None:
    """The usage of a whole (non-streamed) response of any of the three APIs, None if it has none."""
    usage = body.get("usage")
    if not isinstance(usage, Mapping):
        return None
    model = name if isinstance(name := body.get("model"), str) else None
    if body.get("type") == "message" or _is_anthropic(usage):
        return _anthropic_usage(usage, model)
    return _openai_usage(usage, model)


class UsageAccumulator:
    """Reads usage from SSE events one by one, as a stream passes through a meter.

    Anthropic: ``message_start`` carries input and cache counts, ``message_delta`` the cumulative
    output (and, on newer API versions, cumulative input counts too, which then win). OpenAI Chat:
    the final chunk's ``usage`` (sent when ``stream_options.include_usage`` is set). Responses:
    ``response.completed`` (or ``.incomplete`` / ``.failed``) carries the whole response.
    """

    def __init__(self) -> None:
        self.usage: Usage | None = None
        self._anthropic: dict[str, object] = {}
        self._model: str | None = None

    def feed(self, event: Mapping[str, object]) -> None:
        kind = event.get("type")
        if kind == "message_start" and isinstance(message := event.get("message"), Mapping):
            self._model = message.get("model") if isinstance(message.get("model"), str) else self._model
            self._merge_anthropic(message.get("usage"))
        elif kind == "message_delta":
            self._merge_anthropic(event.get("usage"))
        elif isinstance(kind, str) and kind in ("response.completed", "response.incomplete", "response.failed"):
            response = event.get("response")
            if isinstance(response, Mapping):
                self.usage = usage_from_body(response) or self.usage
        elif isinstance(usage := event.get("usage"), Mapping):  # the Chat stream's usage chunk
            model = name if isinstance(name := event.get("model"), str) else None
            self.usage = _openai_usage(usage, model)

    def _merge_anthropic(self, usage: object) -> None:
        if isinstance(usage, Mapping):
            self._anthropic.update({k: v for k, v in usage.items() if v is not None})
            self.usage = _anthropic_usage(self._anthropic, self._model)


def extract_usage(source: Mapping[str, object] | Iterable[Mapping[str, object]]) -> Usage | None:
    """Usage from a response body (a mapping) or from a stream's parsed SSE events (an iterable of them)."""
    if isinstance(source, Mapping):
        return usage_from_body(source)
    meter = UsageAccumulator()
    for event in source:
        if isinstance(event, Mapping):
            meter.feed(event)
    return meter.usage


def parse_sse(raw: bytes) -> list[JsonObject]:
    """The JSON ``data:`` payloads of an SSE body, in order (``[DONE]`` and non-JSON data skipped)."""
    import orjson

    out: list[JsonObject] = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = b"\n".join(line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:"))
        if not data or data == b"[DONE]":
            continue
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out
