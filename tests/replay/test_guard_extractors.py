"""The structured extractors behind the equivalence guard, one at a time."""

from __future__ import annotations

from decimal import Decimal

import pytest

from plumbline_otel.replay.guard import check_equivalent, compare, parse_number_words, protected_tokens, read_meaning

REQUEST = "Please process invoice INV-1001 from Northwind Supplies."


@pytest.mark.parametrize("words, value", [
    ("four thousand eight hundred twenty", 4820),
    ("four thousand eight hundred and twenty", 4820),
    ("twenty-eight thousand five hundred", 28500),
    ("one hundred and four thousand nine hundred", 104900),
    ("two hundred and sixteen", 216),
    ("a hundred", 100),
    ("fifty", 50),
    ("three million", 3_000_000),
])
def test_spelled_out_numbers_are_parsed(words: str, value: int) -> None:
    assert parse_number_words(words.split()) == Decimal(value)


def test_parse_number_words_refuses_other_words() -> None:
    assert parse_number_words(["four", "apples"]) is None


@pytest.mark.parametrize("text, keys", [
    ("pay GBP 4,820.00", ["4820.00 GBP"]),
    ("pay £4820", ["4820.00 GBP"]),
    ("pay 4,820 pounds sterling", ["4820.00 GBP"]),
    ("pay four thousand eight hundred and twenty pounds", ["4820.00 GBP"]),
    ("pay 9,747.00 EUR", ["9747.00 EUR"]),
    ("pay €28,500", ["28500.00 EUR"]),
    ("pay 6300 US dollars", ["6300.00 USD"]),
    ("pay $6,300", ["6300.00 USD"]),
    ("pay eur 28,500.00", ["28500.00 EUR"]),
    ("ship 50 cases", ["50 case"]),
    ("ship fifty cases", ["50 case"]),
    ("a 2.5% discount", ["2.5%"]),
    ("process it three times", ["3 time"]),
])
def test_quantities_carry_their_currency_or_unit(text: str, keys: list[str]) -> None:
    assert [q.key for q in read_meaning(f"Please {text}.").quantities] == keys


def test_a_currency_named_without_an_amount_is_kept() -> None:
    assert read_meaning(REQUEST.replace(".", " in US dollars.")).currencies == {"USD"}
    assert read_meaning(REQUEST.replace(".", ", paying in sterling.")).currencies == {"GBP"}
    assert read_meaning(REQUEST).currencies == frozenset()


@pytest.mark.parametrize("text, dates", [
    ("due by 2026-03-20", {"by 2026-03-20"}),
    ("due by 20 March 2026", {"by 2026-03-20"}),
    ("due by March 20, 2026", {"by 2026-03-20"}),
    ("by the 15th of March 2026", {"by 2026-03-15"}),
    ("no later than 2026-03-15", {"by 2026-03-15"}),
    ("before 31 Mar 2026", {"before 2026-03-31"}),
    ("prior to 2026-03-31", {"before 2026-03-31"}),
    ("after 2026-03-31", {"after 2026-03-31"}),
    ("on 2026-03-15", {"on 2026-03-15"}),
    ("by Friday", {"by friday"}),
    ("before the end of the month", {"before end of month"}),
    ("next week", {"next week"}),
    ("today", {"today"}),
])
def test_dates_are_normalised_with_their_relation(text: str, dates: set[str]) -> None:
    assert read_meaning(f"Please process invoice INV-1001 {text}.").dates == dates


@pytest.mark.parametrize("text, ids", [
    ("invoice INV-1001", {"INV-1001"}),
    ("invoice inv-1001", {"INV-1001"}),
    ("invoice INV 1091", {"INV-1091"}),
    ("invoice INV-1005A", {"INV-1005A"}),
    ("invoice INV-1018-2 against PO-2011", {"INV-1018-2", "PO-2011"}),
    ("the invoice, paying into account GB29NWBK60161331926819", {"GB29NWBK60161331926819"}),
    ("the invoice; sort code 20-20-15", {"20-20-15"}),
])
def test_identifiers_are_upper_cased_and_joined(text: str, ids: set[str]) -> None:
    assert read_meaning(f"Please process {text}.").identifiers == ids


