"""Where the tests find the repository and the shared test data, wherever a test file sits."""

from __future__ import annotations

from pathlib import Path

#: The repository's root.
ROOT = Path(__file__).resolve().parent.parent
#: ``../shared``: read-only test data next to the repository (tests skip without it).
SHARED = ROOT.parent / "shared"
#: The shipped results files the reports are checked against.
RESULTS = ROOT / "docs" / "results"
