"""Argument types for the command line: a bad value is an argparse error naming the flag
and what is allowed, said before any rank starts MPI work (not a failure deep in a run,
nor a result lost at the end because the output path cannot be written)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable


def _number(kind: type, low: float, inclusive: bool, what: str) -> Callable[[str], float]:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < low or (value == low and not inclusive):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        return value

    parse.__name__ = what  # argparse names the type in its messages
    return parse


#: an integer >= 1 (batch sizes, iteration counts, depths)
positive_int = _number(int, 1, True, "an integer >= 1")
#: an integer >= 0 (warm-up batches, simulated node counts where 0 means off)
non_negative_int = _number(int, 0, True, "an integer >= 0")
#: a number > 0 (timeouts)
positive_float = _number(float, 0.0, False, "a number > 0")
#: a number >= 0 (a training step's seconds)
non_negative_float = _number(float, 0.0, True, "a number >= 0")


def output_file(text: str) -> str:
    """A file path whose folder exists and can be written, checked before the run (so that
    a long run's result is not lost at the end)."""
    folder = os.path.dirname(os.path.abspath(text)) or "."
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{text}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text}: folder {folder} is not writable")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a folder, expected a file path")
    return text
