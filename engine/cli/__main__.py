"""`python -m engine.cli`: the `subs` command."""

import sys

from engine.cli.parser import main

sys.exit(main())
