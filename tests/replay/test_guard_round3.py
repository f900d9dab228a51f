"""The guard's third round on issue 38 item 5: mechanisms that compare meaning, one per test.

Each test pairs a paraphrase the mechanism lets through with a meaning change it must still
catch (or the other way round), with sentences written for the mechanism, not taken from a
corpus, so that removing the mechanism fails one side.
"""

from __future__ import annotations

import pytest

from plumbline_otel.replay.guard import check_equivalent


def ok(original: str, variant: str) -> bool:
    return check_equivalent(original, variant).ok


def reason(original: str, variant: str) -> str:
    return check_equivalent(original, variant).reason or ""


# --- limits: one canonical form (comparator, inclusive or not, value, currency) ----------------

UP_TO = "Approve invoices from Acme Ltd up to £500."


@pytest.mark.parametrize("variant", [
    "Approve invoices from Acme Ltd of less than or equal to £500.",
    "Approve invoices from Acme Ltd that are at or below £500.",
    "Approve invoices from Acme Ltd of equal to or less than £500.",
    "Approve invoices from Acme Ltd within a £500 limit.",
    "Approve invoices from Acme Ltd inside £500.",
    "Approve invoices from Acme Ltd not exceeding £500.",
    "Approve invoices from Acme Ltd capped at £500.",
    "Approve invoices from Acme Ltd of £500 or less.",
])
def test_an_inclusive_upper_limit_said_any_way_is_one_limit(variant: str) -> None:
    assert ok(UP_TO, variant), reason(UP_TO, variant)


@pytest.mark.parametrize("variant, change", [
    ("Approve invoices from Acme Ltd under £500.", "amount <= 500.00 GBP became < 500.00 GBP"),
    ("Approve invoices from Acme Ltd of at least £500.", "amount <= 500.00 GBP became >= 500.00 GBP"),
    ("Approve invoices from Acme Ltd at or above £500.", "amount <= 500.00 GBP became >= 500.00 GBP"),
    ("Approve invoices from Acme Ltd upwards of £500.", "amount <= 500.00 GBP became > 500.00 GBP"),
])
def test_a_limit_of_another_direction_or_strictness_is_a_change(variant: str, change: str) -> None:
    assert reason(UP_TO, variant) == change


def test_a_lone_one_before_a_unit_is_a_number() -> None:
    original = "Pay INV-1003 net of the 1% discount."
    assert ok(original, "Pay INV-1003 net of the one percent discount.")
    assert not ok(original, "Pay INV-1003 net of the two percent discount.")
    assert ok("Pay this one today.", "Please pay this one today.")


# --- text said two ways --------------------------------------------------------------------------

def test_instead_of_and_rather_than_are_one_contrast_and_its_sides_are_kept() -> None:
    original = "Vendors should invoice against the new PO rather than PO-2015."
    assert ok(original, "Vendors should invoice against the new PO instead of PO-2015.")
    assert not ok("Pay the vendor in USD rather than EUR.", "Pay the vendor in EUR rather than USD.")


def test_a_negative_determiner_after_a_preposition_is_a_negated_phrase() -> None:
    original = "Apply credit note CN-7 against INV-0905, not against any other invoice."
    assert ok(original, "Apply credit note CN-7 against INV-0905 and against no other invoice.")
    assert not ok(original, "Apply credit note CN-7 against INV-0905 and against any other invoice.")


def test_not_until_is_only_after() -> None:
    original = "Change the bank details only after a call-back has been made."
    assert ok(original, "Change the bank details, but not until a call-back has been made.")
    assert not ok(original, "Change the bank details, but not before a call-back has been made to the CFO.")


def test_and_not_otherwise_restricts_to_the_condition_as_only_does() -> None:
    original = "Approve INV-1011 only if Sam confirms the rate in writing."
    assert ok(original, "Approve INV-1011 if Sam confirms the rate in writing, and not otherwise.")
    assert not ok(original, "Approve INV-1011 even if Sam confirms the rate in writing.")


