"""`python -m cli`: the `spotgate` command line."""

import sys

from cli import run

sys.exit(run())
