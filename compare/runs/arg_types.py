"""The types of compare's command-line values: each refuses a bad one with a message argparse prints
in one line."""

from __future__ import annotations

import argparse

from compare.runs.rundir import RunDirError, check_run_id


def run_id_arg(text: str) -> str:
    try:
        return check_run_id(text)
    except RunDirError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"--run-id {text!r}: ")) from None


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value
