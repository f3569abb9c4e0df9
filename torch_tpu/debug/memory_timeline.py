"""`memory_timeline`: bytes over time from a memory history, its peak, and
what held the memory at the peak.

It reads the snapshot `torch.tpu.memory._snapshot()` returns (PyTorch's
schema, so a CUDA snapshot works too): the blocks live before the history
began (frees of unrecorded allocations, and live blocks no event made) are
the starting bytes; each alloc adds its size, each free_completed takes it
away. At the peak it groups the live blocks by the op that made them (the
innermost frame, `<tpu op>`) and by the first frame outside torch and
torch_tpu (the user's line).
"""

from __future__ import annotations

import dataclasses
import os
import sysconfig
from collections import Counter
from typing import Any

from ..runtime.oom import fmt

# Frames in these are library code, not the user's line.
_LIBS = tuple(p + os.sep for p in (os.path.dirname(os.path.dirname(__file__)),
                                    sysconfig.get_paths()["purelib"],
                                    sysconfig.get_paths()["stdlib"]))


_COMPILE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "compile", "")


@dataclasses.dataclass
class MemoryTimeline:
    """Bytes allocated on one device after each event of a memory history."""

    times_us: list[int]
    bytes: list[int]
    peak: int
    peak_time_us: int
    peak_event: dict | None  # the alloc that reached the peak (None: the start)
    top_ops: list[tuple[str, int]]  # bytes live at the peak, by op
    top_frames: list[tuple[str, int]]  # ... by the user's line that allocated them
    device: int = 0

    def __str__(self) -> str:
        cause = "" if self.peak_event is None else \
            f", reached by {_op(self.peak_event['frames'])} ({fmt(self.peak_event['size'])})"
        lines = [f"tpu:{self.device} memory history: {len(self.times_us) - 1} events, "
                 f"peak {fmt(self.peak)} at {self.peak_time_us / 1000:.1f} ms{cause}",
                 "live at the peak, by op:"]
        lines += [f"  {fmt(n):>10}  {name}" for name, n in self.top_ops]
        lines.append("live at the peak, by the line that allocated it:")
        lines += [f"  {fmt(n):>10}  {name}" for name, n in self.top_frames]
        return "\n".join(lines)

    def plot(self, ax: Any = None, label: str | None = None) -> Any:
        """Bytes over time (a step line), the peak marked and the top ops
        listed in the legend. Returns the Axes."""
        try:
            import matplotlib.pyplot as plt
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("memory_timeline needs matplotlib: "
                              "pip install 'torch_tpu[guide]'") from e
        if ax is None:
            _, ax = plt.subplots(figsize=(7, 3.5))
        ms = [t / 1000 for t in self.times_us]
        mib = [b / 2**20 for b in self.bytes]
        ax.step(ms, mib, where="post", lw=1.2, label=label)
        ax.plot([self.peak_time_us / 1000], [self.peak / 2**20], "v", color="red", ms=8,
                label=f"peak {fmt(self.peak)}")
        for name, n in self.top_ops:
            ax.plot([], [], " ", label=f"{fmt(n)}  {name}")
        ax.set_xlabel("time since recording began (ms)")
        ax.set_ylabel("allocated (MiB)")
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper left", fontsize="x-small", title="live at the peak, by op",
                  title_fontsize="x-small")
        return ax


def memory_timeline(snapshot: dict | None = None, ax: Any = None, top: int = 5,
                    device: int = 0) -> MemoryTimeline:
    """The timeline of `snapshot` (None: `torch.tpu.memory._snapshot()` now)
    on `device`; drawn into `ax` when one is given (`.plot()` draws later).
    `top`: how many ops and lines to list. `print()` it for the text."""
    if snapshot is None:
        import torch

        snapshot = torch.tpu.memory._snapshot()
    tl = _timeline(snapshot, device, top)
    if ax is not None:
        tl.plot(ax)
    return tl


def _timeline(snapshot: dict, device: int, top: int) -> MemoryTimeline:
    traces = snapshot.get("device_traces", [])
    events = traces[device] if device < len(traces) else []
    live = _initial(snapshot, events, device)
    cur = sum(b["size"] for b in live.values())
    times, sizes = [0], [cur]
    peak, peak_t, peak_e, at_peak = cur, 0, None, dict(live)
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            cur += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in live:
            cur -= live.pop(e["addr"])["size"]
        else:
            continue
        times.append(int(e.get("time_us", len(times))))
        sizes.append(cur)
        if cur > peak:
            peak, peak_t, peak_e, at_peak = cur, times[-1], e, dict(live)
    ops: Counter = Counter()
    lines: Counter = Counter()
    for b in at_peak.values():
        ops[_op(b.get("frames", []))] += b["size"]
        lines[_user_line(b.get("frames", []))] += b["size"]
    return MemoryTimeline(times, sizes, peak, peak_t, peak_e, ops.most_common(top),
                          lines.most_common(top), device)


def _initial(snapshot: dict, events: list, device: int) -> dict:
    """The blocks live before the first event, by address."""
    live: dict = {}
    seen: set = set()
    for e in events:
        if e["action"] == "alloc":
            seen.add(e["addr"])
        elif e["action"] == "free_completed" and e["addr"] not in seen:
            live[e["addr"]] = {"size": e["size"], "frames": []}
            seen.add(e["addr"])
    for seg in snapshot.get("segments", []):
        if seg.get("device", 0) != device:
            continue
        for b in seg["blocks"]:
            if b.get("state") == "active_allocated" and b["address"] not in seen:
                live[b["address"]] = {"size": b.get("requested_size", b["size"]),
                                      "frames": b.get("frames", [])}
    return live


def _op(frames: list) -> str:
    if not frames:
        return "(before the history)"
    if frames[0].get("filename") == "<tpu op>":
        return frames[0]["name"]
    # No op named: a compiled graph's output, or the function that made it.
    if any(_COMPILE in f.get("filename", "") for f in frames):
        return "(compiled graph)"
    f = frames[0]
    return f"(in {os.path.basename(f.get('filename', '?'))}:{f.get('name')})"


def _user_line(frames: list) -> str:
    for f in frames:
        name = f.get("filename", "")
        if name.startswith(_LIBS) or name.startswith("<"):
            continue
        return f"{name}:{f.get('line')} ({f.get('name')})"
    if not frames:
        return "(before the history)"
    if all(f.get("filename", "").startswith("<") for f in frames):
        # Called from no Python frame at all: autograd's backward thread.
        return "(backward pass: no Python stack)"
    return "(no frame outside torch/torch_tpu)"