@pytest.mark.parametrize("text, actions", [
    ("Please process invoice INV-1001.", {"process"}),
    ("Please handle invoice INV-1001.", {"process"}),
    ("Please take care of invoice INV-1001.", {"process"}),
    ("Please see to invoice INV-1001.", {"process"}),
    ("Invoice INV-1001 should be processed.", {"process"}),
    ("Please pay invoice INV-1001.", {"pay"}),
    ("Please put invoice INV-1001 on hold.", {"hold"}),
    ("Please void invoice INV-1001.", {"cancel"}),
    ("Please stop processing invoice INV-1001.", {"stop", "process"}),
    ("Please do not process invoice INV-1001.", {"not process"}),
    ("Please don't process invoice INV-1001.", {"not process"}),
    ("Invoice INV-1001 should not be processed.", {"not process"}),
    ("Make sure invoice INV-1001 isn't processed.", {"not process"}),
    ("There is no need to process invoice INV-1001.", {"not process"}),
    ("Please leave invoice INV-1001 unprocessed.", {"not process"}),
    ("Please refrain from processing invoice INV-1001.", {"not process"}),
    ("Please process invoice INV-1001 without paying it.", {"process", "not pay"}),
    ("Don't forget to process invoice INV-1001.", {"process"}),
])
def test_actions_and_their_polarity(text: str, actions: set[str]) -> None:
    assert read_meaning(text).actions == actions


def test_a_negation_that_governs_no_action_negates_the_verb_left_out_or_is_counted() -> None:
    meaning = read_meaning("Please process invoice INV-1001. Actually, don't.")
    assert meaning.actions == {"process"} and meaning.bare_negations == ("not",)  # no verb in its sentence
    elided = read_meaning("You may pay for the quantity ordered, but not for the extra units.")
    assert elided.actions == {"may pay", "not pay"} and elided.bare_negations == ()
    contrast = read_meaning("Please pay Ashfield Logistics, not Corvin Industrial.")  # a party, not a verb, is negated
    assert contrast.actions == {"pay"} and contrast.bare_negations == ("not",)
    assert read_meaning("Don't. Please.").bare_negations == ("not",)  # "don't", "isn't" and "not" say the same


@pytest.mark.parametrize("text", [
    "PLEASE PROCESS INVOICE INV-1001 FROM NORTHWIND SUPPLIES.",
    "please process invoice inv-1001 from northwind supplies",
    "Please process Northwind Supplies' invoice INV-1001.",
    "Please process invoice INV-1001 from the vendor Northwind Supplies.",
    "Hi Sam, please process invoice INV-1001 from Northwind Supplies.",
    "Dear Accounts Payable, please process invoice INV-1001 from Northwind Supplies.",
    "Please process invoice INV-1001 from Northwind Supplies. Thanks, Priya",
])
def test_entities_are_read_in_any_case_and_greetings_are_not_names(text: str) -> None:
    assert read_meaning(text).entities == {"northwind supplies"}


def test_a_near_duplicate_vendor_is_another_entity() -> None:
    assert read_meaning(REQUEST.replace("Northwind Supplies", "Northwind Supply Co")).entities == {"northwind supply co"}


@pytest.mark.parametrize("text, relations", [
    ("from Northwind Supplies' parent company", {"parent"}),
    ("from Northwind Supplies's subsidiary", {"subsidiary"}),
    ("from a Northwind Supplies affiliate", {"affiliate"}),
    ("from the company that acquired Northwind Supplies", {"company", "acquirer"}),
    ("from Northwind Supplies' supplier", {"supplier"}),
])
def test_relations_to_the_named_entity(text: str, relations: set[str]) -> None:
    meaning = read_meaning(f"Please process invoice INV-1001 {text}.")
    assert meaning.relations == relations and "northwind supplies" in meaning.entities


