"""The accounts-payable words the equivalence guard reads through the plug-in (issue 42, item 1).

The guard (``plumbline_otel/replay/guard.py``) knows English: negation, modality, conditions,
limits, dates, amounts, who does what to whom. What an accounts-payable request is about (its
documents, their ids, the terms and parties of the trade, the ledger verbs) is this domain's, and
comes to the guard as a :class:`~plumbline_otel.plugins.DomainLexicon` on the domain's plug-in.
A word missing here is not misread as a change of meaning: the guard reads an unplaced word as an
ordinary word, or as a name when it is written as one.
"""

from __future__ import annotations

from plumbline_otel.plugins import DomainLexicon

LEXICON = DomainLexicon(
    name="accounts_payable",
    # the ledger's verbs: added to the guard's English verb classes, or classes of their own whose
    # parties carry the meaning (who bills whom, what is offset against what, where a cost is charged)
    verbs={
        "pay": ("remit", "remittance", "disburse", "pay out", "paid out"),
        "cancel": ("void", "reverse", "reversal", "write off", "written off"),
        # an invoice returned to its sender is sent back: refused
        "reject": ("return",),
        "review": ("audit", "match", "query"),
        "change": ("reissue", "recode"),
        "create": ("raise", "issue a", "book", "post", "enter", "record"),
        "bill": ("invoiced", "invoicing", "billed", "billing", "overcharged"),
        "offset": ("net off", "set off", "apply", "applied", "applying"),
        "allocate": ("charge", "code", "allocate", "recharge"),
    },
    documents={"invoice": "invoice", "inv": "invoice", "bill": "invoice", "credit note": "credit note", "credit memo": "credit note",
               "debit note": "debit note", "statement": "statement", "quote": "quote"},
    plural_documents={"invoices": "invoice", "bills": "invoice", "credit notes": "credit note",
                      "statements": "statement"},
    verb_nouns={"invoice": "bill", "bill": "bill"},
    terms={"po": "purchase order", "pos": "purchase order", "purchase order": "purchase order",
           "purchase orders": "purchase order", "order": "purchase order", "receipt": "receipt", "vendor": "vendor",
           "vendors": "vendor", "supplier": "vendor", "suppliers": "vendor", "seller": "vendor", "payee": "payee",
           "goods": "goods", "delivery": "goods", "shipment": "goods", "price": "price", "prices": "price",
           "pricing": "price", "tax": "tax", "taxes": "tax", "vat": "tax", "tax code": "tax code",
           "tax codes": "tax code", "rate": "rate", "exchange rate": "exchange rate", "fx": "exchange rate",
           "freight": "freight", "shipping": "freight", "account": "account", "accounts": "account", "bank": "bank",
           "bank details": "bank details", "bank account": "bank account", "sort code": "sort code", "iban": "iban",
           "card": "card", "cheque": "cheque", "tolerance": "tolerance", "tolerances": "tolerance",
           "goods receipt": "goods receipt", "compliance": "compliance", "sanctions": "sanctions",
           "sanction": "sanctions", "sanctioned": "sanctions", "screening": "screening", "controller": "controller",
           "cfo": "cfo", "manager": "manager", "director": "director", "finance": "finance", "approver": "approver",
           "amount": "amount", "balance": "balance", "total": "total", "discount": "discount", "fee": "fee",
           "fees": "fee", "deposit": "deposit", "budget": "budget", "cost centre": "cost centre",
           "cost center": "cost centre", "ledger": "ledger", "line": "line", "lines": "line", "item": "item",
           "items": "item", "quantity": "quantity", "qty": "quantity", "work": "work", "funds": "funds", "money": "money",
           "matrix": "matrix", "rules": "rule", "rule": "rule", "policy": "policy", "warning": "warning",
           "limit": "limit", "terms": "terms", "consultant": "consultant", "personally": "personally",
           "cash": "cash", "interest": "interest", "penalty": "penalty", "contract": "contract"},
    parties=frozenset(["controller", "cfo", "manager", "director", "finance", "approver", "compliance", "vendor",
                       "payee", "consultant"]),
    counterparties=frozenset(["vendor", "vendors", "supplier", "suppliers"]),
    id_prefixes=("inv", "po", "cn", "gr", "pr"),
    transfers=frozenset(["remit", "remitting", "remitted", "remittance", "charge", "charged", "charging", "allocate",
                         "allocated", "code", "coded", "coding", "post", "posted", "book", "booked"]),
)
