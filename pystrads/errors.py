"""The exception and warning types a pystrads user can catch.

Every error raised on purpose by pystrads is one of these (or a standard
``ValueError``/``TypeError`` subclass of them for bad parameters), so callers
never have to catch a bare ``Exception``.
"""


class PystradsError(Exception):
    """Base class of every pystrads error."""


class ConfigurationError(PystradsError, ValueError):
    """A parameter, a Spark setting or the environment cannot work.

    The message names the parameter or setting, the value and the fix.
    """


class InputError(PystradsError, ValueError):
    """The input data is unusable (a bad column, value or id).

    Raised before any Spark job starts; the message names the column, the
    offending value and the fix.
    """


class ShardUnavailableError(PystradsError, ConnectionError):
    """A parameter-server shard cannot be reached, refused a call, or failed."""


class ShardStartError(ShardUnavailableError):
    """A shard process could not be started on an executor (the message says
    which executor and why: port, memory, import error...)."""


class PayloadAuthenticationError(PystradsError, RuntimeError):
    """A payload read from the shards (a stored blob, a posted command) lacks the seal of the
    role that may write it: refused before it is unpickled.  The message names it."""


class ScheduleError(PystradsError, RuntimeError):
    """A program's ``schedule`` returned something the engine cannot run."""


class StepFailedError(PystradsError, RuntimeError):
    """A step failed on every attempt Spark allowed; the shards were rolled
    back to the state before the step."""


class ProgramError(PystradsError, RuntimeError):
    """The program's own code (``load``, ``init_state``, ``push``, ``apply``, ``pull``, an export)
    raised on an executor or a shard.  The fit ends at once -- a program error is not a lost task
    and is never retried -- and the message holds the hook, the worker and the traceback."""


class RoundTimeoutError(PystradsError, TimeoutError):
    """A worker waited longer than ``spark.pystrads.round.timeoutSeconds`` for
    the other workers to finish a round."""


def python_cause(exc: BaseException) -> str:
    """The last Python exception line inside a Py4J error (what the user needs), else the
    error's first line."""
    import re

    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines()
             if re.match(r"^\s*[\w.]+(Error|Exception|Warning)\b.*:", ln)]
    python_lines = [ln for ln in lines if not ln.startswith(("org.apache", "java.", "py4j", "scala."))]
    chosen = (python_lines or lines or [text.splitlines()[0] if text else repr(exc)])[-1]
    return chosen[:2000]
