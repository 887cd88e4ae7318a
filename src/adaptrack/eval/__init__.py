"""Evaluation: datasets and API lists for the paper's tasks (docs/design.md §4, ``eval/``)."""
