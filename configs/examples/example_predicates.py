"""Predicates for invoice_payments.invariants.yaml: fn(value, step, trajectory, context) -> bool."""

RANKS = {"clerk": 0, "manager": 1, "controller": 2, "cfo": 3}


def approver_has_authority(value, step, trajectory, context):
    """The approver's rank reaches the rank the invoice's amount band requires; unknown roles fail."""
    rank = RANKS.get(str(value).strip().lower())
    return rank is not None and rank >= int(context.get("required_rank", 0))


PREDICATES = {"approver_has_authority": approver_has_authority}
