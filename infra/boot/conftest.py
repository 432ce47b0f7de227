"""The boot's tests import the CDK app's modules (`stacks`), as infra/cdk/tests do."""

from __future__ import annotations

import sys
from pathlib import Path

CDK_DIR = Path(__file__).resolve().parents[1] / "cdk"
if str(CDK_DIR) not in sys.path:
    sys.path.insert(0, str(CDK_DIR))
