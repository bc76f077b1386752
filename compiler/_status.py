"""The words a build uses for where a variant stands: typed enums whose members are strings.

:class:`State` is where the plan puts a variant before anything compiles; :class:`Status` is how
one compile job ended, and so also the kind of failure the registry records for it. Each member
equals, hashes, prints and serialises as its value, so the registry's rows, the tables and
``--json`` carry the same strings as plain ``str`` constants would.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["STATES", "State", "Status"]


class _Word(str, Enum):
    """A string enum that prints as its value on every supported Python (``enum.StrEnum`` is
    3.11+; ``str(member)`` of a plain ``(str, Enum)`` would be ``State.NEW``)."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


class State(_Word):
    """Where a planned variant stands before the build (``_plan``'s docstring says each)."""

    PRESENT = "present"
    NEW = "new"
    STALE = "stale"
    FAILED = "failed"
    REJECTED = "rejected"


STATES = tuple(State)


class Status(_Word):
    """How one compile job ended. Every status but ``ok`` is also the ``kind`` of the failure
    row the registry keeps for the variant (``b12x-registry failures`` lists it)."""

    OK = "ok"
    FAILED = "failed"  # the compile, the contract or the compile process failed
    TIMEOUT = "timeout"  # ran past --timeout; the next build retries it
    # Ended for a reason outside its variant: a worker that could not start, or SASS a limit
    # needs that could not be read. Not a verdict on the inputs, so the next build retries it.
    TRANSIENT = "transient"
    REJECTED = "rejected"  # by the spec's limits (registers, spills, async wgmma)
