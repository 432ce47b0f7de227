"""`python -m pool_manager`: the pool manager as a process, configured from the environment."""

import sys

from pool_manager.service import main

sys.exit(main())
