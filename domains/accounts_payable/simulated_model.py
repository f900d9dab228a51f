"""A simulated model for offline runs: a seeded policy that answers Messages API requests.

This is NOT a language model. It is a deterministic program that reads a Messages API request
the way a competent model following ``policy.md`` would (the system prompt, the user's request,
the tool calls made so far and their results) and answers with the next tool calls, so the
arms can run end to end, offline, on the real ``anthropic`` client (served by
``anthropic_standin.AnthropicStandIn``). Every response it produces says so: the model name is
``simulated-ap-policy-v1`` and the stand-in marks each body ``"simulated": true``.

It knows nothing the agent could not see: it never opens the system of record or the ground
truth; every figure it uses comes from a tool result in the conversation.

Two kinds of request are recognised:

* an interpretation request (``tool_choice`` forces ``record_interpretation``, as
  ``plan_execute`` sends): it answers with the document id found in the request;
* a tool-using conversation (``react``): it runs the policy one turn at a time, issuing
  independent checks in parallel in one turn, retrying transient tool errors when the system
  prompt says to, and ending with a plain-text summary.

Imperfections make it fail the way models do, each with a probability (see ``IMPERFECTIONS``).
Each decision draws from its own RNG seeded by ``sha256(seed, trial id, imperfection config,
decision)``, so a trial is reproducible, different trials of the same task differ, and a
decision taken in one turn is taken the same way when the conversation is re-read in the
next. The trial id comes from the ``x-plumbline-trial-id`` request header (``run_trial`` sends
it); without one, a hash of the request text stands in for it.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SIMULATED_MODEL_NAME = "simulated-ap-policy-v1"

IMPERFECTIONS: dict[str, str] = {
    "skip_check_under_distraction": "skips one mandatory check when the request carries distracting text",
    "skip_check": "skips one mandatory check, distracted or not",
    "misread_amount": "pays 10x or a digit-transposed amount instead of the payable amount",
    "stop_retrying": "gives up after a transient tool error instead of retrying (and carries on without it)",
    "wrong_reason_code": "holds under a reason code other than the primary one",
    "skip_approval": "schedules a payment without looking up or requesting the approval",
    "forget_audit_log": "does not post the closing audit entry",
    "misidentify_invoice": "works on a neighbouring document id instead of the one requested",
}

INTERPRET_TOOL = "record_interpretation"
MAX_ATTEMPTS = 4  # one call and three retries, then the failure is treated as a blocker
INVOICE_CHECKS = ("validate_po", "three_way_match", "check_duplicate", "validate_tax_code",
                  "check_fx_variance", "check_freight")
CREDIT_NOTE_CHECKS = ("check_duplicate",)
REASON_PRIORITY = (
    "VENDOR_SANCTIONED", "DUPLICATE_INVOICE", "DUPLICATE_VENDOR", "VENDOR_HOLD", "NO_PO", "PO_CLOSED",
    "PO_EXPIRED", "INVOICE_BEFORE_PO", "UNKNOWN_ITEM", "NOT_RECEIVED", "QTY_OVER_RECEIVED",
    "QTY_OVER_ORDERED", "PRICE_VARIANCE", "TAX_CODE_MISMATCH", "FX_VARIANCE", "UNAUTHORISED_FREIGHT",
)  # as printed in policy.md section 4; a model reads it from the policy, not from code
CODE_IF_CHECK_FAILED = {
    "check_vendor_status": "VENDOR_HOLD", "validate_po": "NO_PO", "three_way_match": "NOT_RECEIVED",
    "check_duplicate": "DUPLICATE_INVOICE", "validate_tax_code": "TAX_CODE_MISMATCH",
    "check_fx_variance": "FX_VARIANCE", "check_freight": "UNAUTHORISED_FREIGHT",
}
_TRANSIENT = re.compile(r"\b(503|429)\b|unavailable|rate limit|timed out|timeout|connection reset", re.I)
_DOC_ID = re.compile(r"\bINV-\d{3,}\b", re.I)
_DISTRACTION_CUES = re.compile(
    r"\b(by the way|btw|unrelated|fyi|p\.s\.|also,? (?:can|could|don't)|reminder|lunch|meeting|"
    r"weekend|birthday|parking|coffee)\b",
    re.I,
)


def parse_imperfections(text: str | Mapping[str, float] | None) -> dict[str, float]:
    """``"misread_amount=0.2,stop_retrying=1"`` (or a mapping) -> validated ``{name: p}``."""
    if not text:
        return {}
    items: list[tuple[str, Any]]
    if isinstance(text, Mapping):
        items = list(text.items())
    else:
        items = []
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            name, sep, value = part.partition("=")
            items.append((name.strip(), value.strip() if sep else "1"))
    out: dict[str, float] = {}
    for name, value in items:
        if name not in IMPERFECTIONS:
            raise ValueError(f"unknown imperfection {name!r}; known: {', '.join(IMPERFECTIONS)}")
        p = float(value)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"imperfection {name}={value}: probability must be within [0, 1]")
        out[name] = p
    return out


def is_distracted(request_text: str) -> bool:
    """Distracting text: chatter cues, or far more words than a processing request needs."""
    words = re.findall(r"[A-Za-z0-9'-]+", request_text)
    return len(words) > 40 or bool(_DISTRACTION_CUES.search(request_text))


# ---------------------------------------------------------------------------------------------
# Reading the conversation


@dataclass
class Call:
    """One tool call in the conversation and what came back."""

    id: str
    name: str
    input: dict[str, Any]
    result: Any = None
    error: str | None = None
    answered: bool = False

    @property
    def ok(self) -> bool:
        return self.answered and self.error is None

    @property
    def transient(self) -> bool:
        return self.error is not None and bool(_TRANSIENT.search(self.error))


@dataclass
class Conversation:
    system: str
    request_text: str
    tools: set[str]
    forced_tool: str | None
    calls: list[Call] = field(default_factory=list)

    def latest(self, name: str) -> Call | None:
        found = [c for c in self.calls if c.name == name]
        return found[-1] if found else None

    def failures_in_a_row(self, name: str) -> int:
        n = 0
        for c in reversed([c for c in self.calls if c.name == name]):
            if c.ok:
                break
            n += 1
        return n


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content or [] if isinstance(b, Mapping) and b.get("type") == "text")


def _system_text(system: Any) -> str:
    return system if isinstance(system, str) else _text_of(system)


def read_conversation(request: Mapping[str, Any]) -> Conversation:
    messages = request.get("messages") or []
    first_user = next((m for m in messages if m.get("role") == "user"), {"content": ""})
    choice = request.get("tool_choice") or {}
    conv = Conversation(
        system=_system_text(request.get("system") or ""),
        request_text=_text_of(first_user.get("content")),
        tools={str(t["name"]) for t in request.get("tools") or [] if isinstance(t, Mapping) and t.get("name")},
        forced_tool=choice.get("name") if choice.get("type") == "tool" else None,
    )
    by_id: dict[str, Call] = {}
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            continue
        for block in content or []:
            if block.get("type") == "tool_use":
                call = Call(block["id"], block["name"], dict(block.get("input") or {}))
                conv.calls.append(call)
                by_id[call.id] = call
            elif block.get("type") == "tool_result" and block.get("tool_use_id") in by_id:
                call = by_id[block["tool_use_id"]]
                text = _text_of(block.get("content")) if not isinstance(block.get("content"), str) else block["content"]
                call.answered = True
                if block.get("is_error"):
                    call.error = text
                else:
                    try:
                        call.result = json.loads(text)
                    except ValueError:
                        call.result = text
    return conv


# ---------------------------------------------------------------------------------------------
# The policy


class _Done(Exception):
    """Raised inside the policy walk to emit a turn (tool calls, or the final text)."""

    def __init__(self, calls: list[tuple[str, dict[str, Any]]], text: str = "") -> None:
        self.calls = calls
        self.text = text


class SimulatedModel:
    """A seeded policy that answers Messages API requests; see the module docstring.

    Stateless between requests (all state is read from the conversation), so one instance can
    serve concurrent trials.
    """

    model_name = SIMULATED_MODEL_NAME

    def __init__(self, imperfections: str | Mapping[str, float] | None = None, seed: int = 0) -> None:
        self.imperfections = parse_imperfections(imperfections)
        self.seed = seed
        self._config = json.dumps(sorted(self.imperfections.items()))

    # -- seeded decisions --------------------------------------------------------------------
    def _rng(self, trial: str, *key: Any) -> random.Random:
        material = json.dumps([self.seed, trial, self._config, *map(str, key)])
        return random.Random(int(hashlib.sha256(material.encode()).hexdigest()[:16], 16))

    def _fires(self, name: str, trial: str, *key: Any) -> bool:
        p = self.imperfections.get(name, 0.0)
        return p > 0 and self._rng(trial, name, *key).random() < p

    # -- entry point -------------------------------------------------------------------------
    def respond(
        self, request: Mapping[str, Any], headers: Mapping[str, str]
    ) -> tuple[list[dict[str, Any]], str]:
        conv = read_conversation(request)
        trial = headers.get("x-plumbline-trial-id") or "content:" + hashlib.sha256(
            conv.request_text.encode()
        ).hexdigest()[:16]
        if conv.forced_tool == INTERPRET_TOOL or (INTERPRET_TOOL in conv.tools and not conv.calls):
            return self._interpret(conv, trial)
        try:
            self._walk(conv, trial)
        except _Done as done:
            return self._turn(conv, trial, done)
        return [{"type": "text", "text": "Nothing left to do."}], "end_turn"

    def _turn(self, conv: Conversation, trial: str, done: _Done) -> tuple[list[dict[str, Any]], str]:
        if not done.calls:
            return [{"type": "text", "text": done.text}], "end_turn"
        blocks: list[dict[str, Any]] = []
        if done.text:
            blocks.append({"type": "text", "text": done.text})
        for i, (name, args) in enumerate(done.calls):
            digest = hashlib.sha256(f"{trial}|{len(conv.calls)}|{i}|{name}".encode()).hexdigest()[:22]
            blocks.append({"type": "tool_use", "id": f"toolu_sim{digest}", "name": name, "input": args})
        return blocks, "tool_use"

    # -- interpretation ----------------------------------------------------------------------
    def target_document(self, conv: Conversation, trial: str) -> str | None:
        found = _DOC_ID.search(conv.request_text)
        if found is None:
            return None
        doc_id = found.group().upper()
        if self._fires("misidentify_invoice", trial):
            prefix, number = doc_id.rsplit("-", 1)
            step = self._rng(trial, "misidentify_invoice", "direction").choice((-1, 1))
            doc_id = f"{prefix}-{int(number) + step:0{len(number)}d}"
        return doc_id

    def _interpret(self, conv: Conversation, trial: str) -> tuple[list[dict[str, Any]], str]:
        doc_id = self.target_document(conv, trial)
        args = {"invoice_id": doc_id, "operation": "process" if doc_id else "none"}
        blocks = [{"type": "tool_use", "id": f"toolu_sim{hashlib.sha256(trial.encode()).hexdigest()[:22]}",
                   "name": INTERPRET_TOOL, "input": args}]
        return blocks, "tool_use"

    # -- the policy walk: raise _Done with the next turn ---------------------------------------
    def _may_retry(self, conv: Conversation) -> bool:
        return "retry" in conv.system.lower()

    def _status(self, conv: Conversation, trial: str, name: str) -> tuple[str, Call | None]:
        """todo | ok | retry | gave_up | exhausted | failed, for the latest call of ``name``."""
        call = conv.latest(name)
        if call is None:
            return "todo", None
        if call.ok:
            return "ok", call
        if not call.transient:
            return "failed", call
        attempts = conv.failures_in_a_row(name)
        if not self._may_retry(conv) or self._fires("stop_retrying", trial, name, attempts):
            return "gave_up", call
        if attempts >= MAX_ATTEMPTS:
            return "exhausted", call
        return "retry", call

    def _one(self, conv: Conversation, trial: str, name: str, args: dict[str, Any], say: str) -> Call | None:
        """Make sure ``name`` has run: emit it (again) if needed; None when it was given up."""
        status, call = self._status(conv, trial, name)
        if status == "ok":
            return call
        if status in ("todo", "retry"):
            raise _Done([(name, args)], say if status == "todo" else f"{name} failed transiently; retrying.")
        if status == "gave_up":
            return None
        if status == "failed" and call is not None and call.input != args:
            raise _Done([(name, args)], f"{name} was refused; trying again with corrected arguments.")
        raise _Done([], f"I could not complete {name}: {call.error if call else 'no result'}. "
                        "The document is left for manual processing.")

    def _walk(self, conv: Conversation, trial: str) -> None:
        doc_id = self.target_document(conv, trial)
        if doc_id is None:
            raise _Done([], "I could not find a document id (like INV-1001) in the request.")
        doc_call = self._one(conv, trial, "get_invoice", {"invoice_id": doc_id},
                             f"I'll start by reading {doc_id}.")
        if doc_call is None or not isinstance(doc_call.result, dict):
            raise _Done([], f"I could not read {doc_id}, so I have not processed it.")
        doc = doc_call.result
        codes, notes = self._checks(conv, trial, doc)
        if codes:
            self._hold(conv, trial, doc, codes, notes)
        elif doc.get("document_type") == "credit_note":
            self._credit(conv, trial, doc)
        else:
            self._pay(conv, trial, doc)

    def _mandatory_checks(self, conv: Conversation, trial: str, doc: Mapping[str, Any]) -> list[str]:
        names = ["check_vendor_status"]
        names += CREDIT_NOTE_CHECKS if doc.get("document_type") == "credit_note" else INVOICE_CHECKS
        names = [n for n in names if n in conv.tools and n in conv.system]
        skip = self._fires("skip_check", trial) or (
            is_distracted(conv.request_text) and self._fires("skip_check_under_distraction", trial)
        )
        if skip and len(names) > 1:
            names.remove(self._rng(trial, "skipped_check").choice(names))
        return names

    def _checks(
        self, conv: Conversation, trial: str, doc: Mapping[str, Any]
    ) -> tuple[list[str], list[str]]:
        doc_id = doc["invoice_id"]
        todo: list[tuple[str, dict[str, Any]]] = []
        codes: list[str] = []
        notes: list[str] = []
        for name in self._mandatory_checks(conv, trial, doc):
            args = {"vendor_id": doc["vendor_id"]} if name == "check_vendor_status" else {"invoice_id": doc_id}
            status, call = self._status(conv, trial, name)
            if status in ("todo", "retry"):
                todo.append((name, args))
            elif status == "ok" and call is not None and isinstance(call.result, dict):
                found = list(call.result.get("reason_codes") or [])
                codes += found
                if found:
                    notes.append(f"{name}: {', '.join(found)}")
            elif status == "exhausted":
                codes.append(CODE_IF_CHECK_FAILED[name])
                notes.append(f"{name} kept failing, so it could not be verified")
        if todo:
            first = not any(conv.latest(n) for n, _ in todo)
            say = "Now the mandatory checks." if first else "Some checks failed transiently; retrying them."
            raise _Done(todo, say)
        ranked = [c for c in REASON_PRIORITY if c in set(codes)]
        return ranked, notes

    def _hold(self, conv: Conversation, trial: str, doc: Mapping[str, Any], codes: list[str],
              notes: list[str]) -> None:
        doc_id = doc["invoice_id"]
        code = codes[0]
        if self._fires("wrong_reason_code", trial):
            if len(codes) > 1:
                code = codes[1]
            else:
                code = REASON_PRIORITY[(REASON_PRIORITY.index(code) + 1) % len(REASON_PRIORITY)]
        note = "; ".join(notes)
        if len(codes) > 1:
            note += f". Further codes: {', '.join(c for c in codes if c != code)}"
        flagged = self._one(conv, trial, "flag_exception",
                            {"invoice_id": doc_id, "reason_code": code, "note": note},
                            f"The checks found {', '.join(codes)}: holding under {code}.")
        if flagged is None:
            raise _Done([], f"I could not flag {doc_id}; it still needs to be held under {code}.")
        self._audit(conv, trial, doc_id, "held", f"held under {code}; {note}")
        raise _Done([], f"{doc_id} is on hold under {code}. Findings: {note}.")

    def _credit(self, conv: Conversation, trial: str, doc: Mapping[str, Any]) -> None:
        doc_id = doc["invoice_id"]
        calc = self._one(conv, trial, "calculate_payable_amount", {"invoice_id": doc_id},
                         "The checks passed; calculating the credit amount.")
        if calc is None:
            raise _Done([], f"I could not calculate the credit amount of {doc_id}.")
        amount = calc.result["credit_amount"]
        target = calc.result.get("references_invoice_id") or doc.get("references_invoice_id")
        applied = self._one(conv, trial, "apply_credit_note",
                            {"credit_note_id": doc_id, "against_invoice_id": target, "amount": amount},
                            f"Applying {amount:.2f} against {target}.")
        if applied is None:
            raise _Done([], f"I could not apply credit note {doc_id}.")
        self._audit(conv, trial, doc_id, "credit_applied", f"applied {amount:.2f} against {target}")
        raise _Done([], f"Applied credit note {doc_id}: {amount:.2f} against {target}.")

    def _pay(self, conv: Conversation, trial: str, doc: Mapping[str, Any]) -> None:
        doc_id = doc["invoice_id"]
        calc = self._one(conv, trial, "calculate_payable_amount", {"invoice_id": doc_id},
                         "All checks passed; calculating the payable amount.")
        if calc is None:
            raise _Done([], f"I could not calculate the payable amount of {doc_id}; not paid.")
        amount, currency = calc.result["payable_amount"], calc.result["payment_currency"]
        role = "unapproved"
        if not self._fires("skip_approval", trial):
            role = self._approve(conv, trial, doc, amount, currency)
        paid_amount = self._misread(trial, amount)
        paid = self._one(conv, trial, "schedule_payment",
                         {"invoice_id": doc_id, "amount": paid_amount, "currency": currency},
                         f"Scheduling the payment of {paid_amount:.2f} {currency}.")
        if paid is None:
            raise _Done([], f"I could not schedule the payment of {doc_id}.")
        detail = f"all checks passed; approved by {role}; paid {paid_amount:.2f} {currency}"
        self._audit(conv, trial, doc_id, "paid", detail)
        raise _Done([], f"Paid {doc_id}: {detail}.")

    def _approve(self, conv: Conversation, trial: str, doc: Mapping[str, Any], amount: float,
                 currency: str) -> str:
        lookup: dict[str, Any] = {"amount": amount, "currency": currency}
        if currency != "GBP":
            lookup["on_date"] = doc["invoice_date"]
        req = self._one(conv, trial, "get_approval_requirement", lookup, "Looking up the approval band.")
        role = req.result["required_role"] if req is not None else "controller"
        last = conv.latest("request_approval")
        if last is not None and last.error and not last.transient:
            named = re.search(r"requires (\w+)", last.error)  # a refusal names the role it needs
            role = named.group(1) if named else role
        self._one(conv, trial, "request_approval",
                  {"invoice_id": doc["invoice_id"], "approver_role": role, "amount": amount,
                   "currency": currency},
                  f"Requesting approval from {role}.")
        return role

    def _misread(self, trial: str, amount: float) -> float:
        if not self._fires("misread_amount", trial):
            return amount
        text = f"{amount:.2f}"
        whole = text.split(".")[0]
        pairs = [i for i in range(len(whole) - 1) if whole[i] != whole[i + 1]]
        rng = self._rng(trial, "misread_amount", "how")
        if pairs and rng.random() < 0.5:
            i = rng.choice(pairs)
            text = text[:i] + text[i + 1] + text[i] + text[i + 2:]
            return float(text)
        return round(amount * 10, 2)

    def _audit(self, conv: Conversation, trial: str, doc_id: str, action: str, detail: str) -> None:
        if self._fires("forget_audit_log", trial) or "post_audit_log" not in conv.tools:
            return
        self._one(conv, trial, "post_audit_log", {"invoice_id": doc_id, "action": action, "detail": detail},
                  "Recording the audit entry.")


def describe(imperfections: Iterable[str] = IMPERFECTIONS) -> str:
    """One line per imperfection, for help texts."""
    return "\n".join(f"{name}: {IMPERFECTIONS[name]}" for name in imperfections)
