"""The ``dispatch`` command line. ``main`` loads the commands (and click) only when the CLI runs."""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``dispatch`` console script."""
    from dispatch.cli.commands import main as run_cli

    run_cli(argv)
