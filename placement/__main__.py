"""``python -m placement`` is ``placectl``."""

from placement.cli.main import main

main()
