"""docs/supervisor.md shows the decision table that test_decide.py checks ``decide.next`` against."""

from __future__ import annotations

from pathlib import Path

from dispatch import decide

from .test_decide import NOW, POLICY, TABLE

DOC = Path(__file__).resolve().parents[2] / "docs" / "supervisor.md"


def test_the_documented_decision_table_is_the_tested_one() -> None:
    text = DOC.read_text()
    start = text.index("<!-- decisions table")
    end = text.index("<!-- end of decisions table -->")
    rows = [line for line in text[start:end].splitlines() if line.startswith("| ") and "---" not in line][1:]
    documented = [tuple(cell.strip().strip("`") for cell in row.strip("|").split("|")) for row in rows]
    tested = [(case, decide.next(record, POLICY, NOW).action.value) for case, record, _, _ in TABLE]
    assert documented == tested


def test_the_docs_index_links_the_supervisor_page() -> None:
    assert "(supervisor.md)" in (DOC.parent / "README.md").read_text()