def test_contracted_has_before_a_participle_with_an_object() -> None:
    original = "Hold INV-1007 unless the controller signs off on the variance."
    assert ok(original, "Hold INV-1007 unless the controller's signed off on the variance.")
    assert ok("Hold INV-1007 unless Sam confirms the drop.", "Hold INV-1007 unless Sam's confirmed the drop.")
    assert not ok(original, "Hold INV-1007 even if the controller's signed off on the variance.")


def test_an_event_awaited_after_after_is_an_action_not_a_fact() -> None:
    original = "Pay INV-1001 once Priya Shah has approved it."
    assert ok(original, "Pay INV-1001 after Priya Shah has approved it.")
    assert not ok(original, "Pay INV-1001 after Priya Shah has reviewed it.")


def test_a_list_s_count_is_its_shape_and_a_bracketed_aside_after_a_sign_off_stands_alone() -> None:
    original = "Hi Sam,\n\nTwo things:\n1. Review INV-1003.\n2. Then pay it.\n\nThanks, Elena\n(PS: the printer is fixed)"
    assert ok(original, "Hi Sam, please review INV-1003 and then pay it. Thanks, Elena (PS: the printer is fixed)")
    assert not ok(original, "Hi Sam, please review INV-1003 and then hold it. Thanks, Elena (PS: the printer is fixed)")


def test_a_weekday_s_abbreviation_is_the_weekday() -> None:
    original = "Pay INV-1001 by Friday 20 March 2026."
    assert ok(original, "Pay INV-1001 by Fri 20/03/2026.")
    assert not ok(original, "Pay INV-1001 by Fri 27/03/2026.")


def test_a_handle_opening_a_message_is_whom_it_asks() -> None:
    original = "@tom can u pay INV-1019 today? thx"
    assert ok(original, "Tom, could you please pay INV-1019 today? Thank you.")
    assert reason(original, "@priya can u pay INV-1019 today? thx") == "greeted to tom became to priya"
    assert ok("hi team can u schedule payment of GBP 2340 for INV-1001", "Hi team, can you schedule payment of £2,340 for INV-1001?")


# --- who does what to whom ------------------------------------------------------------------------

def test_the_branch_an_action_is_in_is_kept() -> None:
    original = "If the duplicate score for INV-1010 is 0.9 or more, hold it; otherwise pay it."
    assert reason(original, "If the duplicate score for INV-1010 is 0.9 or more, pay it; otherwise hold it.") == \
        "otherwise-branch action pay became hold"
    assert ok(original, "If the duplicate score for INV-1010 is 0.9 or more, hold it. If not, pay it.")
    assert ok(original, "Pay INV-1010 unless the duplicate score is 0.9 or more, in which case hold it.")


def test_whom_a_party_is_asked_by_in_the_passive_is_the_asker() -> None:
    original = "Sam Reid should ask Ana Lima to approve INV-1012."
    assert reason(original, "Sam Reid should be asked by Ana Lima to approve INV-1012.") == \
        "'approve' by ana lima became by sam reid"
    assert ok(original, "Ana Lima should be asked by Sam Reid to approve INV-1012.")


def test_the_party_after_an_action_noun_s_from_does_it() -> None:
    original = "Sam Reid needs to request approval from the controller for INV-1002."
    assert reason(original, "The controller needs to request approval from Sam Reid for INV-1002.") == \
        "'approve' by controller became by sam reid"
    assert ok("Request approval for INV-1003 from Ana Lima.", "Ask Ana Lima to approve INV-1003.")


def test_parties_joined_by_or_share_the_role() -> None:
    original = "Either Ana Lima or Sam Reid can approve INV-1001."
    assert ok(original, "INV-1001 can be approved by Ana Lima or Sam Reid.")
    assert not ok(original, "INV-1001 can be approved by Ana Lima or the controller.")


