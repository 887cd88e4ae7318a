"""Evaluation: datasets and API lists for the paper's tasks (design.md §4, ``eval/``)."""
