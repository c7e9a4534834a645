"""The page to look at (SPEC §11.2): every job, and each job's incarnations on a timeline.

A small aiohttp application (:mod:`dispatch.ui.app`) serving server-rendered HTML with inline SVG
(:mod:`dispatch.ui.pages`, pure) drawn from each record's history (:mod:`dispatch.ui.timeline`, pure),
live through server-sent events fed by the store's change feed (:mod:`dispatch.ui.feed`). Read-only:
it reads the store, and the cluster only for output tails. ``dispatch ui`` serves it alone;
``dispatch supervise --ui-address`` beside the supervisor.
"""

__all__ = ["DEFAULT_ADDRESS"]

DEFAULT_ADDRESS = "127.0.0.1:8321"
"""Where ``dispatch ui`` serves the page unless told otherwise (loopback: this machine only)."""
