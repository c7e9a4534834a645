"""``python -m dispatch.cli``."""

from dispatch.cli import main

main()
