"""The error types every command maps to exit codes (see planner/cli.py)."""

from __future__ import annotations


class SpecError(Exception):
    """Bad input: exit code 2, printed as ``error: <field>: <message>``."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def line(self) -> str:
        return f"error: {self.field}: {self.message}"


def did_you_mean(name: str, choices) -> str:
    """A short suggestion for an unknown name, or '' when nothing is close."""
    import difflib

    close = difflib.get_close_matches(name.lower(), [c.lower() for c in choices], n=1, cutoff=0.6)
    if not close:
        return ""
    original = {c.lower(): c for c in choices}[close[0]]
    return f" (did you mean '{original}'?)"


class Inexpressible(Exception):
    """The target framework cannot run the plan: exit code 4, printed as ``error: <field>: <message>``. The message
    names the feature and the flag that restricts the search to what the framework runs."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def line(self) -> str:
        return f"error: {self.field}: {message_one_line(self.message)}"


def message_one_line(text: str) -> str:
    return " ".join(str(text).split())
