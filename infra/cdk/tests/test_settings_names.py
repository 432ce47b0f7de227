"""Every `SPOTGATE_…` name the app writes is a setting the services read (ARCHITECTURE.md)."""

from __future__ import annotations

import json
import re

from conftest import Synthesized

from spotgate.settings_env_names import setting_of

SETTING_NAME = re.compile(r"SPOTGATE_[A-Za-z0-9_]+")
BOOT_SCRIPT_OWN = {"SPOTGATE_BOOT_ROOT"}
"""The boot script's own variable (a sandbox's root in its tests), no service's setting."""


def test_every_name_in_the_template_is_a_field_of_the_typed_settings(
    synthesized: Synthesized,
) -> None:
    names = set(SETTING_NAME.findall(json.dumps(synthesized.raw))) - BOOT_SCRIPT_OWN
    # The services' environments, the agents' settings file, the outputs' descriptions.
    assert len(names) > 40
    assert sorted(name for name in names if setting_of(name) is None) == []


def test_every_agent_setting_the_app_writes_is_a_field(synthesized: Synthesized) -> None:
    written = {
        name for settings in synthesized.stack.gpu_pool.agent_settings.values() for name in settings
    }
    assert written
    assert sorted(name for name in written if setting_of(name) is None) == []
