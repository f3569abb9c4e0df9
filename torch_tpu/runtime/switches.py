"""On/off environment switches, all read by one spelling rule.

A switch is on unless its variable is set to 0, false, no or off (any case,
surrounding spaces ignored); unset or anything else keeps it on.
"""

from __future__ import annotations

import os

_OFF = ("0", "false", "no", "off")


def switch_on(name: str) -> bool:
    """Is the on-by-default switch `name` on?"""
    return os.environ.get(name, "").strip().lower() not in _OFF
