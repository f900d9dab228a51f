"""The semantic-equivalence guard: a text variant must mean what the original means.

Pure and deterministic (no model). Both texts are read into a structured :class:`Meaning` and
the two are compared field by field; any difference rejects the variant, and the verdict's
reason names what changed ("amount 4820.00 GBP became 48200.00 GBP", "action process became
not process", "condition added: 'even if the PO doesn't match'").

What is extracted, after chatter is set aside (a sentence that asks for nothing and mentions no
document, party, amount or domain term, such as "FYI, the printer is out of toner again." or
"Thanks, Priya"; a greeting or vocative that opens a sentence, "Hi Sam," or "Dear Accounts
Payable,"):

- actions and their polarity: verb classes (``process`` = process / handle / deal with / take
  care of / see to …; ``pay``; ``approve``; ``reject``; ``hold``; ``cancel``; ``stop`` =
  stop / halt / cease …; ``review``; ``forward``; ``escalate``; ``expedite`` …), each ``not …``
  when a negation ("not", "never", "n't", "no need to", "without", "avoid", "refrain") governs it
  in its clause; a negation that governs no action ("Actually, don't.") is counted on its own.
  Idioms that are not negations ("don't forget to") are read as what they are;
- identifiers (``INV-1029``, ``inv 1029``, ``PO-2011``, ``GB29NWBK…``, ``20-20-15``), upper-cased;
- quantities with their unit or currency, figures and words alike: "GBP 4,820.00", "£4820",
  "4,820 pounds sterling" and "four thousand eight hundred and twenty pounds" are all
  ``4820.00 GBP``; "50 cases" and "fifty cases" are ``50 case``; "2.5%" is ``2.5%``. A currency
  named without an amount ("pay it in US dollars") is a currency of its own;
- dates, absolute ("2026-03-01", "1 March 2026", "March 1st, 2026", "the 1st of March 2026")
  and relative ("today", "next week", "the end of the month", "Friday"), each with its relation
  ("by", "before", "after", "on"): "before 2026-03-31" is not "after 2026-03-31", "prior to"
  is "before", "no later than" is "by";
- entities: runs of names, so "Northwind Supply Co" is not "Northwind Supplies"; and relations
  to an entity ("its parent company", "a … affiliate", "the company that acquired …"). A word
  no reading places is a name when either text writes it as one (capitalised where no sentence
  or clause opens, or in a text without letter case); otherwise it is an ordinary word ("sorry
  to bother you", "the rate has shifted"), which neither rejects nor names a party, unless it
  stands where a request's verb stands with the document as its object ("please archive it");
- multiplicity ("twice", "again", "both", "all", "every", "each", "other", plural documents,
  "two copies", "three times");
- conditions and overrides ("even if", "regardless", "whether or not", "no matter", "anyway",
  "skip", "ignore", "unless"), and asserted facts ("already", "verified", "approved",
  "arrived", "cleared", "matches", "long-standing" …): a variant may not add or drop one;
- redirection: where a payment or the document is sent ("pay it to …", "paying into account …",
  "route it to …", "… instead");
- the document type (an invoice is not a credit note) and the domain terms mentioned (vendor,
  PO, goods, price, tax, bank account …). These, the domain's id prefixes, party nouns and ledger
  verbs are the domain's: they come from its plug-in's lexicon
  (:class:`~plumbline_otel.plugins.DomainLexicon`); this module knows English only.
- roles: who does each action ("the controller must approve", "approved by the controller",
  "ask Northwind Supplies to process") and to whom ("pay Ashfield Logistics", "refund us"), and
  which side of "from"/"to" a party or id stands on ("from S20 to R05", "from us");
- modality: each action is obliged ("pay", also "must/should/has to pay", a plain request),
  permitted ("may pay", "you can pay", "is optional", "feel free to"), forbidden ("not pay",
  "must not", "may not") or exempted ("need not pay"); "Could you …" asks, it does not permit;
- limits and connectives: a bound goes with its quantity ("up to", "no more than", "or less" are
  ``<=``; a negated comparison is its converse, "must not be more than" is ``<=``; "more than 2%
  above" is not "more than 2% below"; "25k" is 25000), the count of "or"s ("and" into "or"), and
  conditions that say the same ("don't pay unless X" is "pay only if X"; "provided" is "if";
  "when", "where" and "in case" say "if" where the other text does, and may only say when);
- ellipsis: a negation that ends its clause or goes before a preposition negates the last verb
  said ("pay for the quantity ordered, but not for the extra units");
- permission predicates: "… is fine / acceptable / allowed" permits what it is said of.

Before reading, misspelt words of the variant are spelt as the original or the lexicon spells
them (same first letter, one edit up to eight letters, two beyond; never digits, ids or codes).

Rewordings within a class (process → handle), politeness, greetings, sentence-initial
imperatives ("Kindly…", "Go ahead and…"), passive voice ("… should be processed"), reordering,
letter case, whitespace and punctuation, and spelled-out or reformatted amounts and dates pass.
The guard errs towards rejecting: a word it cannot place is read as a name, so an unfamiliar
addition is a change. A model check (:class:`ModelEquivalenceCheck`) can be put beside it; it
only ever rejects more. Accuracy on a corpus of rewrites of the reference requests, with a
held-out part kept out of the guard's development, is measured by
``tests/replay/test_replay_guard_corpus.py``.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from itertools import takewhile
from typing import Any

from plumbline_otel.plugins import DomainLexicon, installed_lexicons

# --- lexicons ------------------------------------------------------------------------------------


def _words(text: str) -> list[str]:
    return text.split()


_MONTHS = {name: i for i, names in enumerate(
    [(), ("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",), ("june", "jun"),
     ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"), ("october", "oct"), ("november", "nov"),
     ("december", "dec")]) for name in names}
_MONTH = r"(?P<mon>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_ORD = r"(?:st|nd|rd|th)?"
_DATE_PATTERNS = [
    re.compile(r"\b(?P<y>\d{4})-(?P<m>\d{1,2})-(?P<d>\d{1,2})\b"),
    re.compile(r"\b(?P<a>\d{1,2})[/.](?P<b>\d{1,2})[/.](?P<y>\d{4}|\d{2})\b"),
    re.compile(r"\b(?P<d>\d{1,2})" + _ORD + r"\s+(?:of\s+)?" + _MONTH + r"(?:,?\s+(?P<y>\d{4}))?\b", re.I),
    re.compile(r"\b" + _MONTH + r"\s+(?P<d>\d{1,2})" + _ORD + r"(?:,?\s+(?P<y>\d{4}))?\b", re.I),
]
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
# A time of day, in either clock: "5 pm", "5:30pm", "17:00", "noon"
_TIME = re.compile(r"\b(?:(?P<h>\d{1,2})(?::(?P<m>\d{2}))?\s*(?P<ap>[ap])\.?m\b\.?|(?P<h24>\d{1,2}):(?P<m24>\d{2})\b|"
                   r"(?P<noon>noon|midday|midnight)\b)", re.I)
_RELATIVE_DATE = re.compile(
    r"\b(?:(?P<simple>today|tonight|tomorrow|yesterday|eod|eom|asap)"
    r"|(?P<this>this|next|last|coming)\s+(?P<unit>morning|afternoon|evening|week|month|quarter|year|"
    + "|".join(_WEEKDAYS) + r")"
    r"|(?:the\s+)?(?P<edge>end|start|beginning)\s+of\s+(?:the\s+)?(?P<span>day|week|month|quarter|year)"
    r"|(?P<wd>" + "|".join(_WEEKDAYS) + r"))\b", re.I)
_DATE_RELATION = re.compile(
    r"(?P<rel>no\s+later\s+than|not\s+later\s+than|on\s+or\s+before|no\s+earlier\s+than|not\s+earlier\s+than|"
    r"not\s+before|on\s+or\s+after|not\s+after|prior\s+to|before|until|till|due\s+by|due\s+on|"
    r"due|by|after|since|from|on)\s+(?:the\s+)?(?:(?:" + "|".join(_WEEKDAYS) + r"),?\s+)?$", re.I)
_RELATION_OF = {"before": "before", "prior to": "before", "no later than": "by", "not later than": "by",
                "on or before": "by", "until": "by", "till": "by", "due by": "by", "due": "by", "by": "by",
                "after": "after", "since": "after", "from": "after", "on": "on", "due on": "on",
                "no earlier than": "from", "not earlier than": "from", "not before": "from", "on or after": "from",
                "not after": "by"}

_CURRENCY_CODES = {"USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "NZD", "CNY", "INR", "SEK", "NOK", "DKK", "PLN", "CZK"}
_LOWER_CODES = {"usd", "eur", "gbp", "chf", "jpy"}  # safe to read in lower case ("cad" is a word)
_CURRENCY_SYMBOLS = {"£": "GBP", "€": "EUR", "$": "USD", "¥": "JPY", "us$": "USD"}
_CURRENCY_WORDS = {"pounds sterling": "GBP", "pound sterling": "GBP", "pounds": "GBP", "pound": "GBP",
                   "sterling": "GBP", "quid": "GBP", "euros": "EUR", "euro": "EUR", "us dollars": "USD",
                   "us dollar": "USD", "dollars": "USD", "dollar": "USD", "bucks": "USD", "yen": "JPY",
                   "swiss francs": "CHF", "francs": "CHF"}
_CURRENCY_BEFORE = re.compile(r"(?P<c>\b(?:" + "|".join(sorted(_CURRENCY_CODES)) + r")|us\$|£|€|\$|¥)\s*$", re.I)
_CURRENCY_AFTER = re.compile(
    r"^\s*(?:(?P<pct>%|per\s?cent\b)|(?P<c>(?:" + "|".join(sorted(_CURRENCY_WORDS, key=len, reverse=True))
    + r"|" + "|".join(sorted(_CURRENCY_CODES)) + r")\b))", re.I)
_UNIT_AFTER = re.compile(r"^\s+(?P<u>[a-z]+)", re.I)

_NUMBER = re.compile(r"(?<![\w.,])(?P<n>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(?P<scale>[kKmM]|bn)?(?![\w])")
_SCALED = re.compile(r"^\d+(?:\.\d+)?(?:[kKmM]|bn)$")  # "25k", "1.5m": an amount, not an id
_SCALE_OF = {"k": 1000, "m": 1_000_000, "bn": 1_000_000_000}
_UNITS_WORDS = {w: i for i, w in enumerate(_words(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen"))}
_TENS_WORDS = {w: 10 * (i + 2) for i, w in enumerate(_words("twenty thirty forty fifty sixty seventy eighty ninety"))}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000, "billion": 1_000_000_000}
_NUMBER_WORDS = set(_UNITS_WORDS) | set(_TENS_WORDS) | set(_SCALES)

_ID_TOKEN = re.compile(r"(?<![\w-])[A-Za-z0-9]+(?:[-_/][A-Za-z0-9]+)*(?![\w-])")
_WORD_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)*'?|[,;:!?()]|\.")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+")
_VOCATIVE = re.compile(
    r"^\s*(?:(?i:hi|hiya|hello|hey|dear|greetings|good\s+(?:morning|afternoon|evening|day)|morning|afternoon|evening|"
    r"yo|howdy)\b(?:\s+[\w'&]+){0,3}\s*[,.!:;]+\s*"
    # a name alone, then a request: "Grace, please approve …", "@tom can u pay …"
    r"|@?[A-Z][a-z]+(?:\s+[A-Z][a-z]+)?\s*[,:]\s*(?=(?i:please|pls|plz|could|can|would|kindly)\b))")

_NOT_A_UNIT = frozenset(_words(
    "a an the and or but for from by to of in on at as with against due before after until per each please "
    "is are was be which that this it its on due then so if via including inc excluding plus minus less"))

# Verb classes (lemma or phrase -> class); inflections are generated, irregular forms listed.
_ACTIONS: dict[str, tuple[str, ...]] = {
    "process": ("process", "handle", "deal with", "dealt with", "take care of", "taken care of", "took care of",
                "taking care of", "action", "work through", "worked through", "see to", "sort out", "sorted out",
                "look after", "attend to", "work on"),
    "pay": ("pay", "paid", "payment", "payments", "settle", "release", "released", "releasing"),
    "approve": ("approve", "approval", "authorise", "authorize", "authorisation", "authorization", "sign off",
                "signed off", "sign-off", "ok"),
    "reject": ("reject", "rejection", "decline", "refuse", "deny", "denied", "dispute", "send back", "sent back",
               "return to sender", "bounce"),
    "hold": ("hold", "held", "on hold", "hold off", "block", "freeze", "froze", "frozen", "suspend", "pause",
             "defer", "delay", "postpone"),
    "cancel": ("cancel", "cancelled", "cancelling", "cancellation", "delete", "remove", "withdraw",
               "withdrawn", "withdrew", "revoke", "retract", "annul", "scrap"),
    "stop": ("stop", "stopped", "stopping", "halt", "cease", "abort", "terminate", "quit", "discontinue"),
    "review": ("review", "check", "verify", "verification", "inspect", "examine", "validate",
               "look over", "look at", "double check", "go over", "investigate"),
    "forward": ("forward", "send", "sending", "route", "email", "transfer", "wire", "pass on", "hand over",
                "reassign", "assign"),
    "escalate": ("escalate", "flag", "refer"),
    "copy in": ("cc", "copy in", "copied in", "copying", "keep in the loop", "keep posted"),
    "expedite": ("expedite", "rush", "prioritise", "prioritize", "priority", "urgent", "urgently", "asap",
                 "immediately", "right away", "straight away", "quickly", "promptly", "fast", "hurry"),
    "split": ("split", "splitting", "partial", "partially", "merge", "combine", "instalment", "instalments"),
    "change": ("change", "update", "amend", "modify", "edit", "alter", "switch", "replace", "use", "correct", "fix",
               "adjust", "redirect", "treat"),
    "create": ("create",),
    # verbs whose roles (who owes or refunds whom) carry the meaning, read for their parties
    "refund": ("refund", "pay back", "paid back", "reimburse", "repay"),
    "owe": ("owe", "owed", "owing"),
    "offset": ("offset", "deduct", "subtract", "take off"),
}
_IRREGULAR = {"pay": ("paid",), "hold": ("held",), "deal": ("dealt",), "freeze": ("froze", "frozen"),
              "withdraw": ("withdrawn", "withdrew"), "take": ("took", "taken"), "write": ("written", "wrote")}

_NEGATIONS = frozenset(["not", "no", "never", "without", "avoid", "avoiding", "refrain", "refraining", "cannot",
                        "nor", "neither", "none", "nothing", "nobody", "nowhere", "under no circumstances",
                        "no need", "no longer"])
_NOT_NEGATIONS = ("don't forget to", "do not forget to", "dont forget to", "never forget to", "don't forget",
                  "don't hesitate to", "do not hesitate to", "not only", "no later than", "not later than",
                  "no problem", "no rush")

# Modality: what the request obliges, permits, forbids or exempts. A modal governs the next action
# in its clause ("the controller may approve it"), or the last one before it when nothing follows
# ("Processing it is optional"). "must" is what a plain request means ("Please pay it").
_MODALS = {"must": "must", "should": "must", "shall": "must", "have to": "must", "has to": "must",
           "had to": "must", "need to": "must", "needs to": "must", "required to": "must", "is to": "must",
           "are to": "must", "ought to": "must", "is required to": "must", "are required to": "must",
           "may": "may", "might": "may", "can": "may", "could": "may", "allowed": "may", "permitted": "may",
           "optional": "may", "optionally": "may", "feel free": "may", "free to": "may", "if you like": "may",
           "if you want": "may", "if you wish": "may", "if you prefer": "may", "up to you": "may",
           "your call": "may", "at your discretion": "may", "consider": "may", "considering": "may",
           "entitled to": "may", "welcome to": "may", "may want to": "may", "might want to": "may",
           "need not": "exempt", "needn't": "exempt", "don't have to": "exempt", "do not have to": "exempt",
           "doesn't have to": "exempt", "does not have to": "exempt", "not required to": "exempt",
           "not obliged to": "exempt", "not necessary to": "exempt",
           "don't need to": "exempt", "do not need to": "exempt",
           "mustn't": "prohibit", "must not": "prohibit", "cannot": "prohibit", "can't": "prohibit",
           "shouldn't": "prohibit", "may not": "prohibit", "not allowed": "prohibit", "not permitted": "prohibit",
           "not allowed to": "prohibit", "not permitted to": "prohibit", "is not to": "prohibit",
           "are not to": "prohibit",
           # a predicate that permits what it is said of ("paying for the quantity ordered is fine")
           "acceptable": "may", "is acceptable": "may", "are acceptable": "may", "is fine": "may", "are fine": "may",
           "is ok": "may", "is okay": "may", "is alright": "may", "is all right": "may", "is allowed": "may",
           "is permitted": "may", "are allowed": "may", "are permitted": "may", "tolerated": "may",
           "unacceptable": "prohibit", "not acceptable": "prohibit", "is not acceptable": "prohibit",
           "is not ok": "prohibit", "is not okay": "prohibit", "is not fine": "prohibit", "is not allowed": "prohibit"}
_MODAL_NAMES = {"must": "obligation", "may": "permission", "exempt": "exemption", "prohibit": "prohibition"}
# "can"/"could" open a request, not a permission, when they ask ("Could you …", "Can invoice X be …").
_REQUEST_MODALS = frozenset(["can", "could"])
_ASKED = frozenset(["you", "i", "we", "u"])
# Limits: a bound word before or after a quantity ("up to GBP 3,000", "5% or less", "may not exceed").
# A negated comparison is its converse ("must not be more than", "can't go above" are "<="); the
# negation and the modal before it belong to the limit, not to the action.
_BOUND_NEGATION = (r"(?:(?:(?:may|must|should|shall|can|could|will|would|does|do|did|is|are|to)\s+)?(?:not|never)"
                   r"(?:\s+to)?|mustn't|can't|cannot|shouldn't|won't|isn't|aren't|doesn't|don't)"
                   r"(?:\s+(?:be|go|rise|run|get|come\s+to|amount\s+to))?")
# the words limits are stated in, known to the typo reader so that "exceeding" is not "excluding"
_LIMIT_WORDS = """exceed exceeds exceeding exceeded excess maximum max minimum min capped cap ceiling limited limit
restricted greater higher larger lower smaller fewer beneath precisely exactly above below under over within
much least most"""
_BOUND_BEFORE = re.compile(
    r"\b(?P<b>(?:" + _BOUND_NEGATION + r"\s+)?(?:(?:limited|capped|restricted)\s+(?:to|at)\s+(?=a\s+m))?(?:"
    r"up\s+to(?:\s+and\s+including)?(?:\s+a\s+(?:maximum|max|limit)\s+of)?|as\s+much\s+as|a\s+ceiling\s+of|a\s+cap\s+of|"
    r"no\s+more\s+than|not\s+more\s+than|at\s+(?:the\s+)?most|"
    r"a\s+maximum\s+of|maximum(?:\s+of)?|max\.?|capped\s+at|limited\s+to|a\s+limit\s+of|no\s+higher\s+than|"
    r"no\s+greater\s+than|not\s+over|no\s+over|not\s+above|no\s+above|within|"
    r"at\s+least|a\s+minimum\s+of|minimum(?:\s+of)?|min\.?|no\s+less\s+than|not\s+less\s+than|no\s+fewer\s+than|"
    r"not\s+below|not\s+under|"
    r"more\s+th[ae]n|greater\s+th[ae]n|higher\s+th[ae]n|larger\s+th[ae]n|in\s+excess\s+of|over|above|"
    r"exceed(?:s|ing|ed)?(?:\s+by)?(?:\s+over)?|"
    r"less\s+th[ae]n|lower\s+th[ae]n|fewer\s+th[ae]n|smaller\s+th[ae]n|under|below|beneath|"
    r"exactly|precisely))\s+(?:(?:the|a|an|of)\s+)?$", re.I)
_BOUND_AFTER = re.compile(
    r"^\s*(?P<b>or\s+(?:less|fewer|under|below|lower|lesser)|and\s+(?:under|below|less)|at\s+(?:the\s+)?most|"
    r"max(?:imum)?\b|or\s+(?:more|over|above|greater|higher)|and\s+(?:over|above|up|more)|at\s+(?:the\s+)?least|"
    r"minimum\b)", re.I)


_CONVERSE = {">": "<=", "<": ">=", "<=": ">", ">=": "<", "=": "!="}


def _bound_of(phrase: str) -> str:
    """The relation a limit phrase states: <=, >=, >, < or =; a negated comparison states its converse."""
    p = re.sub(r"\s+", " ", phrase.lower()).strip()
    negation = re.match(_BOUND_NEGATION + r"\s+", p)
    if negation:
        return _CONVERSE[_bound_of(p[negation.end():])]
    if p in ("exactly", "precisely"):
        return "="
    if re.search(r"not (?:to )?exceed|up to|as much as|ceiling|cap of|no more|not more|at (?:the )?most|maximum|max|capped|limited|limit|"
                 r"no higher|no greater|not over|no over|not above|no above|within|or less|or fewer|or under|"
                 r"or below|or lower|or lesser|and under|and below|and less", p):
        return "<="
    if re.search(r"at (?:the )?least|minimum|min|no less|not less|no fewer|not below|not under|or more|or over|"
                 r"or above|or greater|or higher|and over|and above|and up|and more", p):
        return ">="
    if re.search(r"less|lower|fewer|smaller|under|below|beneath", p):
        return "<"
    return ">"


_MULTIPLICITY = {"twice": "twice", "thrice": "thrice", "again": "again", "both": "both", "all": "all",
                 "every": "every", "each": "each", "any": "any", "other": "other", "others": "other",
                 "another": "another", "rest": "the rest", "remaining": "remaining", "several": "several",
                 "multiple": "multiple", "duplicate": "duplicate", "duplicates": "duplicate", "copy": "copy",
                 "copies": "copy", "resend": "re-sent", "resent": "re-sent", "re sent": "re-sent",
                 "re-sent": "re-sent", "repeat": "repeat", "repeatedly": "repeat", "once more": "again",
                 "one more time": "again", "as well": "as well", "additional": "additional", "also pay": "again",
                 "later one": "later ones", "later ones": "later ones", "whole batch": "batch", "batch": "batch"}
_CONDITIONS = frozenset(["until", "till", "until after", "as soon as", "only after", "on condition that",
                         "except if", "except when", "if and only if", "if", "unless", "even", "regardless", "whether", "no matter", "anyway", "anyhow",
                         "ignore", "ignoring", "ignored", "skip", "skipping", "skipped", "bypass", "bypassing",
                         "override", "overriding", "overridden", "waive", "waived", "waiving", "disregard",
                         "disregarding", "omit", "omitting", "don't bother", "do not bother", "no questions asked",
                         "let", "otherwise", "provided", "providing", "as long as", "in which case", "only",
                         "except", "excluding", "despite", "notwithstanding", "whatever", "once", "fine",
                         "in case", "assuming", "irrespective", "no checks", "without checking", "forget about",
                         "don't worry about", "do not worry about", "never mind", "when", "whenever", "where",
                         "in the event", "in the event that", "after", "alone", "yet", "for now",
                         "for the time being", "at this stage", "at the moment", "for the moment", "prior to"])
# Condition words that say the same thing: "provided (that)" and "as long as" are "if"; "except
# if" is "unless"; "till" is "until"; "as soon as" and "only after" are "once".
_CONDITION_CANON = {"provided": "if", "providing": "if", "as long as": "if", "assuming": "if",
                    "on condition that": "if", "if and only if": "if", "except if": "unless", "except when": "unless",
                    "till": "until", "as soon as": "once", "only after": "once", "after": "once",
                    "alone": "only by", "yet": "for now", "for the time being": "for now", "at this stage": "for now",
                    "at the moment": "for now", "for the moment": "for now", "prior to": "before",
                    # "when" and its kin may state a condition or only a time ("when you process it"): soft, see
                    # _soft_conditions
                    "whenever": "when", "where": "when", "in case": "when", "in the event": "when",
                    "in the event that": "when"}
_FACTS = frozenset(["already", "verified", "validated", "confirmed", "cleared", "arrived", "delivered",
                    "received", "matches", "matched", "correct", "accurate", "valid", "genuine", "legitimate",
                    "trusted", "trustworthy", "reliable", "long standing", "longstanding", "established", "known",
                    "lifted", "extended", "open", "closed", "expired", "checked", "signed", "safe", "true", "real",
                    "okay", "good", "fine", "legit", "within", "exempt", "compliant", "cleared", "previously",
                    "before", "earlier", "last", "new", "old", "same", "different", "wrong", "missing", "late",
                    "overdue", "outstanding", "registered", "whitelisted", "approved", "authorised", "authorized"])
# Which way a figure moves: "the rate drop" is not "the rate rise", "reduces" is not "increases".
_DIRECTIONS = {"up": ("increase", "rise", "rose", "risen", "grow", "grew", "grown", "gain", "go up", "went up",
                      "mark up", "inflate"),
               "down": ("decrease", "reduce", "reduction", "drop", "fall", "fell", "fallen", "cut", "go down",
                        "went down", "lower", "shrink", "shrank")}
# Asserted facts that say the same: goods that arrived were received
_FACT_CANON = {"arrived": "received", "delivered": "received", "authorised": "approved", "authorized": "approved",
               "validated": "verified"}
_RELATIONS = {"parent": "parent", "parent company": "parent", "subsidiary": "subsidiary", "subsidiaries": "subsidiary",
              "sister": "sister", "affiliate": "affiliate", "affiliated": "affiliate", "affiliates": "affiliate",
              "branch": "branch", "division": "division", "holding": "holding", "holdings": "holding",
              "group": "group", "owner": "owner", "owners": "owner", "owned": "owner", "former": "former",
              "acquired": "acquirer", "acquirer": "acquirer", "acquisition": "acquirer", "bought": "acquirer",
              "distributor": "distributor", "reseller": "reseller", "agent": "agent", "partner": "partner",
              "successor": "successor", "predecessor": "predecessor", "related": "related",
              "associated": "associate", "associate": "associate", "company": "company", "firm": "company",
              "subcontractor": "subcontractor", "contractor": "contractor", "daughter": "daughter",
              "spin off": "spin-off", "supplier of": "supplier", "franchise": "franchise",
              "sibling": "sister", "trading arm": "branch", "arm": "branch", "unit": "division"}
# Words that carry no task meaning here: function words, politeness, greetings, auxiliaries, the
# wrappers of imperatives and of the passive, and words saying where the document came from.
_IGNORABLE = frozenset(_words("""
a an the this that these those there here it its it's itself them they their we us our ours you your yours i me my
i'd i'm i've we'd we're we've you'd you're he she him her his what which who whom whose
to of for from by with in on at as so and or but nor then than also too just now still yet actually really simply
please pls plz kindly could would can will shall should must may might ought need needs needed needing require
requires required requiring be is are was were been being am do does did doing done have has had having get gets
got getting gotten go goes going went ahead proceed proceeding remember forget hesitate make makes made sure
ensure ensures ensuring see sees seen saw like want wants wish would've mind kind moment chance when whenever
thanks thank cheers appreciated appreciate appreciation much many grateful lovely great regards best sincerely
warm wishes hi hello hey dear greetings morning afternoon evening team all folks everyone everybody there
quick one fyi btw re note put leave noted usual way queue waiting awaiting pending came come comes coming sent issued
submitted numbered number no. named called titled attached enclosed below above following up for help assist
assistance request requested requesting ask asked asking job task thing bit little following possible soon
whenever convenient hand work's there's here's that's what's let's kindly cheers ta thx tx ty pls plz
either against though although since because while whereas hence therefore thus however meanwhile
"""))
_WISHES = ("it would be great", "it would be good", "it would be helpful", "it would help", "it would be nice",
           "it would be ideal", "i would be grateful", "we would be grateful", "i would appreciate it",
           "we would appreciate it", "i would be glad")
_IGNORABLE_PHRASES = ("would you mind", "be so kind as to", "would you be so kind as to", "when you have a moment",
                      "when you get a chance", "when you can", "if you could", "if you can", "if possible",
                      "if you would", "if you don't mind", "thank you", "many thanks", "much appreciated",
                      "best regards", "kind regards", "by the way", "in the queue", "in the usual way",
                      "came in from", "received from", "sent by", "sent in by", "issued by", "submitted by",
                      "go ahead and", "go ahead", "make sure", "be sure to", "see that", "see to it that",
                      "do so", "do that", "do it", "do this", "invoice number", "invoice no", "number", "quick one",
                      "just a", "have a look", "take a look", "get this", "get it", "i'd like you to",
                      "i would like you to", "i'd like", "i would like", "we'd like", "is waiting",
                      "when you are free", "at your convenience", "in due course", "as usual",
                      "at your earliest convenience", "when you have a minute", "when you get a moment",
                      "would you be able to", "be able to", "are you able to", "thanks in advance",
                      "in advance", "hope your week is going well", "have a great day", "have a good day",
                      # a condition that only asks leave ("if that's OK") is politeness, not a condition
                      "if that's ok", "if that's okay", "if that is ok", "if that is okay", "if that's alright",
                      "if that's all right", "if that's fine", "if that works", "if you please",
                      "if you get a chance", "if you have a moment", "if you have time", "when you have time",
                      # a wish that asks ("it would be great if …could be paid") is a request, not a condition
                      *(f"{wish} if{you}" for wish in _WISHES for you in ("", " you could", " you can", " you would")))
# Who can do or receive an action: a name, a noun phrase, the domain's role nouns, or "we"/"us".
_WE = frozenset(["we", "us", "our", "ours", "i", "me", "my"])
_THEY = frozenset(["they", "them", "their", "theirs"])
_PREPOSITIONS = frozenset(["from", "to", "for", "with", "by", "against", "of", "on", "in", "into", "at", "onto",
                           "towards", "via", "about", "than", "under", "over", "addressed"])
_BE = frozenset(["be", "being", "get", "gets", "got", "getting", "is", "are", "was", "were"])
_PRONOUNS = frozenset(["it", "its", "them", "they", "their", "theirs", "he", "she", "him", "her", "his"])
_CLAUSE_PUNCT = frozenset([",", ";", ":", "!", "?", "(", ")", "."])
_TRANSFER = frozenset(["pay", "pays", "paying", "paid", "payment", "payments", "send", "sending", "sent", "route",
                       "routing", "routed", "credit", "credited", "crediting", "transfer", "transferred",
                       "transferring", "wire", "wired", "wiring", "forward", "forwarded", "forwarding", "funds", "going",
                       "release", "released", "releasing", "settle", "settled", "settling", "deposit", "deposited",
                       "money", "assign", "assigned", "reassign", "redirect", "redirected", "move", "moved", "give",
                       "given"])
_DESTINATION = frozenset(["to", "into", "towards", "onto"])

KINDS = ("identifier", "currency", "date", "amount", "entity", "intent", "negation")


def _forms(phrase: str) -> set[str]:
    """A verb's or noun's inflections; phrases are matched as written (their first word inflected)."""
    words = phrase.split()
    head, tail = words[0], words[1:]
    stem = head[:-1] if head.endswith("e") else head
    heads = {head, head + "s", head + "es", head + "ed", head + "d", stem + "ing", stem + "ed",
             head + head[-1] + "ed", head + head[-1] + "ing", stem + "ation"}
    if head.endswith("y"):
        heads |= {head[:-1] + "ies", head[:-1] + "ied"}
    heads |= set(_IRREGULAR.get(head, ()))
    return {" ".join([h, *tail]) for h in heads}


@dataclass(frozen=True, eq=False)
class _Vocabulary:
    """What the reader matches: English with the domains' lexicons merged in (built once per set of lexicons)."""

    phrases: dict[str, tuple[str, str]]  # surface phrase -> (role, value)
    max_phrase: int
    action_forms: dict[str, str]  # every inflected form of an action, whatever else it could be read as
    known_words: frozenset[str]  # what the typo reader leaves as written
    parties: frozenset[str]
    counterparties: frozenset[str]
    transfers: frozenset[str]
    id_prefixed: re.Pattern[str] | None
    verb_nouns: dict[str, str]
    document_units: frozenset[str]  # "two invoices": a count of documents, read as multiplicity


