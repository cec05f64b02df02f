"""`python -m builder`: the `builder` command, where no console script is on PATH."""

import sys

from builder.cli.main import main

sys.exit(main())
