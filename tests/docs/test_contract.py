"""docs/contract.md cannot drift from the code: every rule id cited in code or tests is defined
there, and every rule names tests that exist (or says plainly that it has none)."""

from __future__ import annotations

import pytest

from contract_rules import (
    CONTRACT,
    RULE_ID,
    checks_by_rule,
    ids_cited_in_code,
    names_a_test,
    parse_contract,
    sort_key,
)


@pytest.fixture(scope="module")
def text() -> str:
    return CONTRACT.read_text(encoding="utf-8")


def test_every_rule_id_cited_in_code_is_defined(text: str) -> None:
    defined = parse_contract(text)
    cited = ids_cited_in_code()
    missing = {
        rule_id: sorted(files)[:3] for rule_id, files in cited.items() if rule_id not in defined
    }
    assert not missing, f"rule ids cited in code but not defined in docs/contract.md: {missing}"


def test_every_id_the_contract_mentions_is_defined(text: str) -> None:
    defined = parse_contract(text)
    assert sorted(set(RULE_ID.findall(text)) - set(defined), key=sort_key) == []


def test_every_rule_names_tests_that_exist(text: str) -> None:
    rules = parse_contract(text)
    assert rules
    gone = [ref for rule in rules.values() for ref in rule.tests if not names_a_test(ref)]
    assert not gone, (
        f"docs/contract.md lists tests that do not exist: {gone}; "
        "run .venv/bin/python tests/contract_rules.py"
    )
    silent = [rule.id for rule in rules.values() if not rule.tests and not rule.untested]
    assert not silent, f"rules with no test that do not say so: {silent}"


def test_a_rule_marked_untested_has_no_test_since(text: str) -> None:
    found = checks_by_rule()
    stale = [
        rule.id for rule in parse_contract(text).values() if rule.untested and found.get(rule.id)
    ]
    assert not stale, f"{stale} have tests now: run .venv/bin/python tests/contract_rules.py"


def test_the_scanner_sees_the_ids_the_listed_tests_cite(text: str) -> None:
    # Guards the scanner itself: a listed test cites its rule, so the scan must find the id
    # in that test's file.
    cited = ids_cited_in_code()
    for rule in parse_contract(text).values():
        for ref in rule.tests:
            assert ref.partition("::")[0] in cited[rule.id], (rule.id, ref)
