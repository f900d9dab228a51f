"""Public names stay importable, and the reference domain's spec loads with this loader."""

from pathlib import Path

import pytest

import plumbline_otel.report as report
import plumbline_otel.spec as spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", [spec, report])
def test_all_lists_exactly_what_is_importable(module):
    public = {n for n in vars(module) if not n.startswith("_") and not isinstance(getattr(module, n), type(spec))}
    assert set(module.__all__) == public - {"annotations"}


def test_the_reference_domain_spec_loads():
    loaded = spec.load_spec(ROOT / "configs" / "accounts_payable.invariants.yaml")
    assert len(set(loaded.ids)) == len(loaded.ids) > 0
    assert all(inv.severity in spec.SEVERITIES for inv in loaded.invariants)
