"""pytest plumbing of the OpInfo harness (tests/ops).

Options:
  --cpu-fallback       run with TORCH_TPU_CPU_FALLBACK=1 (default: every test in
                       tests/ops runs with the CPU fallback disabled, so an op
                       without a tpu lowering fails as "no lowering: aten.x").
                       XFAILS entries whose reason starts with "no lowering:"
                       are then expected to pass.
  --opinfo-results F   write one JSON record per test (op, dtype, kind,
                       outcome, cause, samples, duration, decomposed/fallback
                       ATen ops) to F; tools/op_coverage.py and
                       tests/ops/refresh_expectations.py read it.
  --opinfo-path P      the path of the tpu calls: eager (default), fused or
                       compiled (also TORCH_TPU_OPINFO_PATH); see harness.tpu_call.
  --opinfo-max-samples N
                       run N sample inputs per op, dtype and kind, evenly
                       spaced over the OpInfo's list (default 12, 0 = all;
                       also TORCH_TPU_OPINFO_MAX_SAMPLES).
"""

from __future__ import annotations

import json
import os
import re

import pytest

_CONFIG: dict = {}


def pytest_addoption(parser):
    g = parser.getgroup("torch_tpu opinfo")
    g.addoption("--cpu-fallback", action="store_true", default=False,
                help="run tests/ops with the CPU fallback enabled")
    g.addoption("--opinfo-results", default=None,
                help="write per-test JSON records of the OpInfo run to this file")
    g.addoption("--opinfo-path", default=None, choices=("eager", "fused", "compiled"),
                help="the path of the tpu calls: eager (default), fused (inside "
                     "torch_tpu.fused()) or compiled (torch.compile(backend='tpu'))")
    g.addoption("--opinfo-max-samples", default=None, type=int,
                help="sample inputs per op, dtype and kind, evenly spaced (0 = all; unset: "
                     "7 of the 12 evenly spaced ones for float32 forward, 4 for float32 "
                     "gradients and other dtypes, "
                     "harness.QUICK_SAMPLES)")


def pytest_configure(config):
    p = config.getoption("--opinfo-path", None)
    if p is not None:
        os.environ["TORCH_TPU_OPINFO_PATH"] = p
    n = config.getoption("--opinfo-max-samples", None)
    if n is not None:
        os.environ["TORCH_TPU_OPINFO_MAX_SAMPLES"] = str(n)
    config._opinfo_records = []
    _CONFIG["config"] = config


def fallback_mode(config) -> bool:
    return bool(config.getoption("--cpu-fallback", False))


def pytest_collection_modifyitems(config, items):
    from . import expectations

    fallback = fallback_mode(config)
    for item in items:
        key = getattr(item.function, "_opinfo_key", None)
        if key is None or not hasattr(item, "callspec"):
            continue
        key = key(item.callspec.params)
        reason = expectations.XFAILS.get(key)
        if reason is None:
            path = config.getoption("--opinfo-path", None)
            reason = expectations.PATH_XFAILS.get(key + (path,)) if path else None
            if reason is not None and key + (path,) not in expectations.XFAIL_SAMPLES:
                item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
            continue  # (keyed to its samples: the harness expects them to fail)
        if fallback and reason.startswith("no lowering:"):
            continue
        if key in expectations.XFAIL_SAMPLES:
            # Keyed to its failing samples: the harness expects exactly those
            # to fail, in whichever selection they are (test_opinfo._run).
            continue
        # Every sample fails (no lowering): strict in every selection. A
        # distribution check is statistical: its xfail may pass by chance.
        item.add_marker(pytest.mark.xfail(reason=reason,
                                          strict=not reason.startswith("distribution")))


@pytest.fixture(autouse=True)
def _opinfo_fallback_mode(request):
    from .harness import cpu_fallback

    with cpu_fallback(fallback_mode(request.config)):
        yield


def pytest_runtest_logreport(report):
    config = _CONFIG.get("config")
    if config is None or hasattr(config, "workerinput"):
        return  # xdist workers: the controller writes the file
    props = dict(report.user_properties)
    if "opinfo_op" not in props:
        crash = _crash_record(report)
        if crash is not None:
            config._opinfo_records.append(crash)
        return
    if report.when == "setup" and report.passed:
        return
    if report.when == "teardown" and (report.passed or report.skipped):
        return
    if report.when == "call" or report.failed or report.skipped:
        outcome = report.outcome
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        elif report.failed and "[XPASS(strict)]" in str(report.longrepr):
            outcome = "xpassed"  # a listed failure that now passes
        rec = {
            "nodeid": report.nodeid,
            "op": props["opinfo_op"],
            "dtype": props["opinfo_dtype"],
            "kind": props["opinfo_kind"],
            "outcome": outcome,
            "when": report.when,
            "duration": round(report.duration, 3),
        }
        for k in ("cause", "cpu_s", "samples", "random_samples", "decomposed", "fallback", "native"):
            if "opinfo_" + k in props:
                rec[k] = props["opinfo_" + k]
        if outcome in ("failed", "xfailed") and "cause" not in rec:
            rec["cause"] = "error: " + (report.longreprtext.strip().splitlines() or [""])[-1][:200]
        config._opinfo_records.append(rec)



_NODE = re.compile(r"::test_(forward|grad)\[(.+)-([a-z0-9]+)\]$")


def _crash_record(report):
    """A test whose worker died (a signal): xdist reports it without the
    properties the test would have recorded, so its op comes from the node id.
    Recorded as outcome "crash"; xdist starts a new worker and the run goes on."""
    if not report.failed or "crashed while running" not in report.longreprtext:
        return None
    m = _NODE.search(report.nodeid)
    if m is None:
        return None
    kind, op, dtype = m.groups()
    return {"nodeid": report.nodeid, "op": op, "dtype": dtype, "kind": kind,
            "outcome": "crash", "when": report.when, "duration": round(report.duration, 3),
            "cause": "crash: " + report.longreprtext.strip().splitlines()[-1][:200]}


def pytest_sessionfinish(session):
    config = session.config
    path = config.getoption("--opinfo-results", None)
    if not path or hasattr(config, "workerinput"):
        return
    recs = sorted(config._opinfo_records, key=lambda r: r["nodeid"])
    with open(path, "w") as f:
        from .harness import QUICK_SAMPLES, QUICK_SAMPLES_OTHER, max_samples, quick

        json.dump({"cpu_fallback": fallback_mode(config),
                   "max_samples": ({"float32": QUICK_SAMPLES, "other": QUICK_SAMPLES_OTHER,
                                    "float32 gradients": QUICK_SAMPLES_OTHER}
                                   if quick() else max_samples()),
                   "records": recs}, f, indent=0)
