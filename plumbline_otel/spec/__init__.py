"""Invariant specs: what a run must obey, declared in YAML or Python.

    spec = load_spec("configs/accounts_payable.invariants.yaml")
    for inv, verdict in spec.evaluate(trajectory):
        ...

Python form::

    spec = Spec.of("ap", [
        invariant("AP-AUDIT", MustCall("post_audit_log"), severity="minor"),
        invariant("AP-PAY-AMOUNT", ArgEquals("schedule_payment", "amount", from_context="payable_amount",
                                             rule=Rule("number", tolerance=0.005)),
                  when={"expected_action": "pay"}),
    ])

An invariant is any callable ``(trajectory, context) -> Verdict`` (`Invariant`); the built-in
kinds are registered under their YAML keys and `register_kind` adds more. Semantics of the kinds
(failed calls, applicability) are documented in `plumbline_otel.spec._kinds`.
"""

from plumbline_otel.compare_values import Rule
from plumbline_otel.spec._context import Condition, load_provider
from plumbline_otel.spec._kinds import (
    KINDS,
    ArgEquals,
    ArgMatchesResult,
    ArgSatisfies,
    CallAtLeast,
    CallAtMost,
    MustCall,
    MustNotCall,
    Ordering,
    Predicate,
    kind,
    register_kind,
)
from plumbline_otel.spec._loader import load_spec, parse_spec
from plumbline_otel.spec._spec import SPEC_VERSION, DeclaredInvariant, Spec, invariant
from plumbline_otel.spec._verdict import SEVERITIES, Invariant, Severity, Status, Verdict

__all__ = [
    "KINDS",
    "SEVERITIES",
    "SPEC_VERSION",
    "ArgEquals",
    "ArgMatchesResult",
    "ArgSatisfies",
    "CallAtLeast",
    "CallAtMost",
    "Condition",
    "DeclaredInvariant",
    "Invariant",
    "MustCall",
    "MustNotCall",
    "Ordering",
    "Predicate",
    "Rule",
    "Severity",
    "Spec",
    "Status",
    "Verdict",
    "invariant",
    "kind",
    "load_provider",
    "load_spec",
    "parse_spec",
    "register_kind",
]
