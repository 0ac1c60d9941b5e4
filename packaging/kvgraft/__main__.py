"""`python -m kvgraft ...`: the same as the `kvgraft` command."""

from kvgraft.entry import main

main()
