"""Errors a user causes and can fix: a bad config value, a bad data file, a busy workdir.

Every layer raises these for input it refuses, with a message that says what is wrong, where
(the config key, the file and line, the workdir) and the fix, on one line. Code that catches
them can tell the user's mistakes from bugs: the command-line tools (`experiments/cli.py`)
print `error: <message>` and exit with status 2 for a `UserError`, and show the traceback of
anything else. In Colab, `except errors.UserError` does the same.

Each class also derives from the built-in exception such errors were raised as before they had
their own family (`ValueError`, `FloatingPointError`), so existing `except ValueError` code keeps
working. This module imports nothing, so every layer of `tfjax` may import it.
"""


class UserError(Exception):
    """Something the user can fix; the message names the problem, where it is, and the fix."""


class ConfigError(UserError, ValueError):
    """A config key, value, preset or config file that cannot be used."""


class DataError(UserError, ValueError):
    """Data that cannot be read or used: a malformed, empty or mismatched file, a bad label."""


class CheckpointError(UserError, ValueError):
    """Checkpoints that cannot be restored, or that belong to a run with other settings."""


class WorkdirError(UserError, ValueError):
    """A request a workdir cannot serve; the message says why and what to do instead."""


class WorkdirLockedError(WorkdirError):
    """The workdir is in use by another training run (named in the message)."""


class DependencyError(UserError, ImportError):
    """An optional package a feature needs is not installed; the message says what to install."""


class DivergedError(UserError, FloatingPointError):
    """Training produced a non-finite loss or gradient; nothing was saved after it."""


class DistributedError(UserError, RuntimeError):
    """A multi-process job that could not start (launch settings, coordinator) or lost a process."""


class ConversionError(UserError, ValueError):
    """A pretrained checkpoint that cannot be converted: another architecture, a missing, unknown
    or misshapen tensor, a config option the model cannot express."""


class StorageError(UserError, OSError):
    """The filesystem cannot take a write: it is full or read-only (the message names it, what
    was being written and what was kept)."""
