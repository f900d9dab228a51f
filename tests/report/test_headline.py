"""Issue 31 item 3: a headline that cannot be misread, in the pages and on a terminal.

The verdict and a plain sentence come first; a gate that is not PASS says why ("22 tasks cannot show
95%; about N more distinct tasks would"); every term has a one-line gloss on hover and in the glossary;
pass^k is drawn as a curve; and no line of the text certificate is longer than a terminal."""

from __future__ import annotations

import html5lib

from plumbline_otel.model import Step, Trajectory
from plumbline_otel.report import build_certificate
from plumbline_otel.report.html import GLOSSARY, render
from plumbline_otel.report.render import TEXT_WIDTH, headline_sentence, render_text, validate
from plumbline_otel.spec import parse_spec

SPEC = parse_spec("""version: 1
name: toy
invariants:
  - {id: PAY, severity: critical, must_call: pay}
""")
_NS = {"h": "http://www.w3.org/1999/xhtml"}


def _runs(agent: str, tasks: int, repeats: int) -> list[Trajectory]:
    return [Trajectory(f"{agent}-{t}-{r}", f"{agent}-{t}-{r}", f"T{t:03d}", "attribute:plumbline.task.key", agent, "1.0", None,
                       f"Please pay invoice T{t:03d}", None, ("gen_ai",), (Step("tool_call", "pay", {"amount": t}),),
                       1_000 + t, 2_000 + t)
            for t in range(tasks) for r in range(repeats)]


def _text(node) -> str:
    return " ".join("".join(node.itertext()).split())


def test_a_clean_agent_that_is_not_certified_says_why_in_words() -> None:
    cert = build_certificate(SPEC, _runs("clean-agent", 22, 2))
    assert validate(cert.to_dict()) is None and cert.headline.verdict == "INCONCLUSIVE"
    how: dict[str, object] = {"checks": [], "note": None, "then": None, "standing": None, "check": None, "certify": None}
    page = render("console.html", lambda kind, **p: "/", cert=cert, stored_cert=False, chart=[], source="s", how=how,
                  totals={"spans": 0, "runs": 44, "agents": 1, "tasks": 22}, violations=[], coverage=None, candidates=None)
    doc = html5lib.HTMLParser(strict=True, namespaceHTMLElements=True).parse(page)
    assert _text(doc.find(".//*[@data-testid='headline']", _NS)).startswith("INCONCLUSIVE at least")
    assert _text(doc.find(".//*[@data-testid='headline-sentence']", _NS)) == headline_sentence(cert)
    why = _text(doc.find(".//*[@data-testid='why-not-pass']", _NS))
    needed = cert.headline.short_cells[0].tasks_needed
    assert "44/44 conforming over 22 task(s)" in why and f"22 task(s) cannot show 95.0%; about {needed} more distinct task(s)" in why
    terms = {el.get("title") for el in doc.iter() if el.get("class") == "term"}
    assert {GLOSSARY["bound"], GLOSSARY["tasks"], GLOSSARY["pass_k_curve"], GLOSSARY["flip_rate"]} <= terms, "glosses on hover"
    glossary = _text(doc.find(".//h:details[@id='glossary']", _NS))
    assert all(text in glossary for text in GLOSSARY.values())


def test_the_text_certificate_fits_a_terminal_and_draws_the_pass_k_curve() -> None:
    long_name = "agent-" + "x" * 400
    cert = build_certificate(SPEC, _runs(long_name, 30, 3) + _runs("other", 5, 1))
    text = render_text(cert)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= TEXT_WIDTH, "no line longer than a terminal"
    assert "x" * 100 in text.replace("\n", "").replace(" ", ""), "long values wrap rather than vanish"
    curve = next(line for line in lines if "pass^k curve" in line)
    assert "k=1 1.00" in curve and "k=3 1.00" in curve
    # why not PASS, and the advice that keeps the stated error: continue as a sequential study (issue 38 item 3)
    assert any("not PASS:" in line for line in lines) and "more distinct clean task(s) would settle it" in " ".join(lines)
