"""`python -m loomc` is the `loomc` console script."""

from loomc.cli import main

main()
