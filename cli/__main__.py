"""`python -m cli`: the `spotgate` command line."""

import sys

from cli.main import main

sys.exit(main())
