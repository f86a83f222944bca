"""README's training snippet is the trainer a real-process test runs (tests/runtime/data_worker.py,
killed mid-epoch by tests/runtime/test_cluster_data.py): the two stay equal, character for character."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INTRO = "A training script adopts the runtime in a few lines"
BEGIN, END = "# README: begin\n", "# README: end\n"


def readme_snippet(text: str) -> str:
    """The first ```python block after the sentence that introduces it."""
    at = text.index(INTRO)
    match = re.compile(r"^```python\n(.*?)^```", re.S | re.M).search(text, at)
    assert match is not None, f"README.md has no python block after {INTRO!r}"
    return match.group(1)


def marked_region(text: str) -> str:
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "the trainer must mark one README region"
    return text.split(BEGIN)[1].split(END)[0]


def test_the_readme_snippet_is_the_tested_trainer():
    snippet = readme_snippet((ROOT / "README.md").read_text())
    region = marked_region((ROOT / "tests/runtime/data_worker.py").read_text())
    assert snippet == region, "README.md's training snippet and tests/runtime/data_worker.py's README region " \
                              "differ: copy the region into README.md (or the change back into the trainer)"
    ast.parse(snippet)  # and it is Python on its own
    assert "from fthsdp.data import" in snippet and "manager.batches(loader.batch_at)" in snippet


def test_the_comparison_notices_a_change():
    text = (ROOT / "README.md").read_text()
    changed = text.replace("loader.batch_at", "loader.batch_at_", 1)
    assert readme_snippet(changed) != marked_region((ROOT / "tests/runtime/data_worker.py").read_text())
