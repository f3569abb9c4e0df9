"""`python -m torch_tpu.cache {info,clear}`: inspect or empty the disk tier."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any
from .store import PACKAGES_SUBDIR, DiskStore, configured_dir


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torch_tpu.cache",
        description="The torch_tpu persistent compile cache (TORCH_TPU_CACHE_DIR).")
    sub = parser.add_subparsers(dest="command", required=True)
    info_p = sub.add_parser("info", help="where the cache is and what it holds")
    info_p.add_argument("--json", action="store_true", help="print JSON")
    info_p.add_argument("--dir", help="look at this directory instead")
    clear_p = sub.add_parser("clear", help="delete every cached program and anything else in "
                                           "the directory that is not one (never the shared "
                                           "directory)")
    clear_p.add_argument("--dir", help="clear this directory instead")
    args = parser.parse_args(argv)

    # The store alone: no JAX backend or device is needed to inspect files. It
    # creates nothing (a missing directory is reported) and reads, lists and
    # removes only through the checked directories (torch_tpu.cache.trust).
    root = args.dir or configured_dir()
    store = DiskStore(root, create=False) if root else None
    if args.command == "info":
        return _info(store, args.json)
    if store is None:
        print("the disk cache is disabled; nothing to clear")
        return 0
    if store.path is None:
        if store.reason == "it does not exist":
            print(f"{root} does not exist; nothing to clear")
            return 0
        print(f"refused to clear {root} ({store.reason}); nothing was removed",
              file=sys.stderr)
        return 1
    removed, left, why = store.clear_counts()
    print(f"removed {_removed_text(removed)} from {store.root}")
    if left:
        print(f"could not remove {left} item(s) ({why})", file=sys.stderr)
        return 1
    return 0


def _removed_text(removed: dict[str, int]) -> str:
    """What `clear` removed, in the words and kinds `info` counts them in."""
    parts = [f"{removed['entries']} cached program(s)"]
    if removed["packages"]:
        parts.append(f"{removed['packages']} compile package item(s)")
    if removed["other_files"]:
        parts.append(f"{removed['other_files']} unrecognised item(s)")
    return ", ".join(parts)


def _info(store: DiskStore | None, as_json: bool) -> int:
    """Print what the store holds; 1 if its directory is refused (untrusted or unusable)."""
    if store is None:
        data: dict[str, Any] = {"enabled": False, "dir": None,
                                "status": "disabled (TORCH_TPU_CACHE_DIR='')",
                                "entries": 0, "bytes": 0}
    else:
        full = store.info()
        data = {k: full[k] for k in ("enabled", "writable", "dir", "status", "entries",
                                      "bytes", "max_bytes", "other_files", "packages",
                                      "shared_dir",
                                      "shared_status", "shared_entries", "shared_bytes")}
    if as_json:
        print(json.dumps(data, indent=2))
    else:
        print(f"directory : {data['dir'] or '-'}")
        print(f"status    : {data['status']}")
        print(f"entries   : {data['entries']}")
        print(f"size      : {_human(data['bytes'])}"
              + (f" (cap {_human(data['max_bytes'])})" if data.get("max_bytes") else ""))
        if data.get("packages"):
            print(f"packages  : {data['packages']} torch.compile package item(s) "
                  f"({PACKAGES_SUBDIR}/; 'clear' removes them)")
        if data.get("other_files"):
            print(f"other     : {data['other_files']} unrecognised item(s) ('clear' removes them)")
        if data.get("shared_dir"):
            print(f"shared    : {data['shared_dir']} ({data['shared_status']}; "
                  f"{data['shared_entries']} entries, {_human(data['shared_bytes'])})")
    refused = store is not None and store.path is None and store.reason != "it does not exist"
    return 1 if refused else 0

if __name__ == "__main__":
    sys.exit(main())
