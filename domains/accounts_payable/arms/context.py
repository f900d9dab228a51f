"""The per-trial context handed to an arm, and the policy text the model-facing arms quote."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from domains.accounts_payable.arms.runtime import ModelCaller, RetryPolicy, ToolRunner

POLICY_PATH = Path(__file__).resolve().parent.parent / "policy.md"
MAX_RESULT_CHARS = 6000


@lru_cache(maxsize=1)
def policy_text() -> str:
    """The domain policy (``domains/accounts_payable/policy.md``), read once per process."""
    return POLICY_PATH.read_text(encoding="utf-8").strip()


@dataclass
class ArmContext:
    """Everything one arm needs for one trial. Built by ``run_trial``; owned by that trial."""

    task_id: str
    request_text: str
    runner: ToolRunner
    model: ModelCaller
    retry: RetryPolicy
    max_turns: int | None = None

    @staticmethod
    def dumps_result(result: Any) -> str:
        """A tool result as the model sees it: compact JSON, truncated when huge."""
        text = json.dumps(result, separators=(",", ":"), default=str)
        if len(text) > MAX_RESULT_CHARS:
            text = text[:MAX_RESULT_CHARS] + "…(truncated)"
        return text
