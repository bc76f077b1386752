"""The error base of b12x-aot, and the errors of the launch contract itself.

:class:`B12xError` is the base of every error the project raises; each package's ``errors``
module derives its own base from it, so one ``except B12xError`` catches them all. The
contract's errors are the ones its records raise wherever they are read: a declaration that
breaks an argument's rules, an expression outside the grammar or one that cannot be evaluated.
"""

from __future__ import annotations

__all__ = ["ArgError", "B12xError", "ExpressionError", "short_repr"]


def short_repr(value: object, limit: int = 160) -> str:
    """``repr(value)`` with long strings and deep or long containers elided, at most about
    ``limit`` characters: a message shows the bad value, never all of a huge one."""
    import reprlib  # only on the error path

    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxtuple, r.maxdict, r.maxset = 3, 6, 6, 6, 6
    r.maxother = r.maxlong = 60
    r.maxstring = limit
    text = r.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class B12xError(Exception):
    """Base class of every error b12x-aot raises; each package's errors derive from it.

    ``format_message()`` is the whole user-facing text; ``exit_code`` is what a CLI exits with
    when this error ends a command (2 for bad input, 1 otherwise).
    """

    exit_code = 1

    def format_message(self) -> str:
        return str(self.args[0]) if self.args else type(self).__name__

    def __str__(self) -> str:
        return self.format_message()


class ExpressionError(B12xError, ValueError):
    """An expression outside the whitelisted grammar, or one that cannot be evaluated."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(source, reason)
        self.source = source
        self.reason = reason

    def format_message(self) -> str:
        return f"expression {short_repr(self.source, 400)}: {self.reason}"


class ArgError(B12xError, ValueError):
    """A kernel argument declaration that breaks the launch contract (see ``Arg``)."""

    def __init__(self, arg: str, field: str, reason: str) -> None:
        super().__init__(arg, field, reason)
        self.arg, self.field, self.reason = arg, field, reason

    def format_message(self) -> str:
        where = f".{self.field}" if self.field else ""
        return f"argument {self.arg!r}{where}: {self.reason}"
