"""``react``: a free-form tool-using loop in which the model chooses every call.

The model gets the policy as its system prompt and every domain tool as an Anthropic tool spec.
Each turn, every ``tool_use`` block is executed (in order) and answered with a ``tool_result``
(``is_error`` on failure, the error text as content). The loop ends when the model answers
without a tool call, or at the turn limit, which is recorded as the agent's failure to finish.
Nothing here retries: whether a transient error is retried is the model's decision.
"""

from __future__ import annotations

from typing import Any

from domains.accounts_payable.arms.context import ArmContext, policy_text
from domains.accounts_payable.arms.runtime import ArmOutcome, error_type_of

MAX_TURNS = 20

SYSTEM_PROMPT = """You are the accounts-payable agent for the finance operations team.
You process supplier invoices strictly according to the policy below, working only through the
tools you are given: look facts up with tools rather than assuming them, and record every
decision (payment, approval, exception, audit entry) with the matching tool.
When you have finished, reply with a short plain-text summary of what you did and why.

<policy>
{policy}
</policy>"""


def system_prompt() -> str:
    return SYSTEM_PROMPT.format(policy=policy_text())


def _block_dict(block: Any) -> dict[str, Any]:
    if block.type == "text":
        return {"type": "text", "text": block.text}
    if block.type == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    return block.model_dump(exclude_none=True)


def _text_of(content: list[Any]) -> str:
    return "\n".join(b.text for b in content if b.type == "text").strip()


def _execute(ctx: ArmContext, block: Any) -> dict[str, Any]:
    from domains.accounts_payable.tools import DomainError

    try:
        result = ctx.runner.call(block.name, block.input or {}, call_id=block.id)
    except DomainError as exc:
        return {
            "type": "tool_result",
            "tool_use_id": block.id,
            "content": f"ERROR ({error_type_of(exc)}): {exc}",
            "is_error": True,
        }
    return {"type": "tool_result", "tool_use_id": block.id, "content": ctx.dumps_result(result)}


def run(ctx: ArmContext) -> ArmOutcome:
    """Run the loop for one task; see the module docstring."""
    from domains.accounts_payable.tools import tool_specs

    system = system_prompt()
    tools = tool_specs()
    messages: list[dict[str, Any]] = [{"role": "user", "content": ctx.request_text}]
    last_text = ""
    for _turn in range(ctx.max_turns or MAX_TURNS):
        response = ctx.model.create(system=system, messages=messages, tools=tools)
        messages.append({"role": "assistant", "content": [_block_dict(b) for b in response.content]})
        last_text = _text_of(response.content) or last_text
        calls = [b for b in response.content if b.type == "tool_use"]
        if not calls:
            return ArmOutcome(last_text)
        messages.append({"role": "user", "content": [_execute(ctx, b) for b in calls]})
    return ArmOutcome(last_text or "stopped at the turn limit", agent_error="turn limit")
