"""The examples' `--help` texts describe exactly the options the scripts accept.

Every option has a help line, none is hidden, and every `--option` a help
text mentions (usage line, descriptions) is one the parser shows, apart
from another script's option named with it ("train.py --save"). Built
in-process from each script's parser (no subprocesses).
"""

from __future__ import annotations

import argparse
import importlib
import re

import pytest

SCRIPTS = [f"examples.{m}" for m in (
    "dlrm.train", "dlrm.infer", "mingpt.train", "mingpt.sample", "resnet.train",
    "resnet.infer", "unet.train", "unet.sample")]
LM_FAMILIES = ["examples.llama.family", "examples.qwen.family"]


def _parsers():
    for name in SCRIPTS:
        yield pytest.param(lambda name=name: importlib.import_module(name).parser(), id=name)
    for fam in LM_FAMILIES:
        for kind in ("train_parser", "generate_parser"):
            def build(fam=fam, kind=kind):
                lm = importlib.import_module("examples.common.lm")
                return getattr(lm, kind)(importlib.import_module(fam).FAMILY)
            yield pytest.param(build, id=f"{fam.split('.')[1]}.{kind}")


@pytest.mark.parametrize("build", list(_parsers()))
def test_help_describes_only_visible_options(build):
    parser = build()
    visible = set()
    for action in parser._actions:
        assert action.help != argparse.SUPPRESS, f"{action.option_strings} is hidden from --help"
        if action.option_strings:
            assert action.help, f"{action.option_strings} has no help text"
            visible.update(action.option_strings)
    text = parser.format_help()
    # "(train.py --save)" names another script's option: not this one's
    mentioned = set(re.findall(r"(?<![\w-])(?<!\.py )--[a-z][a-z0-9-]*", text))
    assert mentioned <= visible, f"--help mentions options it does not show: {mentioned - visible}"
    assert "--compile-backend" in visible
