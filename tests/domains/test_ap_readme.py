"""The domain README's task table says what the ground truth says (no comment contradicting data)."""

from __future__ import annotations

from pathlib import Path

from domains.accounts_payable import TASKS, expected_outcome

README = Path(__file__).resolve().parents[2] / "domains" / "accounts_payable" / "README.md"


def _describe(task_id: str) -> list[str]:
    o = expected_outcome(task_id)
    if o.action == "pay":
        outcome = f"pay {o.payable_amount:,.2f} {o.currency}, {o.approver_role}"
    elif o.action == "apply_credit":
        outcome = f"apply credit {o.credit_amount:,.2f} {o.currency} to {o.credit_target}"
    else:
        outcome = f"hold {o.primary_reason_code}"
    return [task_id, outcome, ", ".join(o.reason_codes[1:])]


def test_the_readme_task_table_matches_the_derived_outcomes():
    rows = {}
    for line in README.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0].startswith("INV-1"):
            rows[cells[0]] = [cells[0], cells[2], cells[3]]
    assert sorted(rows) == sorted(t.task_id for t in TASKS)
    for t in TASKS:
        assert rows[t.task_id] == _describe(t.task_id)
