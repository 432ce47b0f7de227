"""`python -m gpu_agent`: the agent as a process, configured from the environment."""

import sys

from gpu_agent.service import main

sys.exit(main())
