"""The README documents every marker key the schema accepts."""

from pathlib import Path

from pytest_llmperf.schema import KEYS

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_lists_every_marker_key() -> None:
    text = README.read_text()
    missing = [k for k in KEYS if f"`{k}`" not in text]
    assert not missing, f"README does not document marker keys: {missing}"
