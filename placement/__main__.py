"""``python -m placement`` is ``placectl``."""

from placement.cli import main

main()
