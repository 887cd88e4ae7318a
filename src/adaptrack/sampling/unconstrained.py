"""Unconstrained sampling: ancestral sampling from the model (top-p as plain nucleus).

It is greedy CD over a tree whose matcher allows every token and whose length limit only
stops the walk (``generate`` builds that tree), so the walk itself is CD's.
"""

from __future__ import annotations

from .cd import ConstrainedDecoding


class Unconstrained(ConstrainedDecoding):
    pass