def test_they_stands_for_a_party_named_but_never_for_us() -> None:
    original = "Northwind Supplies may resend INV-1008, but we must not pay it twice."
    assert reason(original, original.replace("we must", "they must")) == "'pay' by us became by them"
    said = "Corvin Industrial says they owe us €1,200."
    assert reason(said, "Corvin Industrial says we owe them €1,200.") == \
        "'owe' by them became by us; 'owe': them swapped doing and receiving it; " \
        "'owe': us swapped doing and receiving it; 'owe' to us became to them"
    assert ok("Corvin Industrial owes us €1,200.", "Corvin Industrial owes us €1,200, they say.")


# --- modality attached to the right action; limits bound to who acts ------------------------------

def test_a_modal_before_a_limit_belongs_to_the_limit() -> None:
    original = "The payment may not exceed £10,000."
    for variant in ("The payment can be at most £10,000.", "The payment must stay within £10,000.",
                    "The payment should not go over £10,000."):
        assert ok(original, variant), reason(original, variant)
    assert reason(original, "The payment can be at least £10,000.") == "amount <= 10000.00 GBP became >= 10000.00 GBP"
    assert reason("Hold INV-1010 if the score is 0.7 or more.", "Hold INV-1010 if the score reaches 0.8.") == \
        "quantity >= 0.7 became >= 0.8"


def test_a_modal_s_reach_ends_where_a_condition_opens() -> None:
    original = "You may pay INV-1017 up to £3,000 without further approval."
    assert ok(original, "INV-1017 may be paid up to £3,000 without further approval.")
    assert ok("No single payment may exceed £10,000 unless the controller approves it.",
              "No single payment may go above £10,000 unless the controller has approved it.")
    assert not ok(original, "You must pay INV-1017 up to £3,000 without further approval.")


def test_any_every_and_a_plural_state_one_rule_and_this_one_does_not() -> None:
    original = "The controller must approve any Hansa Technik payment over €10,000."
    assert ok(original, "The controller must approve every Hansa Technik payment over €10,000.")
    assert ok(original, "Hansa Technik payments over €10,000 must be approved by the controller.")
    assert reason(original, "The controller must approve this Hansa Technik payment of over €10,000.") == \
        "multiplicity 'every' dropped"


def test_an_action_noun_after_a_verb_is_its_object_not_a_second_act() -> None:
    original = "Any payment over £5,000 must be approved by the controller."
    assert ok(original, "The controller must approve payments of more than £5,000.")
    assert not ok(original, "Payments of more than £5,000 must approve the controller.")


def test_who_acts_within_which_limit_is_kept() -> None:
    original = "Ana Lima approves payments up to £25,000; Sam Reid approves anything above that."
    swapped = "Sam Reid approves payments up to £25,000; Ana Lima approves anything above that."
    assert reason(original, swapped) == \
        "limit <= 25000.00 GBP: approve < ana lima became approve < sam reid; " \
        "limit > 25000.00 GBP: approve < sam reid became approve < ana lima"
    assert ok(original, "Payments up to £25,000 are approved by Ana Lima; anything over that is approved by Sam Reid.")


# --- typos ------------------------------------------------------------------------------------------

def test_a_slipped_particle_is_read_as_the_original_s() -> None:
    original = "The controller must sign off on INV-1004 before Sam releases the payment."
    assert ok(original, "The controler must sign of on INV-1004 before Sam releases the payment.")
    assert ok("Process the invoice from Acme Ltd.", "Process the invoice form Acme Ltd.")
    assert reason("Process the invoice from Acme Ltd.", "Process the invoice to Acme Ltd.") == \
        "'from acme ltd' became 'to acme ltd'"


def test_a_slip_is_read_as_the_original_s_own_word_before_the_lexicon_s() -> None:
    original = "Hold the invoices from Delmar Packaging."
    assert ok(original, "Hold the invoicse from Delmar Packaging.")  # not "invoice": the original's word, same length
    assert ok(original, "Hold the invoices from Delar Packaging.")  # not "delay": the original's word
    assert not ok(original, "Hold the invoice from Delmar Packaging.")