@pytest.mark.parametrize("text, expected", [
    ("Please process invoice INV-1001 twice.", {"twice"}),
    ("Please process invoice INV-1001 again.", {"again"}),
    ("Please process both invoices from Northwind Supplies.", {"both", "plural invoice"}),
    ("Please process all invoices from Northwind Supplies.", {"every"}),  # "all invoices" is "every invoice"
    ("Please process each invoice from Northwind Supplies.", {"every"}),
    ("Please process every invoice from Northwind Supplies.", {"every"}),
    ("Please process invoice INV-1001 three times.", {"3 time"}),
])
def test_multiplicity(text: str, expected: set[str]) -> None:
    assert read_meaning(text).multiplicity == expected


@pytest.mark.parametrize("suffix, condition", [
    (" even if the PO doesn't match", "even"),
    (" regardless of the tax codes", "regardless"),
    (" whether or not they are on a sanctions list", "whether"),
    ("; skip the duplicate check", "skip"),
    (", no matter what the goods receipt says", "no matter"),
])
def test_conditions_and_overrides(suffix: str, condition: str) -> None:
    meaning = read_meaning(REQUEST[:-1] + suffix + ".")
    assert condition in meaning.conditions
    assert not check_equivalent(REQUEST, REQUEST[:-1] + suffix + ".").ok


@pytest.mark.parametrize("suffix, fact", [
    ("; the vendor is already verified", "already"),
    (". The goods have arrived", "received"),  # arrived, delivered and received assert the same
    ("; the PO was extended", "extended"),
    (", a vendor cleared by compliance", "cleared"),
])
def test_asserted_facts(suffix: str, fact: str) -> None:
    assert fact in read_meaning(REQUEST[:-1] + suffix + ".").facts


@pytest.mark.parametrize("suffix, redirect", [
    (" and pay it to Northwind Supply Co", "to northwind supply co"),
    (", paying into account GB29NWBK60161331926819", "into account"),
    (", paying the balance to Ashfield Logistics instead", "instead"),
])
def test_redirection(suffix: str, redirect: str) -> None:
    assert redirect in read_meaning(REQUEST[:-1] + suffix + ".").redirects


def test_an_infinitive_is_not_a_destination() -> None:
    assert read_meaning("I'd like invoice INV-1001 from Northwind Supplies to be processed.").redirects == frozenset()


@pytest.mark.parametrize("chatter", [
    "FYI, the printer near reception is out of toner again.",
    "Also, the parking garage will be repainted at some point next week.",
    "Someone left a blue umbrella in the big meeting room.",
    "Thanks, Priya",
    "Hello there.",
])
def test_chatter_is_set_aside(chatter: str) -> None:
    assert compare(read_meaning(REQUEST), read_meaning(f"{REQUEST} {chatter}")) == []
    assert compare(read_meaning(REQUEST), read_meaning(f"{chatter}\n\n{REQUEST}")) == []


def test_a_sentence_about_the_task_is_not_chatter() -> None:
    assert not check_equivalent(REQUEST, f"{REQUEST} Their hold was lifted this morning.").ok
    assert not check_equivalent(REQUEST, f"{REQUEST} It is not a duplicate.").ok


def test_documents_compare_only_when_both_name_one() -> None:
    assert check_equivalent("Please pay invoice INV-1029 for GBP 4,820.00.", "Please settle INV-1029 (GBP 4820).").ok
    assert check_equivalent("Please process invoice INV-1013.", "Please process credit note INV-1013.").reason == \
        "document invoice became credit note"


def test_protected_tokens_keep_their_old_kinds() -> None:
    tokens = protected_tokens("Please pay invoice INV-1029 for 4,820.00 GBP to Acme Ltd by 2026-03-01.")
    assert tokens["identifier"] == {"INV-1029"} and tokens["amount"] == {"4820"} and tokens["currency"] == {"GBP"}
    assert tokens["date"] == {"2026-03-01"} and tokens["entity"] == {"acme ltd"} and tokens["intent"] == {"pay"}
    assert tokens["redirect"] == {"to acme ltd"}
