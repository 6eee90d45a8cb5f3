"""python3 -m jazzmine_harness: runs the harness (see the package's documentation)."""

from jazzmine_harness import main

main()