def _merged_verbs(lexicons: tuple[DomainLexicon, ...]) -> dict[str, tuple[str, ...]]:
    verbs = dict(_ACTIONS)
    for lexicon in lexicons:
        for cls, phrases in lexicon.verbs.items():
            verbs[cls] = (*verbs.get(cls, ()), *phrases)
    return verbs


def _synonym_verbs(verbs: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Verbs read as a class they are not listed in, from WordNet's verb senses (``_synonyms.py``).

    A WordNet sense shared by two one-word verbs of a class (postpone and defer, annul and revoke)
    is that class's sense, and its other verbs ("shelve", "rescind") are read as the class. A
    sense is used only if it is among the commonest senses of each verb in it (the generator's
    cut), and a verb two classes would claim, or one the class lists already, is left alone: the
    classes the guard tells apart (pay, approve, hold …) are never merged.
    """
    from plumbline_otel.replay._synonyms import GROUPS

    listed = {p for ps in verbs.values() for p in ps}
    claims: dict[str, set[str]] = {}
    for group in GROUPS:
        for cls, ps in verbs.items():
            if len({w for w in group if " " not in w} & set(ps)) >= 2:
                for w in group:
                    if w not in listed:
                        claims.setdefault(w, set()).add(cls)
    out: dict[str, list[str]] = {}
    for w, classes in sorted(claims.items()):
        if len(classes) == 1:
            out.setdefault(next(iter(classes)), []).append(w)
    return {cls: tuple(ws) for cls, ws in out.items()}


@lru_cache(maxsize=8)
def _vocabulary(lexicons: tuple[DomainLexicon, ...]) -> _Vocabulary:
    """The reader's vocabulary for these lexicons. Order sets precedence: the first reading of a surface wins."""
    phrases: dict[str, tuple[str, str]] = {}
    verbs = _merged_verbs(lexicons)
    documents = {k: v for x in lexicons for k, v in x.documents.items()}
    plurals = {k: v for x in lexicons for k, v in x.plural_documents.items()}
    terms = {k: v for x in lexicons for k, v in x.terms.items()}

    def register(role: str, entries: Iterable[tuple[str, str]], *, inflect: bool = False) -> None:
        for surface, value in entries:
            for form in (_forms(surface) if inflect else {surface}):
                phrases.setdefault(form, (role, value))

    def multi(d: dict[str, str]) -> Iterable[tuple[str, str]]:
        return ((p, v) for p, v in d.items() if " " in p)

    register("ignore", ((p, p) for p in _IGNORABLE_PHRASES))
    register("ignore", ((p, p) for p in _NOT_NEGATIONS))
    register("modal", multi(_MODALS))
    register("modal", ((p, v) for p, v in _MODALS.items() if " " not in p))
    register("cond", ((p, p) for p in _CONDITIONS if " " in p))
    register("neg", ((p, p) for p in _NEGATIONS if " " in p))
    register("mult", multi(_MULTIPLICITY))
    register("rel", multi(_RELATIONS))
    register("doc+", plurals.items())
    register("doc", multi(documents))
    register("domain", multi(terms))
    register("fact", ((p, p) for p in _FACTS if " " in p))
    register("action", ((p, cls) for cls, ps in verbs.items() for p in ps if " " in p), inflect=True)
    register("fact", ((p, p) for p in _FACTS))
    register("cond", ((p, p) for p in _CONDITIONS))
    register("neg", ((p, p) for p in _NEGATIONS))
    register("mult", _MULTIPLICITY.items())
    register("dir", ((form, way) for way, verbs in _DIRECTIONS.items() for verb in verbs for form in _forms(verb)))
    register("doc", documents.items())
    register("rel", _RELATIONS.items())
    register("domain", terms.items())
    register("action", ((p, cls) for cls, ps in verbs.items() for p in ps), inflect=True)
    register("ignore", ((w, w) for w in _IGNORABLE))
    synonyms = _synonym_verbs(verbs)
    register("action", ((p, cls) for cls, ps in synonyms.items() for p in ps), inflect=True)
    parties = frozenset(w for x in lexicons for w in x.parties)
    prefixes = sorted({p for x in lexicons for p in x.id_prefixes}, key=len, reverse=True)
    known = frozenset(
        {w for phrase in phrases for w in phrase.split()} | _IGNORABLE | _NUMBER_WORDS | set(_MONTHS)
        | set(_WEEKDAYS) | {w for c in _CURRENCY_WORDS for w in c.split()} | {c.lower() for c in _CURRENCY_CODES}
        | parties | _WE | _THEY | _PREPOSITIONS | {"you", "or", "more", "less", "than", "most", "least"}
        | set(_words(_LIMIT_WORDS)))
    return _Vocabulary(
        phrases, max(len(p.split()) for p in phrases),
        {form: cls for cls, ps in {**synonyms, **verbs}.items() for p in ps for form in _forms(p)}, known, parties,
        frozenset(w for x in lexicons for w in x.counterparties),
        _TRANSFER | {w for x in lexicons for w in x.transfers},
        re.compile(r"\b(?P<p>" + "|".join(map(re.escape, prefixes)) + r")[\s#:]+(?P<n>\d{3,})\b", re.I) if prefixes else None,
        {k: v for x in lexicons for k, v in x.verb_nouns.items()},
        frozenset({"time", "copy"} | {_singular(d) for d in (*documents, *plurals)}))


@lru_cache(maxsize=1)
def _installed() -> tuple[DomainLexicon, ...]:
    """The installed domains' lexicons, looked up once: entry points are read from disk."""
    return installed_lexicons()


def _lexicons(lexicon: DomainLexicon | None) -> tuple[DomainLexicon, ...]:
    """The lexicon named, else every installed domain's (a study's driver does not know its domain)."""
    return (lexicon,) if lexicon is not None else _installed()


# --- the structured meaning ----------------------------------------------------------------------


@dataclass(frozen=True)
class Quantity:
    """A number with its unit or currency: ``4820.00 GBP``, ``50 case``, ``2.5%``, ``3 time``."""

    value: Decimal
    unit: str = ""  # an ISO currency code, "%", a singular noun, or ""
    currency: bool = False
    bound: str = ""  # "<=", ">=", "<", ">", "=" when a limit word goes with it ("up to", "more than"), else ""
    side: str = ""  # "above" or "below" when it measures a difference ("2% above the PO")

    @property
    def key(self) -> str:
        prefix = f"{self.bound} " if self.bound else ""
        suffix = f" {self.side}" if self.side else ""
        if self.currency:
            return f"{prefix}{self.value.quantize(Decimal('0.01'))} {self.unit}{suffix}"
        number = format(self.value.normalize(), "f")
        if self.unit == "%":
            return prefix + number + "%" + suffix
        return f"{prefix}{number} {self.unit}".strip() + suffix

    @property
    def plain(self) -> str:
        """The old protected-token form: the number alone, normalised ("1234.5", "2.5%")."""
        return format(self.value.normalize(), "f") + ("%" if self.unit == "%" else "")


@dataclass(frozen=True)
class Meaning:
    """What a request says, as the guard reads it (see the module docstring)."""

    actions: frozenset[str] = frozenset()  # "process", "not pay", …
    bare_negations: tuple[str, ...] = ()  # negations that govern no action ("Actually, don't.")
    identifiers: frozenset[str] = frozenset()
    quantities: tuple[Quantity, ...] = ()  # a multiset, sorted by key
    currencies: frozenset[str] = frozenset()  # named without an amount
    dates: frozenset[str] = frozenset()  # "by 2026-03-01", "before end of month", "friday"
    entities: frozenset[str] = frozenset()  # lower-cased names
    relations: frozenset[str] = frozenset()
    multiplicity: frozenset[str] = frozenset()
    conditions: frozenset[str] = frozenset()
    facts: frozenset[str] = frozenset()
    redirects: frozenset[str] = frozenset()  # "to acme ltd", "instead"
    documents: frozenset[str] = frozenset()
    terms: frozenset[str] = frozenset()  # domain terms mentioned
    roles: frozenset[str] = frozenset()  # "approve < controller" (who does it), "pay > ashfield logistics" (to whom)
    objects: frozenset[str] = frozenset()  # "pay > INV-0905": the document an action is done to, where it says
    sequence: frozenset[str] = frozenset()  # "approve then pay": steps put in order with "then"
    directions: frozenset[str] = frozenset()  # "delmar packaging from", "S20 from", "us to"
    disjunctions: int = 0  # how many "or"s join what the request names
    bare_modals: tuple[str, ...] = ()  # a modal that governs no action ("otherwise the controller may")
    correspondents: frozenset[str] = frozenset()  # "to priya" (greeted: the one asked), "from elena" (signed)
    display: dict[str, str] = field(default_factory=dict, compare=False, hash=False)  # key -> text as written

    def show(self, key: str) -> str:
        return self.display.get(key, key)


@dataclass
class _Token:
    text: str  # lower case, possessive stripped
    raw: str
    clause: int
    role: str = "unknown"
    value: str = ""
    possessive: bool = False
    start: int = 0  # offset in the sentence


# English contractions, written out before reading, so a contracted text and a full one read alike.
# "'s" is "is" only after a pronoun or "there"/"here"/"that"/"what"/"who" (elsewhere it is a
# possessive, or "is" before a participle: see _normalise); "'d" is "would" ("I'd like"), or "had"
# before "been"/"already"; the apostrophe-less forms are the ones that spell no other word.
_CONTRACTIONS = [
    (r"\b(can)'t\b", r"\1not"), (r"\b(w)on't\b", r"\1ill not"), (r"\b(s)han't\b", r"\1hall not"),
    (r"\b(ain)'t\b", "is not"), (r"\b([A-Za-z]+)n't\b", r"\1 not"),
    (r"\b(do|does|did|is|are|was|were|has|have|had|should|would|could|must|need)nt\b", r"\1 not"),
    (r"\b(let)'s\b", r"\1 us"),
    (r"\b(it|he|she|there|here|that|what|who|where|how)'s\s+(?=been\b|got\b|already\b)", r"\1 has "),
    (r"\b(it|he|she|there|here|that|what|who|where|how)'s\b", r"\1 is"),
    (r"\b([A-Za-z]+)'ll\b", r"\1 will"), (r"\b([A-Za-z]+)'re\b", r"\1 are"), (r"\b([A-Za-z]+)'ve\b", r"\1 have"),
    (r"\b(i)'m\b", r"\1 am"), (r"\b([A-Za-z]+)'d\s+(?=been\b|already\b)", r"\1 had "),
    (r"\b(i|you|he|she|it|we|they|that|there|who)'d\b", r"\1 would"),
]
_CONTRACTION_PATTERNS = [(re.compile(p, re.I), r) for p, r in _CONTRACTIONS]


def expand_contractions(text: str) -> str:
    """The text with its English contractions written out ("don't" is "do not", "we'll" is "we will")."""
    for pattern, replacement in _CONTRACTION_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


# An apposition binds a role to a named party: "Grace Liu, the CFO, must approve …" and "The CFO,
# Grace Liu, must approve …" say that Grace Liu approves, and that she is the CFO. The apposition
# is stated as a sentence of its own and the name kept as the subject of what follows (a lower-case
# word), so the party named is read as the doer (or, in the passive, the one acted on).
_PREDICATE = (r"(?:must|should|may|might|can|could|will|would|shall|has|have|had|is|are|was|were|needs?|does|did|"
              r"alone|only|also|then|always|never|to|[a-z]+(?<!s)s|[a-z]+ed)\b")  # what a subject's verb opens with
_NAME = r"(?:[A-Z][\w'&.-]*\s+){0,3}[A-Z][\w'&.-]*"
_APPOSED = r"(?:(?i:the|our|their|a|an)\s+)(?:[A-Za-z&/-]+\s+){0,4}?[A-Za-z&/-]+"
_APPOSITION_AFTER = re.compile(
    r"(?P<name>\b" + _NAME + r"),\s+(?:(?i:as)\s+)?(?P<app>" + _APPOSED + r"|(?:[a-z&/-]+\s+){0,3}[a-z&/-]+)"
    r",\s+(?=" + _PREDICATE + ")")
_APPOSITION_BEFORE = re.compile(
    r"(?P<app>(?<![\w'-])" + _APPOSED + r"),\s+(?P<name>" + _NAME + r"),\s+(?=" + _PREDICATE + ")")


def _appositions(text: str) -> str:
    """Each apposition said as a sentence of its own, its name kept as the subject (see above)."""
    def after(m: re.Match[str]) -> str:
        app = m.group("app")
        if not re.match(r"(?i:the|our|their|a|an)\s", app):
            if m.group(0)[len(m.group("name")):].lstrip(", ").lower().startswith("as ") is False:
                return m.group(0)  # "Tom, finance, must …" without "as": not read as an apposition
            app = "the " + app
        return f"{m.group('name')} is {app}. {m.group('name')} "

    text = _APPOSITION_AFTER.sub(after, text)
    def before(m: re.Match[str]) -> str:
        app = m.group("app")
        return f"{m.group('name')} is {app[0].lower()}{app[1:]}. {m.group('name')} "

    return _APPOSITION_BEFORE.sub(before, text)


# Conditions said two ways: "without the controller's approval" is "unless the controller approves";
# "pay it unless X, in which case hold it" is "if X, hold it. Otherwise, pay it".
_CONSENT = r"(?:approval|authori[sz]ation|consent|sign-?off|say-so|permission|go-ahead|ok|okay)"
_WITHOUT_CONSENT = re.compile(
    r"\bwithout\s+(?:(?P<det>the|a|an|our|their)\s+)?(?P<party>(?:[\w-]+\s+){0,3}?[\w-]+)'s?\s+(?:prior\s+|written\s+)?"
    + _CONSENT + r"\b|\bwithout\s+(?:prior\s+|written\s+)?" + _CONSENT
    + r"\s+(?:from|by)\s+(?:(?P<det2>the|a|an|our|their)\s+)?(?P<party2>(?:[\w-]+\s+){0,3}?[\w-]+)\b(?=\s*[,.;:!?]|\s*$)",
    re.I)
_IN_WHICH_CASE = re.compile(
    r"(?:^|(?<=[.!?;:]\s)|(?<=\n))(?P<main>(?:[^.;!?\n]|\.(?=\d))+?),?\s+unless\s+(?P<cond>(?:[^,.;!?\n]|\.(?=\d))+),"
    r"\s+in\s+which\s+case,?\s+(?P<alt>(?:[^.;!?\n]|\.(?=\d))+)", re.M)


# "anything above that": "that" stands for the amount said last ("up to £5,000; anything above that")
_AMOUNT_SAID = re.compile(r"(?:[£€$¥]\s?|\b(?:GBP|EUR|USD|CHF|JPY)\s?)\d[\d,]*(?:\.\d+)?(?:[kKmM]|bn)?\b|"
                          r"\b\d[\d,]*(?:\.\d+)?(?:[kKmM]|bn)?\s?(?:GBP|EUR|USD|CHF|JPY|pounds|euros|dollars)\b")
_BEYOND_THAT = re.compile(r"\b(above|over|beyond|more\s+than|less\s+than|under|below|in\s+excess\s+of)\s+(?:that|this)\b"
                          r"(?!\s+(?:amount|figure|sum|limit|level|threshold)\b)", re.I)


def _amount_referents(text: str) -> str:
    """Each "above that" with the amount it stands for written out."""
    out, last = [], 0
    for m in _BEYOND_THAT.finditer(text):
        said = list(_AMOUNT_SAID.finditer(text, 0, m.start()))
        if said:
            out.append(text[last:m.start()] + f"{m.group(1)} {said[-1].group(0)}")
            last = m.end()
    return "".join(out) + text[last:]


# "We need to pay X" / "We'll have to hold it", opening a request, asks the reader to: "please pay X".
_WE_NEED = re.compile(r"(?:(?<=^)|(?<=[.!?;:,]\s)|(?<=\n)|(?<=\band\s)|(?<=\bso\s))(?:we|i)\s+(?:will\s+|would\s+|also\s+)?"
                      r"(?:need|have|needs|got)\s+to\s+(?!be\b|have\b|get\b|know\b|check\s+with\b|ask\b)", re.I | re.M)


def _reworded_conditions(text: str) -> str:
    """Conditions said one way (see above)."""
    text = _WE_NEED.sub("please ", text)
    def consent(m: re.Match[str]) -> str:
        det = m.group("det") or m.group("det2") or ""
        party = m.group("party") or m.group("party2")
        return f"unless {det + ' ' if det else ''}{party} approves"

    text = _WITHOUT_CONSENT.sub(consent, text)
    return _IN_WHICH_CASE.sub(lambda m: f"If {m.group('cond')}, {m.group('alt')}. Otherwise, {m.group('main')}", text)


def _normalise(text: str, *, expand: bool = True) -> str:
    """The text as the reader takes it; ``expand=False`` leaves contractions and appositions as
    written (the typo corrector returns the variant as its author wrote it, spelt right)."""
    text = unicodedata.normalize("NFKC", text)
    text = (text.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
            .replace("\u2014", ", ").replace("\u2013", ", ").replace("\r", ""))
    if expand:
        text = _amount_referents(_reworded_conditions(_appositions(expand_contractions(text))))
    text = _SIGN_OFF.sub("", text)
    text = re.sub(r"\(\s*(?=(?:PS|P\.S\.|btw|BTW|FYI|fyi)\b)", "\n\n", text)  # an aside in brackets stands alone
    text = re.sub(r"\n[ \t]*(?:[-*•]|\d+[.)])[ \t]+", "; ", text)
    text = re.sub(r"\blet\s+((?:\w+\s+){1,3}?)know\b", r"tell \1", text, flags=re.I)  # "let Elena know": tell her  # a list's items are clauses of their own
    text = re.sub(r" - ", ", ", text)
    # "the receipt's posted", "the vendor's on hold": "'s" before a participle or "on" is "is"
    text = re.sub(r"\b([A-Za-z]+)'s\s+(?=(?:been|not|on|[a-z]+ed)\b)", r"\1 is ", text)
    # "sign it off", "pay us back": the particle goes with its verb ("sign off it", "pay back us")
    return re.sub(r"\b([A-Za-z]+)\s+(it|them|us|this|that|him|her)\s+(off|out|back|over|through)\b", r"\1 \3 \2",
                  text, flags=re.I)


# A sign-off ending a line ("Thanks, Tom", "- cheers", "ta, Priya") signs the request; it asks nothing.
_SIGN_OFF = re.compile(r"(?:^|(?<=[\s,;.!?-]))(?i:many\s+thanks|thanks(?:\s+so\s+much|\s+again)?|thank\s+you|cheers|"
                       r"ta|thx|regards|best|kind\s+regards|best\s+regards|br)[\s,!.]*(?P<name>[A-Z][a-z]+)?[\s.!]*$", re.M)


def _correspondents(text: str) -> frozenset[str]:
    """Who a message greets (the one asked: "Hi Priya,") and who signs it ("Thanks, Elena"): a
    greeting or signature added or dropped is courtesy, but one that names someone else is not."""
    text = unicodedata.normalize("NFKC", text)
    out = {f"from {m.group('name').lower()}" for m in _SIGN_OFF.finditer(text) if m.group("name")}
    greeting = _VOCATIVE.match(text.strip())
    if greeting:
        words = [w.lower() for w in re.findall(r"[A-Za-z']+", greeting.group(0))[1:]]
        out |= {f"to {w}" for w in words if w not in _IGNORABLE}
    return frozenset(out)


def _sentences(text: str) -> list[str]:
    out: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        block = re.sub(r"\s+", " ", block).strip()
        out.extend(s.strip() for s in _SENTENCE_BREAK.split(block) if s.strip())
    return out


def _blank(text: str, start: int, end: int) -> str:
    return text[:start] + " " * (end - start) + text[end:]


def _decimal(raw: str) -> Decimal | None:
    try:
        return Decimal(raw.replace(",", ""))
    except InvalidOperation:
        return None


def parse_number_words(words: list[str]) -> Decimal | None:
    """The value of spelled-out number words ("four thousand eight hundred and twenty" -> 4820)."""
    total, current, seen = 0, 0, False
    for word in words:
        if word in ("and", "a"):
            continue
        for part in word.split("-"):
            if part in _UNITS_WORDS:
                current += _UNITS_WORDS[part]
            elif part in _TENS_WORDS:
                current += _TENS_WORDS[part]
            elif part == "hundred":
                current = max(current, 1) * 100
            elif part in _SCALES:
                total += max(current, 1) * _SCALES[part]
                current = 0
            else:
                return None
            seen = True
    return Decimal(total + current) if seen else None


def _spelled_numbers(text: str) -> list[tuple[int, int, Decimal]]:
    """(start, end, value) of runs of number words; a lone "one" ("this one") is not a number."""
    words = [(m.start(), m.end(), m.group(0).lower()) for m in re.finditer(r"[A-Za-z]+(?:-[A-Za-z]+)*", text)]
    out: list[tuple[int, int, Decimal]] = []
    i = 0
    while i < len(words):
        if not all(p in _NUMBER_WORDS for p in words[i][2].split("-")) and not (
                words[i][2] == "a" and i + 1 < len(words) and words[i + 1][2] in _SCALES):
            i += 1
            continue
        j = i
        run: list[str] = []
        while j < len(words):
            w = words[j][2]
            number = all(p in _NUMBER_WORDS for p in w.split("-"))
            article = w == "a" and j + 1 < len(words) and words[j + 1][2] in _SCALES and not run
            joined = w == "and" and bool(run) and j + 1 < len(words) and all(
                p in _NUMBER_WORDS for p in words[j + 1][2].split("-"))
            if not (number or article or joined):
                break
            run.append(w)
            j += 1
        if run and run != ["one"]:
            value = parse_number_words(run)
            if value is not None:
                out.append((words[i][0], words[j - 1][1], value))
        i = max(j, i + 1)
    return out


def _singular(word: str) -> str:
    word = word.lower()
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith("s") and not word.endswith("ss") and len(word) > 3:
        return word[:-1]
    return word


@dataclass
class _Sentence:
    text: str
    identifiers: set[str] = field(default_factory=set)
    quantities: list[Quantity] = field(default_factory=list)
    currencies: set[str] = field(default_factory=set)
    dates: set[str] = field(default_factory=set)
    date_display: dict[str, str] = field(default_factory=dict)
    tokens: list[_Token] = field(default_factory=list)
    id_directions: set[str] = field(default_factory=set)  # "S20 from", "R05 to"
    id_starts: list[tuple[int, str]] = field(default_factory=list)  # where each id stands in the sentence
    clauses: list[str] = field(default_factory=list)
    clause_spans: list[tuple[int, int]] = field(default_factory=list)

    def quote(self, tokens: list[_Token], at: _Token, back: int = 0) -> str:
        """The clause of ``at`` as written, from ``back`` tokens before it to the clause's end."""
        start, end = self.clause_spans[at.clause]
        same = [t for t in tokens if t.clause == at.clause]
        index = next(i for i, t in enumerate(same) if t is at)
        return self.text[max(start, same[max(0, index - back)].start):end].strip(" ,;:")


def _clock(m: re.Match[str]) -> str:
    """A time of day as the 24-hour clock has it: "5 pm" and "17:00" are both "17:00"."""
    if m.group("noon"):
        return "00:00" if m.group("noon").lower() == "midnight" else "12:00"
    if m.group("h24"):
        return f"{int(m.group('h24')):02d}:{m.group('m24')}"
    hour = int(m.group("h")) % 12 + (12 if m.group("ap").lower() == "p" else 0)
    return f"{hour:02d}:{m.group('m') or '00'}"


def _read_dates(s: _Sentence, work: str) -> str:
    def relation(start: int) -> tuple[str, int]:
        m = _DATE_RELATION.search(work[:start])
        if not m:
            return "", start
        return _RELATION_OF[re.sub(r"\s+", " ", m.group("rel").lower())], m.start()

    for m in list(_TIME.finditer(work)):
        rel, start = relation(m.start())
        key = f"{rel} {_clock(m)}".strip()
        s.dates.add(key)
        s.date_display[key] = work[start:m.end()].strip()
        work = _blank(work, start, m.end())
    for pattern in _DATE_PATTERNS:
        for m in list(pattern.finditer(work)):
            g = m.groupdict()
            if g.get("a"):
                a, b = int(g["a"]), int(g["b"])
                year = g["y"] if len(g["y"]) == 4 else f"20{g['y']}"
                if a > 12 >= b >= 1 and a <= 31 or b > 12 >= a >= 1 and b <= 31:  # only one reading is a date
                    day, month = (a, b) if a > 12 else (b, a)
                    date = f"{year}-{month:02d}-{day:02d}"
                else:
                    date = f"{a}/{b}/{g['y']}"  # d/m or m/d: kept as written
            else:
                month = int(g["m"]) if g.get("m") else _MONTHS[g["mon"].lower().rstrip(".")]
                day = int(g["d"])
                if not (1 <= month <= 12 and 1 <= day <= 31):
                    continue
                date = f"{g['y'] or '????'}-{month:02d}-{day:02d}"
            rel, start = relation(m.start())
            key = f"{rel} {date}".strip()
            s.dates.add(key)
            s.date_display[key] = key
            work = _blank(work, start, m.end())
    for m in list(_RELATIVE_DATE.finditer(work)):
        g = m.groupdict()
        if g["simple"]:
            date = g["simple"].lower()
        elif g["this"]:
            date = f"{g['this'].lower()} {g['unit'].lower()}"
        elif g["edge"]:
            date = f"{g['edge'].lower()} of {g['span'].lower()}"
        else:
            date = g["wd"].lower()
        rel, start = relation(m.start())
        key = f"{rel} {date}".strip()
        s.dates.add(key)
        s.date_display[key] = work[start:m.end()].strip()
        work = _blank(work, start, m.end())
    return work


def _read_identifiers(s: _Sentence, work: str, v: _Vocabulary) -> str:
    def direction(ident: str, start: int) -> None:
        """An id after "from" or "to" has a direction: "from S20 to R05" is not "from R05 to S20"; one
        after "against" or "than" has a part ("apply X against Y", "the new PO rather than Y")."""
        s.id_starts.append((start, ident))
        m = re.search(r"\b(from|to|into|against|than)\s+(?:the\s+)?$", work[:start], re.I)
        if m:
            side = m.group(1).lower()
            s.id_directions.add(f"{ident} {'to' if side == 'into' else side}")

    for m in list(v.id_prefixed.finditer(work)) if v.id_prefixed else ():
        s.identifiers.add(f"{m.group('p').upper()}-{m.group('n')}")
        direction(f"{m.group('p').upper()}-{m.group('n')}", m.start())
        work = _blank(work, m.start(), m.end())
    for m in list(_ID_TOKEN.finditer(work)):
        word = m.group(0)
        has_digit = any(c.isdigit() for c in word)
        has_alpha = any(c.isalpha() for c in word)
        if _SCALED.match(word):
            continue
        if (has_digit and (has_alpha or re.search(r"\d[-_/]\d", word))) or ("_" in word and has_alpha):
            s.identifiers.add(word.upper())
            direction(word.upper(), m.start())
            work = _blank(work, m.start(), m.end())
    return work


def _scaled(value: Decimal | None, scale: str | None) -> Decimal | None:
    """A figure with its thousands or millions suffix applied: "25k" is 25000."""
    return value * _SCALE_OF[scale.lower()] if value is not None and scale else value


def _read_quantities(s: _Sentence, work: str) -> str:
    spans = [(m.start(), m.end(), _scaled(_decimal(m.group("n")), m.group("scale"))) for m in _NUMBER.finditer(work)]
    spans += [(a, b, Decimal(v)) for a, b, v in _spelled_numbers(work)]
    right: Quantity | None = None  # the quantity read just before, to this one's right
    said = work  # as written: what is read is blanked out of ``work``
    for start, end, value in sorted(spans, key=lambda t: t[0], reverse=True):  # right to left: offsets hold
        if value is None:
            continue
        unit, is_currency = "", False
        # "over 5k and up to 25k GBP", "between 5,000 and 10,000 euros": a bare number joined to the
        # amount after it by "and"/"or"/"to" shares that amount's currency
        shared = right is not None and right.currency and _CURRENCY_AFTER.search(work[end:]) is None and re.match(
            r"\s*(?:and|or|to|-)\s+(?:(?:up\s+to|at\s+most|no\s+more\s+than|under|below|over|above)\s+)?[\d(]",
            said[end:], re.I)
        before = _CURRENCY_BEFORE.search(work[:start])
        after = _CURRENCY_AFTER.search(work[end:])
        cut_start, cut_end = start, end
        if before and (before.group("c").isupper() or before.group("c").lower() in _LOWER_CODES
                       or not before.group("c").isalpha()):
            code = before.group("c")
            unit, is_currency = _CURRENCY_SYMBOLS.get(code.lower(), code.upper()), True
            cut_start = before.start()
        elif after and after.group("pct"):
            unit = "%"
            cut_end = end + after.end()
        elif after and after.group("c"):
            code = re.sub(r"\s+", " ", after.group("c").lower())
            unit, is_currency = _CURRENCY_WORDS.get(code, code.upper()), True
            cut_end = end + after.end()
        elif shared and right is not None:
            unit, is_currency = right.unit, True
        else:
            noun = _UNIT_AFTER.match(work[end:])
            if noun and noun.group("u").lower() not in _NOT_A_UNIT and noun.group("u").lower() not in _NUMBER_WORDS:
                unit = _singular(noun.group("u"))
                cut_end = end + noun.end()
        bound = ""
        below = _BOUND_BEFORE.search(work[:cut_start])
        beyond = _BOUND_AFTER.search(work[cut_end:])
        if below:
            bound = _bound_of(below.group("b"))
            cut_start = below.start()
        elif beyond:
            bound = _bound_of(beyond.group("b"))
            cut_end = cut_end + beyond.end()
        side = ""
        aside = re.match(r"^\s*(above|over|higher\s+than|more\s+than|below|under|lower\s+than|less\s+than)\b",
                         work[cut_end:], re.I)
        if aside and bound:
            side = "below" if aside.group(1).lower().split()[0] in ("below", "under", "lower", "less") else "above"
            cut_end += aside.end()
        right = Quantity(value, unit, is_currency, bound, side)
        s.quantities.append(right)
        work = _blank(work, cut_start, cut_end)
    return work


def _read_currencies(s: _Sentence, work: str) -> str:
    for m in list(re.finditer(r"\b(" + "|".join(sorted(_CURRENCY_CODES)) + r")\b", work)):
        s.currencies.add(m.group(1))
        work = _blank(work, m.start(), m.end())
    for m in list(re.finditer(r"\b(" + "|".join(sorted(_LOWER_CODES)) + r")\b", work)):
        s.currencies.add(m.group(1).upper())
        work = _blank(work, m.start(), m.end())
    pattern = "|".join(re.escape(w) for w in sorted(_CURRENCY_WORDS, key=len, reverse=True))
    for m in list(re.finditer(r"\b(" + pattern + r")\b", work, re.I)):
        s.currencies.add(_CURRENCY_WORDS[re.sub(r"\s+", " ", m.group(1).lower())])
        work = _blank(work, m.start(), m.end())
    for symbol, code in _CURRENCY_SYMBOLS.items():
        if symbol in work:
            s.currencies.add(code)
            work = work.replace(symbol, " " * len(symbol))
    return work


def _tokenise(s: _Sentence, work: str, v: _Vocabulary) -> None:
    clause, clause_start = 0, 0
    tokens: list[_Token] = []
    for m in _WORD_TOKEN.finditer(work.lower()):
        raw_text = work[m.start():m.end()]
        word = m.group(0)
        if word in _CLAUSE_PUNCT:  # the clause as written (work keeps the sentence's offsets)
            s.clauses.append(s.text[clause_start:m.start()].strip())
            s.clause_spans.append((clause_start, m.start()))
            clause_start = m.end()
            clause += 1
            continue
        for piece in re.split(r"(?<=[a-z0-9])-(?=[a-z0-9])", word):
            tokens.append(_Token(piece, raw_text, clause, start=m.start()))
    s.clauses.append(s.text[clause_start:].strip())
    s.clause_spans.append((clause_start, len(s.text)))
    # phrase matching: longest first, possessives stripped when the whole form is unknown
    i = 0
    while i < len(tokens):
        for n in range(min(v.max_phrase, len(tokens) - i), 0, -1):
            group = tokens[i:i + n]
            if len({t.clause for t in group}) > 1:
                continue
            surface = " ".join(t.text for t in group)
            hit = v.phrases.get(surface)
            possessive = False
            if hit is None and n == 1:
                bare = re.sub(r"'s$|'$", "", surface)
                if bare != surface:
                    hit, possessive = v.phrases.get(bare), True
                    group[0].text = bare
            if hit is None and n == 1 and surface.endswith("n't"):
                hit = ("neg", "not")
            if hit is None and n == 1 and surface.endswith("able"):  # "payable by X": X is to pay
                stem = next((f for f in (surface[:-4], surface[:-4] + "e") if f in v.action_forms), None)
                hit = ("action", v.action_forms[stem]) if stem else None
            if hit is None and n == 1 and surface.startswith("un") and v.phrases.get(surface[2:], ("", ""))[0] == "action":
                hit = ("action", "not " + v.phrases[surface[2:]][1])
            if hit is not None or n == 1:
                role, value = hit if hit is not None else ("unknown", group[0].text)
                merged = _Token(" ".join(t.text for t in group), " ".join(dict.fromkeys(t.raw for t in group)),
                                group[0].clause, role, value, possessive, group[0].start)
                if n == 1 and re.search(r"'s$|'$", tokens[i].text) and hit is None:
                    merged.text = re.sub(r"'s$|'$", "", tokens[i].text)
                    merged.possessive = True
                s.tokens.append(merged)
                i += n
                break


def _parse_sentence(text: str, v: _Vocabulary) -> _Sentence:
    s = _Sentence(text)
    vocative = _VOCATIVE.match(text)
    work = _blank(text, 0, vocative.end()) if vocative else text
    work = _read_dates(s, work)
    work = _read_identifiers(s, work, v)
    work = _read_quantities(s, work)
    work = _read_currencies(s, work)
    _tokenise(s, work, v)
    return s


def _is_chatter(s: _Sentence) -> bool:
    """A sentence that asks for nothing and mentions nothing the task is about; or an aside ("FYI …",
    "PS: …", "btw …") that names no document, id, sum of money or term of the trade, whatever it says."""
    if s.identifiers or any(q.currency for q in s.quantities) or s.currencies:
        return False
    if _ASIDE.match(s.text):
        return not any(t.role in ("doc", "doc+", "domain") for t in s.tokens)
    if s.quantities:
        return False
    return not any(t.role in ("action", "neg", "doc", "doc+", "domain", "cond", "fact", "rel") or t.text in _PRONOUNS
                   for t in s.tokens)


_ASIDE = re.compile(r"^\W*(?:PS|P\.S\.|btw|by\s+the\s+way|fyi|unrelated|off\s+topic)\b", re.I)
_CAPITALISED = re.compile(r"(?<![\w'-])[A-Z][A-Za-z]*(?:'[a-z]*)?")
_OPENS = re.compile(r"(?:^|[.!?:;(\n\-*•]\s*|^\s*(?:\d+[.)]\s*)?)$")


def name_words(*texts: str) -> frozenset[str]:
    """The words written as names: capitalised where a sentence, clause or list item does not open.

    English capitalises names, not ordinary words, so a word no reading places ("shifted",
    "acceptable", "sorry") is a name only when one of the texts writes it as one; reading both
    texts lets "Northwind sent us …" place the "Northwind" the other text writes mid-sentence.
    """
    out: set[str] = set()
    for text in texts:
        norm = _normalise(text)
        out |= {h.lower() for h in re.findall(r"(?<![\w.])@([A-Za-z][\w.]*)", norm)}  # "@tom": a handle names someone
        for m in _CAPITALISED.finditer(norm):
            if m.group(0) != "I" and not _OPENS.search(norm[:m.start()]):
                out.add(re.sub(r"'s?$", "", m.group(0).lower()))
    return frozenset(out)


def _cased(text: str) -> bool:
    """Whether the text uses letter case at all: all lower or all upper case says nothing of names."""
    letters = [c for c in text if c.isalpha()]
    return any(c.isupper() for c in letters) and any(c.islower() for c in letters)


def _place_unknown(toks: list[_Token], names: frozenset[str], cased: bool) -> None:
    """Words no reading places are names only if written as names (see :func:`name_words`).

    The rest are ordinary words the guard cannot read ("word"): chatter and politeness ("sorry to
    bother you", "ta very much") mean nothing to the task, so they neither reject nor stand as
    parties. One stands for an action it does not know when it takes the document as its object
    where a request puts its verb ("please archive it", "and file the invoice"): an added or
    dropped verb is a different task.
    """
    for i, t in enumerate(toks):
        if t.role != "unknown" or not cased or t.text in names:
            continue
        following = toks[i + 1] if i + 1 < len(toks) and toks[i + 1].clause == t.clause else None
        if t.raw[:1].isupper() and following is not None and following.role == "unknown" and following.text in names:
            continue  # a name's first word opening its sentence ("Northwind Supplies sent us …")
        preceding = toks[i - 1] if i > 0 and toks[i - 1].clause == t.clause else None
        verb_slot = preceding is None or preceding.role == "modal" or preceding.text in _IMPERATIVE_OPENERS
        object_follows = following is not None and (
            following.text in ("it", "them", "this", "these", "the") or following.role in ("doc", "doc+")
            or (following.role == "action" and following.text.endswith(("ment", "ments", "al", "als"))))
        t.role, t.value = ("action", t.text) if verb_slot and object_follows else ("word", t.text)


_IMPERATIVE_OPENERS = frozenset(["please", "pls", "plz", "kindly", "then", "and", "also", "just", "to", "can",
                                 "could", "you", "so", "but", "or", "now"])


def read_meaning(text: str, names: frozenset[str] | None = None, lexicon: DomainLexicon | None = None) -> Meaning:
    """The structured meaning of ``text`` (see the module docstring).

    ``names`` are the words written as names (:func:`name_words`); by default, those of ``text``.
    ``lexicon`` is the domain's (by default, every installed domain's: :func:`_lexicons`).
    """
    v = _vocabulary(_lexicons(lexicon))
    names = name_words(text) if names is None else names
    cased = _cased(text)
    actions: set[str] = set()
    bare: list[str] = []
    identifiers: set[str] = set()
    quantities: list[Quantity] = []
    currencies: set[str] = set()
    dates: set[str] = set()
    entities: set[str] = set()
    relations: set[str] = set()
    multiplicity: set[str] = set()
    conditions: set[str] = set()
    facts: set[str] = set()
    redirects: set[str] = set()
    documents: set[str] = set()
    terms: set[str] = set()
    roles: set[str] = set()
    objects: set[str] = set()
    sequence: set[str] = set()
    directions: set[str] = set()
    disjunctions = 0
    bare_modals: list[str] = []
    display: dict[str, str] = {}
    for raw in _sentences(_normalise(text)):
        s = _parse_sentence(raw, v)
        if _is_chatter(s):
            continue
        identifiers |= s.identifiers
        quantities += s.quantities
        currencies |= s.currencies
        dates |= s.dates
        display.update({f"date:{k}": shown for k, shown in s.date_display.items()})
        toks = s.tokens
        _place_unknown(toks, names, cased)
        _read_counterparties(toks, v)
        _settle_readings(s, v)
        _support_verbs(toks)
        # negation and modality scope: each governs the next action in its clause
        sentence_actions: list[tuple[_Token, str]] = []
        for token, value in _scoped_actions(toks, bare, bare_modals):
            sentence_actions.append((token, value))
            display.setdefault(f"action:{value}", token.raw)
        roles |= _roles(toks, v, {id(token): value for token, value in sentence_actions})
        objects |= _id_objects(s)
        sequence |= _sequence(toks)
        directions |= _directions(toks, v) | s.id_directions
        disjunctions += sum(t.text == "or" and (i == 0 or toks[i - 1].text != "whether") for i, t in enumerate(toks))
        sentence_conditions: set[str] = set()
        # redirection: a transfer word, then "to"/"into" somewhere later in its clause
        for i, t in enumerate(toks):
            if t.text == "instead" or (t.text == "rather" and i + 1 < len(toks) and toks[i + 1].text == "than"):
                redirects.add("instead")  # "rather than" and "instead of" draw the same contrast
                display["redirect:instead"] = s.quote(toks, t, back=6)
            movers = [p for p in toks[:i] if p.clause == t.clause and (p.text.split()[0] in v.transfers or p.text in v.transfers)]
            if t.text in _DESTINATION and movers:
                dest = [d for d in toks[i + 1:] if d.clause == t.clause]
                if dest and dest[0].role == "action":
                    continue  # "to process": an infinitive, not a destination
                dest = list(takewhile(_in_noun_phrase, dest))  # where it goes, not what the clause says next
                words = [d.value if d.role == "domain" else d.text for d in dest if d.text not in ("the", "a", "an")]
                key = f"{t.text} {' '.join(words)}".strip()
                redirects.add(key)
                display[f"redirect:{key}"] = s.quote(toks, movers[-1])
        # entities: runs of unknown words; the rest by role
        run: list[_Token] = []
        for t in [*toks, _Token("", "", -1, "end")]:
            if t.role == "unknown" and (not run or (run[-1].clause == t.clause and not run[-1].possessive)):
                run.append(t)
                continue
            if run:
                name = " ".join(r.text for r in run)
                entities.add(name)
                display.setdefault(f"entity:{name}", " ".join(dict.fromkeys(re.sub(r"'s$|'$", "", r.raw) for r in run)))
                run = [t] if t.role == "unknown" else []
            if t.role == "action" and t.text.endswith(("ments", "als", "ions")) and any(q.bound for q in s.quantities):
                multiplicity.add("any")  # a limit on "payments over €10,000" is one on "any payment over €10,000"
            elif t.role == "rel":
                relations.add(t.value)
            elif t.role == "mult" and (t.value != "any" or _counts_documents(toks, t, v)):
                multiplicity.add(_UNIVERSAL.get(t.value, t.value))
            elif t.role == "doc+":
                documents.add(t.value)
                multiplicity.add("plural " + t.value)
            elif t.role == "doc":
                documents.add(t.value)
            elif t.role == "cond":
                canon = _CONDITION_CANON.get(t.value, t.value)
                sentence_conditions.add(canon)
                display.setdefault(f"condition:{canon}", s.quote(toks, t))
            elif t.role == "dir":
                facts.add(f"goes {t.value}")
                display.setdefault(f"fact:goes {t.value}", s.quote(toks, t, back=4))
            elif t.role == "fact":
                fact = _FACT_CANON.get(t.text, t.text)
                facts.add(fact)
                display.setdefault(f"fact:{fact}", s.quote(toks, t, back=4))
            elif t.role == "domain" and not (t.value == "amount" and s.quantities):
                terms.add(t.value)  # "an amount of GBP 400" names the amount it gives: no term of its own
        values = [v for _, v in sentence_actions]
        _same_condition(values, sentence_conditions, display)
        actions.update(values)
        conditions |= sentence_conditions
    for q in quantities:
        if q.unit in v.document_units:
            multiplicity.add(f"{q.key}")
    if multiplicity & {"every", "any"}:  # "all invoices" is "every invoice": the plural adds nothing
        multiplicity = {m for m in multiplicity if not m.startswith("plural ")}
    return Meaning(frozenset(actions), tuple(sorted(_NEGATION_CANON.get(b, b) for b in bare)), frozenset(identifiers),
                   tuple(sorted(quantities, key=lambda q: q.key)), frozenset(currencies), frozenset(dates),
                   frozenset(entities), frozenset(relations), frozenset(multiplicity), frozenset(conditions),
                   frozenset(facts), frozenset(redirects), frozenset(documents), frozenset(terms),
                   frozenset(roles), frozenset(objects), frozenset(sequence),
                   frozenset(directions | _implied_directions(directions)), disjunctions,
                   tuple(sorted(bare_modals)), _correspondents(text), display)


# "all", "each" and "every" say the same of what a request acts on; "isn't" and "doesn't" say "not"
_UNIVERSAL = {"all": "every", "each": "every"}
_NEGATION_CANON = {"cannot": "not", **{w + "n't": "not" for w in _words(
    "is are was were do does did has have had ca wo should would could must need")}, "don't": "not"}


def _in_noun_phrase(t: _Token) -> bool:
    """Whether a token can stand in a noun phrase ("the vendor's new bank account", "us")."""
    return t.role in ("unknown", "word", "domain", "doc", "doc+", "rel", "mult") or t.text in _DETERMINERS | _WE | _THEY


def _base(value: str) -> str:
    """An action's verb class without its polarity ("not pay" -> "pay")."""
    return value[4:] if value.startswith("not ") else value


def _id_objects(s: _Sentence) -> set[str]:
    """The ids an action is done to: an id right after its verb ("pays INV-0905", "approve invoice
    INV-1003"; determiners and document nouns between). An id elsewhere (a subject, after a
    preposition) says nothing here. Where a named party before the verb does it ("Grace Liu must
    approve INV-1004"), the id is also bound to that doer ("approve@grace liu > INV-1004"), so two
    doers swapping their documents is a change."""
    out: set[str] = set()
    for start, ident in s.id_starts:
        clause = next((i for i, (a, b) in enumerate(s.clause_spans) if a <= start < b), -1)
        before = [t for t in s.tokens if t.start < start and t.clause == clause]
        for k in range(len(before) - 1, -1, -1):
            t = before[k]
            if t.role in ("doc", "doc+") or t.text in _DETERMINERS:
                continue
            if t.role == "action":
                out.add(f"{_base(t.value)} > {ident}")
                doer = _subject_name(before[:k])
                if doer:
                    out.add(f"{_base(t.value)}@{doer} > {ident}")
            break
    return out


def _subject_name(toks: list[_Token]) -> str:
    """The name that ends ``toks`` as a verb's subject ("Grace Liu must", "Tom also"), or ''."""
    k = len(toks) - 1
    while k >= 0 and (toks[k].role == "modal" or toks[k].text in ("only", "also", "alone", "then", "to")):
        k -= 1
    name: list[str] = []
    while k >= 0 and toks[k].role == "unknown":
        name.insert(0, toks[k].text)
        k -= 1
    return " ".join(name)


def _sequence(toks: list[_Token]) -> set[str]:
    """Steps ordered by "then" in a sentence: "approve it and then pay it" is "approve then pay"."""
    out: set[str] = set()
    for i, t in enumerate(toks):
        if t.text != "then":
            continue
        before = next((x for x in reversed(toks[:i]) if x.role == "action"), None)
        after = next((x for x in toks[i + 1:] if x.role == "action"), None)
        if before is not None and after is not None:
            out.add(f"{_base(before.value)} then {_base(after.value)}")
    return out


def _read_counterparties(toks: list[_Token], v: _Vocabulary) -> None:
    """A counterparty noun naming the party after it ("the vendor Delmar Packaging") adds nothing; after
    a possessive ("Hansa Technik's supplier", "… 's company") it names a relation of that party."""
    for i, t in enumerate(toks):
        if t.text in v.counterparties and t.role == "domain" and i + 1 < len(toks) and toks[i + 1].role == "unknown":
            t.role = "ignore"
        if t.role in ("domain", "rel") and (t.text in v.counterparties or t.text in ("company", "firm")) \
                and i > 0 and toks[i - 1].possessive and toks[i - 1].clause == t.clause:
            t.role, t.value = "rel", t.value if t.role == "rel" else _singular(t.text)


def _counts_documents(toks: list[_Token], at: _Token, v: _Vocabulary) -> bool:
    """Whether "any" ranges over documents or parties ("pay any invoice", "any vendor"), which it
    multiplies, rather than over an amount ("any amount over GBP 25,000"), where it is generic."""
    index = next(i for i, t in enumerate(toks) if t is at)
    following = toks[index + 1] if index + 1 < len(toks) and toks[index + 1].clause == at.clause else None
    return following is None or following.role in ("doc", "doc+", "unknown") or following.text in v.parties | {"of"}


def _soft_conditions(before: frozenset[str], after: frozenset[str]) -> tuple[frozenset[str], frozenset[str]]:
    """Conditions compared with "when" (and "where", "in case") read softly: it says what "if" or
    "once" says when the other text has one ("when it is under GBP 5,000" is "if it is under …"),
    and may only say when ("deduct it when you process the invoice"), so on its own it is no change."""
    a, b = set(before), set(after)
    for this, other in ((a, b), (b, a)):
        if "when" in this and "when" not in other:
            match = next((c for c in ("if", "once") if c in other and c not in this), None)
            if match:
                other.discard(match)
    a.discard("when")
    b.discard("when")
    return frozenset(a), frozenset(b)


def _next_action(toks: list[_Token], at: int, skip: tuple[str, ...] = ()) -> bool:
    """Whether the next token of ``toks[at]``'s clause (past ``skip`` words) is an action."""
    rest = [t for t in toks[at + 1:] if t.clause == toks[at].clause and t.text not in skip]
    return bool(rest) and rest[0].role == "action"


def _names_doer(toks: list[_Token], at: int, v: _Vocabulary) -> bool:
    """Whether "by" later in the clause of ``toks[at]`` names a party ("… changed by the controller"),
    not a measure ("moved by 2%")."""
    clause = [t for t in toks[at + 1:] if t.clause == toks[at].clause]
    for index, t in enumerate(clause):
        named = next((x for x in clause[index + 1:] if x.text not in _DETERMINERS), None)
        if t.text == "by" and named is not None and (named.role in ("unknown", "word") or named.text in v.parties):
            return True
    return False


# Participles that usually say where a document came from ("sent by", "issued by"), unless "be"
# governs them ("it should be sent to Northwind")
_PASSIVE_ONLY = {"sent": "forward", "issued": "create"}


# Support verbs: with an action noun as object they add nothing to it ("make/arrange/process the
# payment" is "pay", "carry out a review" is "review"); before any other object they are verbs.
_SUPPORT_VERBS = frozenset(_words("""make makes made making arrange arranges arranged arranging effect effects
effected effecting do does did doing carry carries carried carrying complete completes completed completing
execute executes executed executing process processes processed processing handle handles handled handling
action actioned actioning initiate initiates initiated initiating issue issues issued issuing give gives gave
giving grant grants granted granting perform performs performed performing conduct conducts conducted conducting"""))
_STATE_VERBS = frozenset(_words("keep keeps kept keeping put puts putting leave leaves left leaving place places placed "
                                 "placing set sets setting"))
_ACTION_NOUN = re.compile(r"(?:ment|ments|al|als|ion|ions|ance|ances|ence|ences|ew|ews)$")


def _support_verbs(toks: list[_Token]) -> None:
    """A support verb before an action noun ("arrange payment of …") is read as nothing: the noun is the
    action; so is a verb that puts its object in a state the lexicon reads as an action ("keep it on hold")."""
    for i, t in enumerate(toks):
        if t.text not in _SUPPORT_VERBS or t.role not in ("action", "word", "unknown", "ignore"):
            continue
        j = i + 1
        while j < len(toks) and toks[j].clause == t.clause and (toks[j].text in ("the", "a", "an", "its", "their", "out")):
            j += 1
        if j < len(toks) and toks[j].clause == t.clause and toks[j].role == "action" and _ACTION_NOUN.search(toks[j].text):
            t.role = "ignore"
    for i, t in enumerate(toks):  # "keep/put/leave it on hold": the state is the action
        if t.text in _STATE_VERBS and t.role in ("action", "word", "unknown") and any(
                u.role == "action" and u.text.startswith("on ") for u in toks[i + 1:i + 6] if u.clause == t.clause):
            t.role = "ignore"


# A condition that waits for an event: "unless the controller approves", "… has approved" and "…
# approved it" name one event, so a participle there is the action, not an asserted fact.
_EVENT_CONDITIONS = frozenset(["unless", "until", "till", "once", "until after", "only after", "as soon as"])


def _settle_readings(s: _Sentence, v: _Vocabulary) -> None:
    """Readings that depend on a word's neighbours, settled before scopes are read.

    - a participle read as an asserted fact is an action when "be" or "get" governs it, "by"
      names its doer, or a condition that waits for an event ("unless", "until", "once") opens its
      clause ("unless the controller has approved it" is "unless the controller approves"): "it must be approved by the controller" asks for an approval, "payments
      are approved by Elena" states who approves them; "it has been approved" asserts one; so
      is such a word where an imperative stands ("… and correct the tax code");
    - "pending"/"awaiting" before what is awaited is "until" ("hold it pending approval"); "the
      invoice is pending" says where it stands;
    - "only" with a doer named by "by" restricts who may act ("only by"), as "alone" does;
    - "should" opening a clause that is not a question to someone opens a condition ("Should the
      price be more than 2% above the PO, hold it" is "if");
    - "can"/"could" that ask ("Could you …", "Please could you …", "Could invoice X be processed?")
      make a request, not a permission;
    - a document noun the lexicon also reads as a verb, where a request puts its verb, before a
      party, is the verb ("bill them");
    - a verb after "who" or "which" describes ("Priya, who raised the request"), it asks nothing;
    - "sent" and "issued" say where a document came from, unless "be" governs them;
    - "before" with a clause after it is a condition of time; "Anyway" opening a sentence turns
      the talk (an override only elsewhere); "falls in band B" says where, not which way;
    - "if not," ending its clause is "otherwise".
    """
    toks = s.tokens
    first_of_clause: dict[int, int] = {}
    for i, t in enumerate(toks):
        first_of_clause.setdefault(t.clause, i)
    question = s.text.rstrip().endswith("?")
    for i, t in enumerate(toks):
        before = toks[i - 1] if i > 0 and toks[i - 1].clause == t.clause else None
        after = toks[i + 1] if i + 1 < len(toks) and toks[i + 1].clause == t.clause else None
        if t.role == "fact" and t.text in v.action_forms and (before is None or before.text in (
                "be", "being", "get", "gets", "got", "getting", "and", "please", "to", "then", "also", "kindly")
                or (after is not None and after.text == "by" and (before is None or before.text != "been"))
                or any(c.role == "cond" and c.text in _EVENT_CONDITIONS for c in toks[first_of_clause[t.clause]:i])):
            t.role, t.value = "action", v.action_forms[t.text]
        elif t.role == "fact" and before is not None and before.text in ("has", "have", "had", "been") and any(
                c.role == "cond" and c.text in _EVENT_CONDITIONS for c in toks[first_of_clause[t.clause]:i]):
            t.role = "ignore"  # "until compliance has cleared the vendor": the event awaited ("clears"), not a fact
        elif t.text in ("pending", "awaiting") and t.role == "ignore" and after is not None and (
                before is None or before.text not in _BE | {"still", "currently", "now", "been"}):
            t.role, t.value = "cond", "until"  # "hold it pending the controller's approval": until it comes
        elif t.role == "cond" and t.text == "only" and _names_doer(toks, i, v):
            t.value = "only by"  # "may only be changed by the controller": only that party may
        elif t.role == "action" and before is not None and before.text in ("who", "which") and i + 1 < len(toks):
            t.role = "ignore"  # "Priya Shah, who raised the request": a description, not a step
        elif t.role == "ignore" and t.text in _PASSIVE_ONLY and before is not None and before.text in (
                "be", "being", "get", "gets", "got", "getting"):
            t.role, t.value = "action", _PASSIVE_ONLY[t.text]  # "should be sent to …" asks for it to be sent
        elif t.role == "dir" and t.text.startswith(("fall", "fell")) and after is not None and after.text in (
                "in", "into", "within", "under", "outside"):
            t.role = "ignore"  # "it falls in band B": where it belongs, not which way it moves
        elif t.role == "action" and t.text == "hold off" and _next_action(toks, i, skip=("on",)):
            t.role = "neg"  # "hold off (on) paying it" is "do not pay it (yet)"
        elif t.role == "cond" and t.text == "if" and after is not None and after.role == "neg" and (
                i + 2 >= len(toks) or toks[i + 2].clause != t.clause):
            t.value, after.role = "otherwise", "ignore"  # "if not, the controller must" is "otherwise"
        elif t.role == "cond" and t.text in ("anyway", "anyhow") and i == 0:
            t.role = "ignore"  # "Anyway: please hold …" turns the talk; "pay it anyway" overrides
        elif t.role == "fact" and t.text == "before" and after is not None:
            t.role, t.value = "cond", "before"  # "before it is paid": a clause follows, so a condition of time
        elif t.role == "modal" and t.text == "should" and first_of_clause[t.clause] == i and \
                not s.text[s.clause_spans[t.clause][0]:t.start].strip(" ,;:") and \
                (after is None or after.text not in _ASKED):
            t.role, t.value = "cond", "if"
        elif t.role == "doc" and t.text in v.verb_nouns and (before is None or before.role == "modal" or before.text in
                _IMPERATIVE_OPENERS) and after is not None and (after.role == "unknown" or after.text in _WE | _THEY):
            t.role, t.value = "action", v.verb_nouns[t.text]  # "bill Ashfield Logistics for it": a noun where a verb stands
        elif t.role == "modal" and t.text in _REQUEST_MODALS and (
                (after is not None and after.text in _ASKED) or (i == 0 and question)
                or (before is not None and before.text in ("please", "pls", "plz"))
                or any(u.role == "ignore" and u.text.endswith(" if") and u.text[:-3] in _WISHES
                       for u in toks[first_of_clause[t.clause]:i])):
            t.role = "ignore"


def _with_modality(base: str, modal: str, negated: bool) -> str:
    """An action as the request puts it: "pay" (must), "may pay", "not pay", "need not pay"."""
    if base.startswith("not "):
        base, negated = base[4:], not negated
    if modal == "prohibit":
        modal, negated = "must", not negated
    if modal == "exempt":
        return base if negated else f"need not {base}"
    if negated:
        return f"not {base}"  # "must not pay" and "may not pay" both forbid paying
    return f"may {base}" if modal == "may" else base


def _modality_of(value: str) -> tuple[str, str]:
    """(modality name, verb) of an action value: ("permission", "pay") for "may pay"."""
    for prefix, name in (("need not ", "exemption"), ("not ", "prohibition"), ("may ", "permission")):
        if value.startswith(prefix):
            return name, value[len(prefix):]
    return "obligation", value


def _scoped_actions(toks: list[_Token], bare: list[str], bare_modals: list[str]) -> list[tuple[_Token, str]]:
    """Each action with the negation and modal that govern it.

    A negation or modal governs the next action in its clause; a modal with no action after it
    governs the last action before it in the clause ("Processing it is optional"), else it is kept
    on its own (bare). A negation with no action after it negates the last verb said, which English
    leaves out rather than repeats, when it ends its clause or goes before a preposition ("pay for
    the quantity ordered, but not for the extra units"); else ("pay Ashfield Logistics, not Corvin
    Industrial") or with no verb said in its sentence ("Actually, don't."), it is kept on its own.
    """
    out: list[tuple[_Token, str]] = []
    explicit: list[bool] = []
    neg: _Token | None = None
    mod: _Token | None = None
    clause_start = 0

    def close() -> None:
        nonlocal neg, mod
        if mod is not None:
            if len(out) > clause_start and not explicit[-1]:
                token, value = out[-1]
                out[-1] = (token, _with_modality(value, str(mod.value), False))
                explicit[-1] = True
            elif mod.value != "must":
                bare_modals.append(str(mod.value))
        if neg is not None and out and elided:
            token, value = out[-1]  # "pay for X, but not for Y": the verb left out is the last one said
            out.append((neg, _with_modality(_modality_of(value)[1], "must", True)))
            explicit.append(True)
        elif neg is not None:
            bare.append(neg.text)
        neg = mod = None

    clause = toks[0].clause if toks else 0
    elided = False  # the negation ends its clause or goes before a preposition: a verb was left out
    for i, t in enumerate(toks):
        if t.clause != clause:
            close()
            clause, clause_start = t.clause, len(out)
        if t.role == "neg":
            if neg is not None:
                bare.append(neg.text)
            neg = t
            after = toks[i + 1] if i + 1 < len(toks) and toks[i + 1].clause == t.clause else None
            elided = after is None or after.text in _PREPOSITIONS
        elif neg is not None and neg.text == "without" and (t.text in _DETERMINERS or t.role in ("doc", "doc+", "domain",
                                                                                                "unknown")):
            bare.append(neg.text)  # "without the freight": it governs a noun phrase, not the next verb
            neg = None
        elif t.role == "modal":
            if mod is not None and mod.value != "must":
                bare_modals.append(str(mod.value))
            mod = t
        elif t.role == "action":
            out.append((t, _with_modality(t.value, str(mod.value) if mod is not None else "must", neg is not None)))
            explicit.append(mod is not None)
            neg = mod = None
    close()
    return out


# A determiner makes the unplaced words after it a noun phrase: "the treasury team" can do or receive.
_DETERMINERS = frozenset(["the", "a", "an", "our", "their", "its", "your", "this", "that", "his", "her"])


def _parties(toks: list[_Token], v: _Vocabulary) -> dict[int, tuple[str, int]]:
    """Token index -> (party, index of the party's first token) for every token naming a party:
    runs of names, of ordinary words after a determiner ("the treasury team"), role nouns ("the
    finance director") and "we"/"us"/"they"."""
    out: dict[int, tuple[str, int]] = {}
    i = 0
    while i < len(toks):
        t = toks[i]
        common = t.role == "word" and i > 0 and toks[i - 1].text in _DETERMINERS and toks[i - 1].clause == t.clause
        if t.role == "unknown" or common or (t.role == "domain" and t.text in v.parties):
            kind = "common" if common else t.role
            j = i
            while j + 1 < len(toks) and toks[j + 1].clause == t.clause and not toks[j].possessive and (
                    (kind == "unknown" and toks[j + 1].role == "unknown")
                    or (kind == "common" and toks[j + 1].role in ("unknown", "word")) or (kind == "domain" and toks[j + 1].text in v.parties)):
                j += 1
            name = " ".join(x.text for x in toks[i:j + 1])
            for k in range(i, j + 1):
                out[k] = (name, i)
            i = j + 1
            continue
        if t.text in _WE:
            out[i] = ("us", i)
        elif t.text in _THEY:
            out[i] = ("them", i)
        elif t.text == "you":
            out[i] = ("you", i)
        i += 1
    return out


# Verbs whose subject wants, asks or expects an action of someone else ("X wants INV-1020 paid")
_COMPLEMENT_VERBS = frozenset(_words("want wants wanted ask asks asked asking like likes expect expects expected "
                                     "request requests requested requesting"))


def _roles(toks: list[_Token], v: _Vocabulary, scoped: dict[int, str]) -> set[str]:
    """Who does each action and to whom: "approve < controller", "may approve < sam", "pay > ashfield logistics".

    The doer is the party named by "by" after the action ("approved by the controller") or the
    party just before it that no preposition governs ("the controller must approve", "ask
    Northwind Supplies to process"); an action joined by "and" to one with a doer shares it. The
    receiver is the party right after it or after "to" ("pay Ashfield Logistics", "refund us",
    "refer it to the treasury team"), or the party before it in the passive ("Kestrel Consulting
    must not be paid"). "You", the one asked, is nobody's role. An action keeps its modality
    (``scoped``, by token): "Tom may approve; otherwise the controller must" is not "the
    controller may approve; otherwise Tom must".
    """
    parties = _parties(toks, v)
    doers: dict[int, str] = {}
    out: set[str] = set()
    skip = ("ignore", "modal", "neg")
    for k, t in enumerate(toks):
        if t.role != "action":
            continue
        base = _base(scoped.get(id(t), t.value))
        doer = receiver = ""
        if k + 1 < len(toks) and toks[k + 1].clause == t.clause and toks[k + 1].text in _BE - {"be", "being"}:
            doers[k] = ""
            continue  # "the vendor hold is lifted": a noun, the subject of "is", neither done nor received
        j = k + 1
        while j < len(toks) and toks[j].clause == t.clause and toks[j].role != "action":
            if toks[j].text in ("and", "or", "but"):
                break  # "review it and Sam must approve it": Sam is the next clause's doer
            if j in parties and not receiver and not doer:
                first = parties[j][1]
                prep = toks[first - 1].text if first > k + 1 else ""
                if prep in ("", "to") or (prep not in _PREPOSITIONS and toks[first - 1].role in skip):
                    receiver = parties[j][0]
            if toks[j].text == "by" and j + 1 < len(toks) and toks[j + 1].clause == t.clause:
                n = j + 1 + (toks[j + 1].text in ("the", "a", "an"))
                if n in parties:
                    doer = parties[n][0]
                break
            if toks[j].role not in skip and j not in parties and toks[j].text not in _PREPOSITIONS:
                break
            if toks[j].text in _PREPOSITIONS - {"to", "by"}:
                break
            j += 1
        if not doer:
            j = k - 1
            passive = False  # "X must be approved": X is approved, not approving
            while j >= 0 and toks[j].clause == t.clause:
                if j in parties:
                    first = parties[j][1]
                    if first == 0 or toks[first - 1].text not in _PREPOSITIONS or toks[first - 1].clause != t.clause:
                        if passive and not t.text.endswith("ing"):
                            receiver = receiver or parties[j][0]
                        else:
                            doer = parties[j][0]
                    break
                if toks[j].text in _BE or toks[j].text == "been":
                    passive = True
                if toks[j].role == "word" and j - 1 in parties:
                    j -= 1  # "the AP clerk": a common noun after a name heads the party's noun phrase
                    continue
                if toks[j].text in _COMPLEMENT_VERBS:
                    break  # "Meridian wants it paid": who wants is not who pays
                if toks[j].role == "action":
                    doer = doers.get(j, "")
                    break
                if " " in toks[j].text and "you" in toks[j].text.split():
                    break  # "if you would process": the one asked
                if toks[j].text == "to" and j == k - 1:
                    j -= 1
                    continue
                if toks[j].role not in skip or toks[j].text in _PREPOSITIONS:
                    break
                j -= 1
        doers[k] = doer
        if doer and doer not in ("you", "them"):  # "they" names whom the text named before: no one new
            out.add(f"{base} < {doer}")
        if receiver and receiver not in ("you", "them", doer):
            out.add(f"{base} > {receiver}")
    return out


def _directions(toks: list[_Token], v: _Vocabulary) -> set[str]:
    """Parties after "from" or "to": "delmar packaging from", "us from" ("the invoice we sent")."""
    out: set[str] = set()
    for j, (name, first) in _parties(toks, v).items():
        if j != first or first == 0 or name in ("you", "them"):
            continue
        prep = toks[first - 1].text.split()[-1]  # "received from us": the phrase ends in its preposition
        if prep == "from" or (prep in ("to", "into") and toks[first - 1].clause == toks[first].clause):
            out.add(f"{name} {'from' if prep == 'from' else 'to'}")
    return out


def _implied_directions(directions: set[str]) -> set[str]:
    """A request that never says where "we" stand is one we receive: the invoice comes to us."""
    return set() if any(d.startswith("us ") for d in directions) else {"us to"}


def _same_condition(values: list[str], conditions: set[str], display: dict[str, str]) -> None:
    """One reading for conditions that say the same: "don't pay unless X" is "pay only if X", "don't
    pay until X" is "pay once X", and "only" beside "if" or "once" adds nothing."""
    for word, canon in (("unless", "if"), ("until", "once"), ("before", "once")):
        negated = [i for i, v in enumerate(values) if v.startswith("not ")]
        if word in conditions and negated:
            values[negated[0]] = values[negated[0]][4:]
            conditions.discard(word)
            conditions.add(canon)
            display.setdefault(f"condition:{canon}", display.get(f"condition:{word}", canon))
    if "only" in conditions and conditions & {"if", "once", "unless", "when"}:
        conditions.discard("only")


# --- typos -------------------------------------------------------------------------------------


def _edit_distance(a: str, b: str, limit: int) -> int:
    """Optimal-string-alignment distance (a swap of two neighbours is one edit), capped at limit + 1."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        if min(cur) > limit:
            return limit + 1
        prev2, prev = prev, cur
    return prev[-1]


_WORD = re.compile(r"(?<![\w'-])[A-Za-z]+(?:'[A-Za-z]*)?(?![\w'-])")


def _shared_prefix(a: str, b: str) -> int:
    """How many letters two words share from their start ("move": 4 with "moved", 2 with "more")."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _allowed_edits(word: str) -> int:
    """Edits a misspelling of this length may carry: none under four letters (a "pay" one letter
    from "say" is another word), one up to eight, two beyond."""
    return 0 if len(word) < 4 else 1 if len(word) < 9 else 2


def correct_typos(original: str, variant: str, lexicon: DomainLexicon | None = None) -> str:
    """``variant`` with its misspelt words spelt as the original or the guard's lexicon spells them.

    Only letters are corrected, never a number, id or code (a typo there is another document);
    a word the guard knows, or that the original uses, is left as written. A candidate is a word
    of the original (preferred: a rewrite misspells what it rewrites) or of the lexicon within
    the edits its length allows, with the same first letter; three-letter words take one dropped
    letter ("frm") or one swap ("nto").
    """
    v = _vocabulary(_lexicons(lexicon))
    source = {re.sub(r"'s?$", "", w.lower()) for w in _WORD.findall(original)}
    pool = sorted(source) + sorted(v.known_words - source)

    def fix(m: re.Match[str]) -> str:
        raw = m.group(0)
        if "'" in raw:  # "don't", "Delmar's": a contraction is read as written; a possessive's stem is checked
            stem, _, tail = raw.partition("'")
            return raw if tail not in ("s", "") else fix_word(stem) + "'" + tail
        return fix_word(raw)

    def fix_word(raw: str) -> str:
        word = raw.lower()
        if word in v.known_words or word in source:
            return raw
        candidates = pool if len(word) >= 5 else sorted(source)  # a short word is likelier a word the guard lacks
        best, best_d = "", 3
        for cand in candidates:
            if cand[0] != word[0] and not (len(word) == 3 and sorted(cand) == sorted(word)):
                continue  # a different first letter is another word ("unprocessed" is not "processed")
            if len(word) == 3:
                ok = len(cand) >= 3 and (_edit_distance(word, cand, 1) == 1 and (
                    len(cand) == 4 or sorted(cand) == sorted(word)))
                d = 1 if ok else 3
            elif abs(len(word) - len(cand)) > 1:
                continue  # one slip drops or adds one letter: "Packing" is a word, not "Packaging" misspelt
            else:
                limit = _allowed_edits(max(word, cand, key=len))
                d = _edit_distance(word, cand, limit) if limit and len(cand) >= 4 else 3
                d = d if d <= limit else 3
            if d < best_d or (d == best_d < 3 and _shared_prefix(word, cand) > _shared_prefix(word, best)):
                best, best_d = cand, d  # at equal distance, the likelier slip keeps more of the word's start
        if not best:
            return raw
        return best.upper() if raw.isupper() and len(raw) > 1 else best.capitalize() if raw[0].isupper() else best

    # chatter stays as written: a corrected word could make "the printer is out of toner" a request
    return " ".join(s if _is_chatter(_parse_sentence(s, v)) else _WORD.sub(fix, s)
                    for s in _sentences(_normalise(variant, expand=False)))


# --- comparing -----------------------------------------------------------------------------------


def _pairs(kind: str, before: Iterable[str], after: Iterable[str], show_a: Callable[[str], str],
           show_b: Callable[[str], str]) -> list[str]:
    """'kind X became Y' for one-for-one swaps, else 'kind X dropped' / 'kind Y added'."""
    gone = sorted(Counter(before) - Counter(after))
    new = sorted(Counter(after) - Counter(before))
    out: list[str] = []
    while gone and new:
        out.append(f"{kind} {show_a(gone.pop(0))} became {show_b(new.pop(0))}")
    out += [f"{kind} {show_a(g)} dropped" for g in gone]
    out += [f"{kind} {show_b(n)} added" for n in new]
    return out


def _clauses(kind: str, before: Meaning, after: Meaning, a: frozenset[str], b: frozenset[str],
             quoted: set[str]) -> list[str]:
    out: list[str] = []
    for word in sorted(b - a):
        clause = after.show(f"{kind}:{word}").strip()
        if not any(clause in q or q in clause for q in quoted):
            quoted.add(clause)
            out.append(f"{kind} added: '{clause}'")
    for word in sorted(a - b):
        clause = before.show(f"{kind}:{word}").strip()
        if not any(clause in q or q in clause for q in quoted):
            quoted.add(clause)
            out.append(f"{kind} dropped: '{clause}'")
    return out


def _paid_before(redirect: str, before: Meaning) -> bool:
    """An added "to Delmar Packaging" whose destination the original already receives the action
    ("pay Delmar Packaging £7,480" against "pay £7,480 to Delmar Packaging"): the same payee."""
    destination = redirect.split(" ", 1)[1] if " " in redirect else ""
    return bool(destination) and any(r.endswith(" > " + destination) for r in before.roles)


def _same_payee(redirect: str, after: Meaning) -> bool:
    """A dropped "to Acme Ltd" whose destination the variant still names ("for Acme Ltd", "Acme Ltd's
    invoice") moved no money elsewhere: only its preposition changed."""
    destination = redirect.split(" ", 1)[1] if " " in redirect else ""
    return bool(destination) and (destination in after.entities or destination in after.terms)


_SPOKEN = {"obligation": "must {}", "permission": "may {}", "prohibition": "must not {}", "exemption": "need not {}"}


def _modality_swaps(before: Meaning, after: Meaning) -> list[tuple[str, str]]:
    """Actions whose verb stayed and whose modality changed, other than a plain negation (which
    reads as it always did: "action process became not process")."""
    gone = sorted(before.actions - after.actions)
    new = sorted(after.actions - before.actions)
    out: list[tuple[str, str]] = []
    for g in gone:
        g_mod, g_verb = _modality_of(g)
        for n in new:
            n_mod, n_verb = _modality_of(n)
            if n_verb == g_verb and {g_mod, n_mod} != {"obligation", "prohibition"}:
                out.append((g, n))
                new.remove(n)
                break
    return out


def _modality_changes(before: Meaning, after: Meaning) -> list[str]:
    """ "obligation 'must pay' became permission 'may pay'" for each action whose modality changed."""
    out = []
    for g, n in _modality_swaps(before, after):
        (g_mod, verb), (n_mod, _) = _modality_of(g), _modality_of(n)
        out.append(f"{g_mod} '{_SPOKEN[g_mod].format(verb)}' became {n_mod} '{_SPOKEN[n_mod].format(verb)}'")
    return out


@lru_cache(maxsize=1)
def _senses() -> dict[str, frozenset[int]]:
    """Each verb of the WordNet table (``_synonyms.py``) with the groups it is in."""
    from plumbline_otel.replay._synonyms import GROUPS

    out: dict[str, set[int]] = {}
    for i, group in enumerate(GROUPS):
        for w in group:
            out.setdefault(w, set()).add(i)
    return {w: frozenset(g) for w, g in out.items()}


def _verb_senses(form: str) -> frozenset[int]:
    """The WordNet groups of an inflected verb ("archives", "archived", "archiving" are "archive")."""
    senses = _senses()
    head, _, tail = form.partition(" ")
    stems = [head]
    for suffix, add in (("ies", "y"), ("ied", "y"), ("ing", ""), ("ing", "e"), ("es", ""), ("ed", ""), ("ed", "e"),
                        ("s", ""), ("d", "")):
        if head.endswith(suffix) and len(head) > len(suffix) + 2:
            stems.append(head[:-len(suffix)] + add)
    for stem in stems:
        lemma = f"{stem} {tail}" if tail else stem
        if lemma in senses:
            return senses[lemma]
    return frozenset()


def _unpaired_actions(before: Meaning, after: Meaning) -> tuple[list[str], list[str]]:
    """The actions left once modality changes are reported on their own. Two verbs no class knows,
    with the same modality, that share a common WordNet sense ("archive"/"file away") are one action."""
    swaps = _modality_swaps(before, after)
    was = [a for a in before.actions if a not in {g for g, _ in swaps}]
    now = [a for a in after.actions if a not in {n for _, n in swaps}]
    known = set(_vocabulary(_installed()).action_forms.values())
    for a in [a for a in was if a not in now]:
        modal_a, verb_a = _modality_of(a)
        if verb_a in known:
            continue
        for b in [b for b in now if b not in was]:
            modal_b, verb_b = _modality_of(b)
            if modal_a == modal_b and verb_b not in known and _verb_senses(verb_a) & _verb_senses(verb_b):
                now[now.index(b)] = a
                break
    return was, now


def _role_changes(before: Meaning, after: Meaning) -> list[str]:
    """Who does what to whom, where the two texts disagree.

    A doer the variant names for an action the original has is a change when the original names
    another doer or none ("Please ask Northwind Supplies to process …"); a variant that names no
    doer (a passive without "by") says less, not something else. A receiver changes only when both
    name one. A party that does an action in one text and receives it in the other ("X must
    approve" against "X must be approved") swapped roles; so did a party "from" in one text and
    "to" in the other.
    """
    def split(roles: frozenset[str]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
        doers: dict[str, set[str]] = {}
        receivers: dict[str, set[str]] = {}
        for r in roles:
            if " > " in r:
                base, party = r.split(" > ", 1)
                receivers.setdefault(base, set()).add(party)
            else:
                base, party = r.split(" < ", 1)
                doers.setdefault(base, set()).add(party)
        return doers, receivers

    verbs_before = {_base(a) for a in before.actions}
    b_doers, b_receivers = split(before.roles)
    a_doers, a_receivers = split(after.roles)
    out: list[str] = []
    for base in sorted(a_doers):
        if base not in verbs_before:
            continue
        new = sorted(a_doers[base] - b_doers.get(base, set()))
        old = sorted(b_doers.get(base, set()) - a_doers[base])
        if new and old:
            out.append(f"'{base}' by {', '.join(old)} became by {', '.join(new)}")
        elif new:
            out.append(f"'{base}' is now done by {', '.join(new)}")
    for base in sorted(set(a_doers) | set(b_doers)):
        for party in sorted((b_doers.get(base, set()) & a_receivers.get(base, set()))
                            | (b_receivers.get(base, set()) & a_doers.get(base, set()))):
            out.append(f"'{base}': {party} swapped doing and receiving it")
    for base in sorted(set(a_receivers) & set(b_receivers)):
        if a_receivers[base] != b_receivers[base]:
            out.append(f"'{base}' to {', '.join(sorted(b_receivers[base]))} became to "
                       f"{', '.join(sorted(a_receivers[base]))}")
    for d in sorted(after.directions ^ before.directions):
        party, side = d.rsplit(" ", 1)
        if side in ("against", "than") and party in before.identifiers & after.identifiers:
            out.append(f"'{side} {party}' {'added' if d in after.directions else 'dropped'}")
    for d in sorted(after.directions - before.directions):
        party, side = d.rsplit(" ", 1)
        other = f"{party} {'to' if side == 'from' else 'from'}"
        if other in before.directions and other not in after.directions:
            out.append(f"'{other.rsplit(' ', 1)[1]} {party}' became '{side} {party}'")
    return out


def _object_changes(before: Meaning, after: Meaning) -> list[str]:
    """An action done to other documents: both texts say which ids it is done to, and they differ
    ("apply it before anyone pays INV-0905" against "… pays INV-1013"). A text that does not say
    (a passive, "pay it") says less, not something else."""
    shared = before.identifiers & after.identifiers  # an id in one text only is reported as an id change

    def by_verb(objects: frozenset[str]) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for o in objects:
            verb, ident = o.split(" > ", 1)
            if ident in shared:
                out.setdefault(verb, set()).add(ident)
        return out

    was, now = by_verb(before.objects), by_verb(after.objects)
    return [f"'{verb}' of {', '.join(sorted(was[verb]))} became of {', '.join(sorted(now[verb]))}"
            for verb in sorted(set(was) & set(now)) if was[verb] != now[verb]]


def compare(before: Meaning, after: Meaning) -> list[str]:
    """What changed from ``before`` to ``after``, one phrase per change; empty when nothing did."""
    def shown(m: Meaning, prefix: str) -> Callable[[str], str]:
        return lambda k: f"'{m.show(prefix + k)}'"

    changes = _modality_changes(before, after)
    changes += _pairs("action", *_unpaired_actions(before, after), str, str)
    changes += [f"negation '{n}' {'added' if after.bare_negations.count(n) > before.bare_negations.count(n) else 'dropped'}"
                for n in sorted(set(before.bare_negations) | set(after.bare_negations))
                if before.bare_negations.count(n) != after.bare_negations.count(n)]
    changes += _pairs("identifier", before.identifiers, after.identifiers, str, str)
    q_before = [q.key for q in before.quantities]
    q_after = [q.key for q in after.quantities]
    money = {q.key for q in (*before.quantities, *after.quantities) if q.currency}
    changes += _pairs("amount", [k for k in q_before if k in money], [k for k in q_after if k in money], str, str)
    changes += _pairs("quantity", [k for k in q_before if k not in money], [k for k in q_after if k not in money],
                      str, str)
    changes += [f"currency {c} added" for c in sorted(after.currencies - before.currencies)]
    changes += [f"currency {c} dropped" for c in sorted(before.currencies - after.currencies)]
    changes += _pairs("date", before.dates, after.dates, shown(before, "date:"), shown(after, "date:"))
    changes += _pairs("entity", before.entities, after.entities, shown(before, "entity:"), shown(after, "entity:"))
    changes += [f"relation '{r}' added" for r in sorted(after.relations - before.relations)]
    changes += [f"relation '{r}' dropped" for r in sorted(before.relations - after.relations)]
    changes += [f"multiplicity '{m}' added" for m in sorted(after.multiplicity - before.multiplicity)]
    changes += [f"multiplicity '{m}' dropped" for m in sorted(before.multiplicity - after.multiplicity)]
    quoted: set[str] = set()
    changes += _clauses("condition", before, after, *_soft_conditions(before.conditions, after.conditions), quoted)
    changes += _clauses("fact", before, after, before.facts, after.facts, quoted)
    changes += list(dict.fromkeys(f"redirected: '{after.show('redirect:' + r)}'"
                                  for r in sorted(after.redirects - before.redirects) if not _paid_before(r, before)))
    changes += list(dict.fromkeys(f"redirection dropped: '{before.show('redirect:' + r)}'"
                                  for r in sorted(before.redirects - after.redirects) if not _same_payee(r, after)))
    changes += _role_changes(before, after)
    changes += _object_changes(before, after)
    changes += [f"order '{s}' reversed" for s in sorted(after.sequence)
                if " then ".join(reversed(s.split(" then "))) in before.sequence - after.sequence]
    for side in ("to", "from"):
        was = {c for c in before.correspondents if c.startswith(side + " ")}
        now = {c for c in after.correspondents if c.startswith(side + " ")}
        if was and now and was != now:
            changes.append(f"{'greeted' if side == 'to' else 'signed'} {', '.join(sorted(was))} became {', '.join(sorted(now))}")
    if after.disjunctions != before.disjunctions:
        more = after.disjunctions > before.disjunctions
        changes.append("connective 'and' became 'or'" if more else "connective 'or' became 'and'")
    changes += [f"{_MODAL_NAMES.get(m, m)} '{m}' {'added' if after.bare_modals.count(m) > before.bare_modals.count(m) else 'dropped'}"
                for m in sorted(set(before.bare_modals) | set(after.bare_modals))
                if before.bare_modals.count(m) != after.bare_modals.count(m)]
    if before.documents and after.documents and before.documents != after.documents:
        changes.append(f"document {', '.join(sorted(before.documents))} became {', '.join(sorted(after.documents))}")
    changes += [f"term '{t}' added" for t in sorted(after.terms - before.terms)]
    changes += [f"term '{t}' dropped" for t in sorted(before.terms - after.terms)]
    return changes


def protected_tokens(text: str, lexicon: DomainLexicon | None = None) -> dict[str, frozenset[str]]:
    """The normalised tokens of ``text`` by kind (identifiers, currencies, dates, amounts, …)."""
    m = read_meaning(text, lexicon=lexicon)
    dates = frozenset(d.split(" ", 1)[1] if " " in d and d.split(" ", 1)[0] in ("by", "before", "after", "on") else d
                      for d in m.dates)
    currencies = m.currencies | {q.unit for q in m.quantities if q.currency}
    return {"identifier": m.identifiers, "currency": frozenset(currencies), "date": dates,
            "amount": frozenset(q.plain for q in m.quantities), "entity": m.entities, "intent": m.actions,
            "negation": frozenset({str(len(m.bare_negations))} if m.bare_negations else ()),
            "relation": m.relations, "multiplicity": m.multiplicity, "condition": m.conditions, "fact": m.facts,
            "redirect": m.redirects}


@dataclass(frozen=True)
class GuardVerdict:
    """Whether a variant kept the task's meaning, and if not, what changed."""

    ok: bool
    changes: tuple[str, ...] = ()  # "amount 4820.00 GBP became 48200.00 GBP", …
    source: str = "rules"  # "rules" or "model"

    @property
    def reason(self) -> str | None:
        if self.ok:
            return None
        return "; ".join(self.changes) or "rejected"


EquivalenceModel = Callable[[str, str], GuardVerdict]


def check_equivalent(original: str, variant: str, model: EquivalenceModel | None = None,
                     lexicon: DomainLexicon | None = None) -> GuardVerdict:
    """Accept ``variant`` only if it means what ``original`` means.

    The rule guard decides first, reading English and the domain's ``lexicon`` (by default every
    installed domain's); when it accepts and a ``model`` check is configured, the model must
    accept too (it can only reject more).
    """
    corrected = correct_typos(original, variant, lexicon)
    names = name_words(original, corrected)
    changes = compare(read_meaning(original, names, lexicon), read_meaning(corrected, names, lexicon))
    if changes:
        return GuardVerdict(False, tuple(changes))
    if model is not None:
        return model(original, variant)
    return GuardVerdict(True)


class ModelEquivalenceCheck:
    """A model's reading beside the rules: used only when a model is configured (``--paraphrase-model``).

    ``client`` is an ``anthropic.Anthropic``-like client (``client.messages.create``). A failed
    call or an answer that is not a verdict rejects the variant: the check errs the way the rules do.
    """

    name = "anthropic"
    SYSTEM = (
        "You check whether a rewritten accounts-payable request means exactly what the original means. "
        "It does NOT if it changes or adds: an action or its polarity (stop, cancel, hold, void, reject, pay, "
        "approve instead of process; a negation); how many times or how many documents (twice, both, all, "
        "again); a condition or override (even if, regardless, skip a check); an asserted fact that could "
        "pre-empt a check (already verified, approved, received); an amount, quantity, currency or unit; an id; "
        "a date or deadline; the vendor or a related party (parent company, affiliate, another vendor); where "
        "the payment or document goes. Politeness, greetings, word order, synonyms of the same action, letter "
        "case, punctuation, passive voice and reformatted amounts or dates do not change the meaning. "
        'Answer with only JSON: {"equivalent": true|false, "changes": ["what changed", ...]}.')

    def __init__(self, client: Any, model: str, max_tokens: int = 300) -> None:
        self.client, self.model, self.max_tokens = client, model, max_tokens

    def __call__(self, original: str, variant: str) -> GuardVerdict:
        try:
            response = self.client.messages.create(
                model=self.model, max_tokens=self.max_tokens, system=self.SYSTEM,
                messages=[{"role": "user", "content": json.dumps({"original": original, "rewrite": variant})}])
            raw = "".join(getattr(b, "text", "") for b in response.content).strip()
        except Exception as exc:  # the model is a second opinion; without one the variant is not run
            return GuardVerdict(False, (f"model check failed: {type(exc).__name__}: {exc}",), "model")
        raw = re.sub(r"^```(?:json)?|```$", "", raw).strip()
        start, end = raw.find("{"), raw.rfind("}")
        try:
            answer = json.loads(raw[start:end + 1]) if 0 <= start < end else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or not isinstance(answer.get("equivalent"), bool):
            return GuardVerdict(False, (f"model check gave no verdict: {raw[:120]!r}",), "model")
        if answer["equivalent"]:
            return GuardVerdict(True, (), "model")
        changes = [str(c) for c in answer.get("changes") or [] if str(c).strip()] or ["meaning changed"]
        return GuardVerdict(False, tuple(f"model: {c}" for c in changes), "model")
