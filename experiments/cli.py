"""What the decoding entry points share: quiet library logs, and one-line errors for users."""

import logging
import sys
from collections.abc import Callable

from absl import app
from absl import logging as absl_logging


def run(main: Callable[[], None]) -> None:
    """Runs `main` with orbax quiet; a `WorkdirError` prints `error: ...` and exits with 1."""
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every file it reads at INFO
    logging.getLogger("tfjax").setLevel(logging.INFO)
    from tfjax.runs import workdir

    try:
        main()
    except workdir.WorkdirError as err:
        sys.exit(f"error: {err}")


def no_arguments(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")


def print_lines(lines: list[str], warnings: list[str]) -> None:
    """Warnings on stderr, then one output line per input on stdout."""
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    sys.stdout.write("".join(f"{line}\n" for line in lines))