# --- register, letter case, chatter ------------------------------------------------------------------

def test_a_text_without_letter_case_reads_the_other_text_s_case() -> None:
    original = "Approve INV-1011 from Hansa Technik only if David Brennan confirms the rate drop in writing."
    assert ok(original, original.lower())
    assert ok(original, original.upper())
    assert not ok(original, original.lower().replace("david brennan", "grace liu"))


def test_a_capitalised_word_opening_a_sentence_before_a_name_or_a_modal_is_a_name() -> None:
    original = "Please process invoice INV-1008. Priya must review it and Sam must approve it."
    assert reason(original, "Please process invoice INV-1008. Sam must review it and Priya must approve it.") == \
        "'approve' by sam became by priya; 'review' by priya became by sam"
    assert ok("Ashfield Logistics says we owe them £1,980.", "Hey team - ashfield Logistics says we owe them £1,980.")


def test_a_plain_count_in_chatter_is_chatter() -> None:
    original = "Please hold INV-1016 from Corvin Industrial."
    assert ok(original, original + " Also, the coffee machine on floor 3 is broken again.")
    assert not ok(original, original + " Also, pay 3 other invoices again.")


def test_politeness_after_an_elided_negation_or_a_relative_clause_changes_nothing() -> None:
    original = "Process INV-1005 and pay it in EUR, not GBP."
    assert ok(original, "Process INV-1005 and pay it in EUR, not GBP, when you get a chance.")
    relative = "Pay INV-1002 including the freight, which PO-2004 authorises up to £250."
    assert ok(relative, relative.rstrip(".") + " when you get a chance.")


# --- said one way: contrasts, exceptions, lacks, order words, signatures, stated participles ----------

def test_a_currency_after_not_is_the_one_refused() -> None:
    original = "Pay INV-1005 in euros, not pounds."
    assert reason(original, "Pay INV-1005 in pounds, not euros.") == "currency GBP added; currency rather than EUR added; " \
        "currency EUR dropped; currency rather than GBP dropped"
    assert ok(original, "Please pay INV-1005 in euros, not pounds.")


def test_no_one_but_is_only_and_lacks_is_has_no() -> None:
    assert ok("Only the CFO may approve payments over £100,000.", "No one but the CFO may approve payments over £100,000.")
    assert ok("Hold any invoice over £25,000 that has no goods receipt.",
              "Hold any invoice above £25,000 that lacks a goods receipt.")
    assert not ok("Hold any invoice over £25,000 that has no goods receipt.",
                  "Hold any invoice above £25,000 that has a goods receipt.")


def test_after_that_orders_as_then_does() -> None:
    original = "The requester must confirm delivery and the budget holder must approve the spend; AP then pays."
    assert ok(original, "The requester must confirm delivery and the budget holder must approve the spend; after that AP pays.")


def test_politeness_is_read_with_its_contractions_written_out() -> None:
    original = "Three things:\n1. Post the audit entry for INV-1001.\n2. Send Hansa Technik the remittance for INV-1005."
    assert ok(original, "If you don't mind, " + original[0].lower() + original[1:])


def test_a_signature_block_after_a_closing_line_asks_nothing() -> None:
    original = "Dear AP team,\n\nINV-1022 quotes a closed PO, so it should be held.\n\nKind regards,\nOlu Adeyemi\nProcurement"
    assert ok(original, original.replace("Kind regards,", "Many thanks, and have a good weekend,"))
    assert not ok(original, original.replace("should be held", "should be paid"))


def test_a_participle_stated_with_by_is_a_fact_like_its_active() -> None:
    assert ok("David Brennan approved INV-1003 on 2 March 2026.", "INV-1003 was approved by David Brennan on 2 March 2026.")
    assert ok("Hold INV-1007 until Kestrel Consulting sends a corrected invoice.",
              "Hold INV-1007 until a corrected invoice is sent by Kestrel Consulting.")
    assert not ok("INV-1003 must be approved by David Brennan.", "INV-1003 was approved by David Brennan.")


