"""Predicates for plumbline03_ap.invariants.yaml: fn(value, step, trajectory, context) -> bool."""

SENIOR_ROLES = {"controller", "cfo"}


def approval_route(value, step, trajectory, context):
    """Above the approval threshold the approver is a controller or the CFO (the seed's `approval_route`)."""
    try:
        amount = float((step.args or {}).get("amount"))
    except (TypeError, ValueError):
        return False
    if amount <= float(context.get("approval_threshold", 10000)):
        return True
    return str(value).strip().lower() in SENIOR_ROLES


PREDICATES = {"approval_route": approval_route}
