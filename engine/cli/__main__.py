"""`python -m engine.cli`: the `subs` command."""

import sys

from engine.cli.parser import main

if __name__ == "__main__":
    sys.exit(main())
