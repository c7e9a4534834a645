"""The ``dispatch`` command line. ``main`` loads the commands (and click) only when the CLI runs."""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``dispatch`` console script."""
    import gc

    # Importing the commands creates tens of thousands of objects and frees almost none: the collector's
    # passes over them find nothing. Collect as usual once they are loaded, and never look at them again.
    gc.disable()
    try:
        from dispatch.cli.commands import main as run_cli
    finally:
        gc.freeze()
        gc.enable()
    try:
        run_cli(argv)
    except SystemExit as done:
        leave(done)
        raise


def leave(done: SystemExit) -> None:
    """End the process now, as the interpreter's own exit would, minus tearing the modules down.

    A read command spends a fifth to a third of its CPU taking apart, object by object, the modules it
    imported (asyncio, ssl, msgspec, click, ...), for a process that is about to end. So when nothing else
    runs (no thread but daemons), no profiler, debugger or coverage tool is watching (they write what
    they saw after this returns) and the exit code is a number: run the exit handlers (logging's flush,
    temporary files' cleanup) as the interpreter would, flush the standard streams, and ``os._exit``.
    Otherwise (a thread still working, a message as the code) return, and the caller exits as usual."""
    import atexit
    import os
    import sys
    import threading

    code = 0 if done.code is None else done.code
    if not isinstance(code, int) or sys.getprofile() is not None or sys.gettrace() is not None:
        return
    main = threading.main_thread()
    if any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone (`| head`) or a stream closed: nothing left to say
            pass
    os._exit(code)