# --- order, frequency, need, asides, gapping ---------------------------------------------------------

def test_a_clause_of_time_orders_two_steps_wherever_it_stands() -> None:
    original = "Ana, Sam wants you to review INV-1016 before he approves it."
    assert reason(original, "Ana, Sam wants you to approve INV-1016 before he reviews it.") == \
        "order 'approve then review' reversed"
    assert ok("Review INV-1016 and then approve it.", "Before you approve INV-1016, review it.")


def test_how_often_is_a_date_of_its_own() -> None:
    original = "Send the payment run report to the CFO."
    assert reason(original, original.rstrip(".") + " every week.") == "date 'every week' added"
    assert ok(original.rstrip(".") + " every week.", original.rstrip(".") + " each week.")


def test_a_negated_need_exempts_where_a_negated_may_forbids() -> None:
    original = "No invoice may be paid more than 5 days before its due date."
    assert not ok(original, "No invoice need be paid more than 5 days before its due date.")
    assert ok(original, "No invoice can be paid more than 5 days before its due date.")


def test_a_name_swapped_in_chatter_is_another_party() -> None:
    original = "Hello, this is Jana from Ashfield Logistics. Could you process INV-1017 against PO-2019? Thanks!"
    assert reason(original, original.replace("Ashfield", "Ashford")) == "name ashfield became ashford"
    assert ok(original, "Could you process INV-1017 against PO-2019? Thanks!")


def test_a_gapped_clause_repeats_the_verb_before_it() -> None:
    original = "Tom can approve up to £5,000, Elena up to £25,000."
    assert not ok(original, "Tom can approve up to £25,000, Elena up to £5,000.")
    assert ok(original, "Elena can approve up to £25,000, Tom up to £5,000.")
    assert ok(original, "Tom can approve up to £5,000 and Elena up to £25,000.")


def test_unless_a_limit_is_if_its_converse() -> None:
    original = "Unless the duplicate score comes back below 0.7, hold INV-1010."
    assert ok(original, "If the duplicate score comes back at 0.7 or above, hold INV-1010.")
    assert reason(original, "If the duplicate score comes back below 0.7, hold INV-1010.") == \
        "quantity >= 0.7 became < 0.7"


def test_an_indefinite_payment_under_a_limit_states_a_rule() -> None:
    original = "The controller must approve any payment over £5,000."
    assert ok(original, "The controller must approve a payment over £5,000.")
    assert not ok(original, "The controller must approve this payment over £5,000.")


def test_returning_an_invoice_to_its_sender_is_sending_it_back() -> None:
    original = "Reject INV-1018 and return it to Kestrel Consulting."
    assert ok(original, "Reject INV-1018 and send it back to Kestrel Consulting.")
    assert not ok(original, "Reject INV-1018 and pay Kestrel Consulting.")


def test_a_comparison_of_named_quantities_keeps_its_relation() -> None:
    original = "Flag any invoice where the billed quantity exceeds the received quantity."
    assert reason(original, "Flag any invoice where the billed quantity is at least the received quantity.") == \
        "comparison > became >="
    assert ok(original, "Flag any invoice where the billed quantity is more than the received quantity.")


def test_the_party_refused_in_a_contrast_and_a_party_s_own_are_kept() -> None:
    original = "Procurement, not AP, is responsible for chasing Ashfield Logistics for a renewed PO."
    assert reason(original, "AP, not procurement, is responsible for chasing Ashfield Logistics for a renewed PO.") == \
        "entity 'not AP' became 'AP'"
    assert ok("Pay Ashfield Logistics rather than Corvin Industrial.", "Please pay Ashfield Logistics rather than Corvin Industrial.")
    assert not ok("Pay Ashfield Logistics rather than Corvin Industrial.", "Pay Corvin Industrial rather than Ashfield Logistics.")
    assert reason("The CFO must not approve her own expense claims.", "The CFO must not approve expense claims.") == \
        "multiplicity 'own' dropped"
