"""`python -m gateway`: the gateway as a process, configured from the environment."""

import sys

from gateway.service import main

sys.exit(main())
