"""Run PyTorch's own device-generic test files for the `tpu` device (and CPU).

PyTorch's test files (test/test_indexing.py, test/test_type_promotion.py,
test/test_view_ops.py, test/nn/test_embedding.py, test/nn/test_pooling.py,
...) are not shipped in the torch wheel and are not part of this repository.
Put them in a directory (read from the pytorch repository at a version
matching the installed torch; the test/nn/ files either next to the others or
in an `nn/` subdirectory), then:

    python tools/pytorch_device_tests.py /path/to/dir                # tpu
    python tools/pytorch_device_tests.py /path/to/dir --device cpu   # baseline
    python tools/pytorch_device_tests.py /path/to/dir --device tpu --device cpu \\
        --files test_indexing.py nn/test_pooling.py --failures

The default files are DEFAULT_FILES below; a name is looked up in the
directory, then in its `nn/` subdirectory.

Each file runs unmodified in its own pytest process, inside that directory
(so this repository's conftest and pytest options do not apply), with
`PYTORCH_TESTING_DEVICE_ONLY_FOR=<device>`: PyTorch's
`instantiate_device_type_tests` then instantiates the tests for that device
only. The installed torch_tpu backend is imported up front (`-p torch_tpu`),
so `tpu` is PyTorch's PrivateUse1 device and gets the PrivateUse1 test base.
The script prints pass / fail / skip counts and the minutes each run took,
per file and device, and with `--failures` the names of the failing tests
with the first line of each error. A run that ends without its report (a
crash, or `--timeout` passed) is listed as one, with its exit code, the test
that was running, the counts of the tests that finished before it (from
pytest's verbose lines) and its whole output in a log file, and the script
exits non-zero.

Device-side checks (an index out of range, `torch_tpu.runtime.asserts`) are
reported when the host next waits. So that a check is reported by the test
whose op failed it, not by whichever test reads a value next, each test
starts with none pending and the ones it leaves are read when it ends (the
plugin `_device_tests_plugin.py` next to this script, as tests/conftest.py
does for the project's tests). `--launch-blocking` runs with
TORCH_TPU_LAUNCH_BLOCKING=1, where each op reports its own check at once.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

# test/test_*.py and test/nn/test_*.py of pytorch/pytorch.
DEFAULT_FILES = ("test_view_ops.py", "test_indexing.py", "test_type_promotion.py",
                 "test_embedding.py", "test_pooling.py")
TOOLS = Path(__file__).resolve().parent


def _parse_junit(path: Path):
    """(passed, failed, skipped, [(test id, first line of the failure)])."""
    passed = failed = skipped = 0
    failures = []
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}.{case.get('name', '')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            failed += 1
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            failures.append((name, message[0][:200] if message else ""))
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, failures


def resolve(directory: Path, filename: str) -> Path | None:
    """`filename` in `directory`, else in its nn/ subdirectory (test/nn/ files)."""
    for path in (directory / filename, directory / "nn" / filename):
        if path.is_file():
            return path
    return None


class Crash(RuntimeError):
    """A test run that ended without writing its report (killed by a signal,
    or stopped at the timeout); `counts` are the tests that finished before."""

    def __init__(self, message: str, counts: tuple[int, int, int]):
        super().__init__(message)
        self.counts = counts


_OUTCOME = re.compile(r"::(\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_STARTED = re.compile(r"^\S+::(\S+) ?$")


def _progress(output: str) -> tuple[tuple[int, int, int], str | None]:
    """(pass, fail, skip) of the tests a verbose run finished, and the test it
    was running when it stopped (pytest -v writes a test's id when it starts
    and its outcome on the same line when it ends)."""
    passed = failed = skipped = 0
    running = None
    for line in output.splitlines():
        m = _OUTCOME.search(line)
        if m:
            outcome = m.group(2)
            if outcome in ("PASSED", "XPASS"):
                passed += 1
            elif outcome in ("FAILED", "ERROR"):
                failed += 1
            else:
                skipped += 1
            running = None
        else:
            m = _STARTED.match(line.strip())
            if m:
                running = m.group(1)
    return (passed, failed, skipped), running


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def run_file(directory: Path, filename: str, device: str, extra: list[str],
             timeout: float, launch_blocking: bool = False):
    """Run one test file for one device; return the parsed counts."""
    path = resolve(directory, filename)
    assert path is not None, filename
    env = dict(os.environ)
    env["PYTORCH_TESTING_DEVICE_ONLY_FOR"] = device
    env.setdefault("TORCH_TPU_CPU_FALLBACK", "1")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(TOOLS)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if launch_blocking:
        env["TORCH_TPU_LAUNCH_BLOCKING"] = "1"
    with tempfile.TemporaryDirectory(prefix="pt-device-tests-") as tmp:
        # A private, empty compile cache per run, as tests/conftest.py gives
        # each pytest process: a run against a shared directory crashed once
        # inside XLA:CPU's executable cache (see docs/troubleshooting.md).
        env.setdefault("TORCH_TPU_CACHE_DIR", str(Path(tmp) / "cache"))
        report = Path(tmp) / "report.xml"
        # -v: each test's id is written when it starts, its outcome when it
        # ends, so a run that dies names its test and keeps its counts.
        cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
               "-p", "no:xdist", "-p", "torch_tpu", "-p", "_device_tests_plugin",
               "--rootdir", str(directory), f"--junitxml={report}",
               "-o", "junit_family=xunit1", str(path), *extra]
        try:
            proc = subprocess.run(cmd, cwd=directory, env=env, capture_output=True,
                                  text=True, timeout=timeout)
            output, status = proc.stdout + proc.stderr, f"exit code {proc.returncode}"
        except subprocess.TimeoutExpired as e:  # the run was killed at the timeout
            output, status = _text(e.stdout) + _text(e.stderr), f"timed out after {timeout:.0f} s"
        if not report.exists():
            # The whole output is kept (the temporary directory is not): the
            # verbose lines and the faulthandler dump name the test that was
            # running.
            log = Path(tempfile.gettempdir()) / f"pt-device-tests-{path.stem}-{device}-{os.getpid()}.log"
            log.write_text(output)
            counts, running = _progress(output)
            where = [line.strip() for line in output.splitlines()
                     if f"{path.name}\", line" in line]
            raise Crash(f"{filename} [{device}] produced no report ({status}); "
                        f"running: {running} {where[:2]}; finished before it: "
                        f"{counts[0]} passed, {counts[1]} failed, {counts[2]} skipped; "
                        f"full output: {log}\n{output[-3000:]}", counts)
        return _parse_junit(report)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path,
                        help="directory holding PyTorch's test files")
    parser.add_argument("--device", action="append", choices=("tpu", "cpu"),
                        help="device to instantiate the tests for (repeatable; "
                             "default: tpu)")
    parser.add_argument("--files", nargs="+", default=list(DEFAULT_FILES),
                        help="test files inside the directory")
    parser.add_argument("--failures", action="store_true",
                        help="list failing tests with the first line of their error")
    parser.add_argument("-k", dest="keyword", default=None,
                        help="pytest -k expression, to run a subset")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds allowed per file and device")
    parser.add_argument("--launch-blocking", action="store_true",
                        help="run with TORCH_TPU_LAUNCH_BLOCKING=1 (device-side "
                             "checks raise at their op)")
    args = parser.parse_args(argv)
    devices = args.device or ["tpu"]
    extra = ["-k", args.keyword] if args.keyword else []
    directory = args.directory.resolve()
    missing = [f for f in args.files if resolve(directory, f) is None]
    if missing:
        parser.error(f"not found in {directory} (or its nn/): {', '.join(missing)}")

    header = (f"{'file':<28} {'device':<6} {'pass':>6} {'fail':>6} {'skip':>6} "
              f"{'minutes':>8}")
    rows = []
    crashed = False
    for filename in args.files:
        for device in devices:
            start = time.monotonic()
            try:
                passed, failed, skipped, failures = run_file(
                    directory, filename, device, extra, args.timeout,
                    args.launch_blocking)
            except Crash as e:
                crashed = True
                print(f"CRASH [{device}] {e}", flush=True)
                p, f, k = e.counts
                row = (f"{filename:<28} {device:<6} {p:>6} {f:>6} {k:>6} "
                       f"{(time.monotonic() - start) / 60:>8.1f}  crashed or timed out "
                       "(counts: the tests finished before it)")
                rows.append(row)
                print(f"done: {row}", flush=True)
                continue
            minutes = (time.monotonic() - start) / 60
            row = (f"{filename:<28} {device:<6} {passed:>6} {failed:>6} {skipped:>6} "
                   f"{minutes:>8.1f}")
            rows.append(row)
            if args.failures:
                for name, message in failures:
                    print(f"FAIL [{device}] {name}: {message}")
            # Each row as soon as its run ends: a full test_indexing run on
            # tpu takes tens of minutes on a loaded 2-core host, and what
            # finished before an outside timeout should not be lost.
            print(f"done: {row}", flush=True)
    print(header)
    for row in rows:
        print(row)
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
