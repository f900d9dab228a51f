"""Typed comparison: one set of rules for every analysis."""

from datetime import date, datetime, timezone

from plumbline_otel.compare_values import Rule, canonical, compare, equal, rule_from


def test_identifiers_compare_after_trimming_and_case_folding():
    assert equal("INV-1029", " inv-1029 ", "identifier")
    assert not equal("INV-1029", "INV-1092", "identifier")


def test_text_also_collapses_internal_whitespace():
    assert equal("Price  variance", " price variance", "text")
    assert not equal("Price  variance", " price variance", "identifier")


def test_numbers_are_exact_without_a_tolerance_and_name_a_power_of_ten_slip():
    result = compare(4820.00, 48200.00, "number")
    assert not result.equal
    assert "10× too large" in result.detail
    assert "100× too small" in compare(4820, 48.2, "number").detail
    assert not equal(100, 100.001, "number")


def test_numbers_within_a_declared_tolerance_are_equal():
    rule = {"type": "number", "tolerance": 0.005}
    assert equal(4820, 4820.004, rule)
    assert not equal(4820, 4820.006, rule)
    assert "beyond the tolerance" in compare(4820, 4820.006, rule).detail
    assert equal(1000, 1009, {"type": "number", "rel_tolerance": 0.01})


def test_numeric_strings_parse_as_numbers_when_the_type_is_number():
    assert equal("4820.00", 4820, "number")
    assert equal("4,820.00", "4820", "number")
    assert equal("$4820", 4820.0, "number")
    assert not equal("48,200.00", 4820, "number")
    assert "not a number" in compare(4820, "four thousand", "number").detail


def test_booleans_are_not_numbers():
    assert not equal(1, True, "number")


def test_dates_compare_as_dates():
    assert equal("2024-03-01", date(2024, 3, 1), "date")
    assert equal("2024-03-01", "2024-03-01T23:59:00Z", "date")
    assert equal(datetime(2024, 3, 1, 12, tzinfo=timezone.utc), "2024-03-01T13:00:00+01:00", "datetime")
    assert not equal("2024-03-01", "2024-03-02", "date")
    assert "not a date" in compare("2024-03-01", "next tuesday", "date").detail


def test_sets_ignore_order_and_lists_do_not():
    assert equal(["a", "b", "c"], ["C", "a", "b"], "set")
    assert not equal(["a", "b"], ["b", "a"], "list")
    detail = compare(["a", "b"], ["a", "z"], "set").detail
    assert "missing 'b'" in detail and "unexpected 'z'" in detail


def test_dict_comparison_ignores_listed_fields_and_types_fields():
    rule = rule_from({"type": "dict", "ignore": ["note"], "fields": {"amount": {"type": "number", "tolerance": 0.01}}})
    assert equal({"amount": 10, "note": "x"}, {"amount": "10.001", "note": "y"}, rule)
    result = compare({"amount": 10, "id": "A"}, {"amount": 10, "extra": 1}, rule)
    assert {d.path for d in result.differences} == {"id", "extra"}


def test_auto_rule_follows_the_expected_value():
    assert equal("PAY", " pay ")
    assert equal(12, "12.0")
    assert not equal(True, "true")
    assert equal({"a": [1, 2]}, {"a": [1.0, 2.0]})


def test_canonical_form_agrees_with_equality():
    assert canonical({"id": "INV-1", "amount": 10.0}) == canonical({"amount": 10, "id": " inv-1"})
    assert canonical(["b", "a"], Rule(type="set")) == canonical(["a", "b"], Rule(type="set"))


def test_bad_rules_are_rejected_with_a_reason():
    import pytest

    with pytest.raises(ValueError, match="unknown type"):
        rule_from("money")
    with pytest.raises(ValueError, match="tolerance"):
        rule_from({"type": "number", "tolerance": -1})
