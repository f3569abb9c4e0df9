"""On/off environment switches, all read by one spelling rule.

An on-by-default switch is on unless its variable is set to 0, false, no or
off (any case, surrounding spaces ignored); unset or anything else keeps it
on. An off-by-default switch is on only when set to 1, true, yes or on.
"""

from __future__ import annotations

import os

_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")


def switch_on(name: str) -> bool:
    """Is the on-by-default switch `name` on?"""
    return os.environ.get(name, "").strip().lower() not in _OFF


def switch_set(name: str) -> bool:
    """Is the off-by-default switch `name` turned on?"""
    return os.environ.get(name, "").strip().lower() in _ON


def switch_auto(name: str) -> bool | None:
    """A switch whose default is decided elsewhere: True or False when `name`
    is set to one of the spellings above, None when it is unset or `auto`;
    any other value raises ValueError naming the variable."""
    text = os.environ.get(name, "").strip().lower()
    if text in ("", "auto"):
        return None
    if text in _ON or text in _OFF:
        return text in _ON
    raise ValueError(f"{name}={text!r}: expected auto, 1 or 0")
