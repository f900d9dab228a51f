"""The accounts_payable reference domain: a procure-to-pay system of record with sixteen tools.

    open_system_of_record()      a fresh, private copy of the system of record for one trial
    TOOLS, call_tool, tool_specs the tools an agent sees, and the one way to call them
    DomainError, TransientToolError
    TASKS                        the invoice tasks (tasks.py)
    expected_outcome, context_for, grade   ground truth derived by the same tools (ground_truth.py)
    REASON_PRIORITY              the order that picks one primary reason code per held invoice

The policy the agents follow is `policy.md`; the invariants are
`configs/accounts_payable.invariants.yaml`.
"""

from __future__ import annotations

from pathlib import Path

from domains.accounts_payable.errors import DomainError, TransientToolError
from domains.accounts_payable.ground_truth import GradeResult, Outcome, context_for, expected_outcome, grade
from domains.accounts_payable.reason_codes import REASON_CODES, REASON_PRIORITY, primary_reason
from domains.accounts_payable.system_of_record import SystemOfRecord, open_system_of_record
from domains.accounts_payable.tasks import TASKS, Task
from domains.accounts_payable.tools import TOOLS, Tool, call_tool, tool_specs

POLICY_PATH = Path(__file__).resolve().parent / "policy.md"

__all__ = [
    "POLICY_PATH",
    "REASON_CODES",
    "REASON_PRIORITY",
    "TASKS",
    "TOOLS",
    "DomainError",
    "GradeResult",
    "Outcome",
    "SystemOfRecord",
    "Task",
    "Tool",
    "TransientToolError",
    "call_tool",
    "context_for",
    "expected_outcome",
    "grade",
    "open_system_of_record",
    "primary_reason",
    "tool_specs",
]
