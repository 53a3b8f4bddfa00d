"""The before/after table of the hostile-input suite (tests/hostile): per surface (the `yt8m` command), the cases run
and what they gave, from the outcomes file and the JUnit XML of a pytest run of each checkout.

    HOSTILE_OUTCOMES=before.jsonl pytest tests/hostile --junitxml before.xml    # in a checkout of the old code
    HOSTILE_OUTCOMES=after.jsonl pytest tests/hostile --junitxml after.xml
    python bench/hostile_table.py before.jsonl before.xml after.jsonl after.xml

A clean error is one line `yt8m <command>: error: ...` and exit 1 (or the success a case expects) in a test that
passed; "wrong" is a clean exit the test rejected: bad input accepted, or an error that misses what it must say.
"""

from __future__ import annotations

import argparse
import collections
import json
import xml.etree.ElementTree as ElementTree

KINDS = ("clean", "wrong", "crash", "hang", "traceback")


def passed_tests(junit_xml: str) -> set[str]:
    """The node ids (path::name) of the tests that passed."""
    passed = set()
    for case in ElementTree.parse(junit_xml).iter("testcase"):
        if not any(child.tag in ("failure", "error", "skipped") for child in case):
            path = case.get("classname").replace(".", "/") + ".py"
            passed.add(f"{path}::{case.get('name')}")
    return passed


def counts(outcomes_jsonl: str, junit_xml: str) -> dict[str, collections.Counter]:
    passed = passed_tests(junit_xml)
    table: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    with open(outcomes_jsonl) as fh:
        for row in map(json.loads, fh):
            kind = row["kind"]
            if kind in ("clean error", "success"):
                kind = "clean" if row["test"] in passed else "wrong"
            table[row["surface"]]["cases"] += 1
            table[row["surface"]][kind] += 1
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before_outcomes")
    parser.add_argument("before_junit")
    parser.add_argument("after_outcomes")
    parser.add_argument("after_junit")
    args = parser.parse_args()
    before, after = counts(args.before_outcomes, args.before_junit), counts(args.after_outcomes, args.after_junit)
    print("| surface | cases | " + " | ".join(f"{kind} before / after" for kind in KINDS) + " |")
    print("| --- " * (len(KINDS) + 2) + "|")
    for surface in sorted(set(before) | set(after)):
        cells = [f"{before[surface][kind]} / {after[surface][kind]}" for kind in KINDS]
        print(f"| {surface} | {after[surface]['cases']} | " + " | ".join(cells) + " |")
    totals = [f"{sum(t[kind] for t in before.values())} / {sum(t[kind] for t in after.values())}" for kind in KINDS]
    print(f"| all | {sum(t['cases'] for t in after.values())} | " + " | ".join(totals) + " |")


if __name__ == "__main__":
    main()
