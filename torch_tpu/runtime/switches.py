"""Every `TORCH_TPU_*` environment variable, declared once and read here.

`TABLE` holds each variable's name, kind, default (as docs/environment.md
shows it; tests/test_environment.py checks the two agree), one line of what
it does, and the files that read it. Code reads a variable only through the
functions below, which raise on a name the table does not declare (a
programming error; the test suite also rejects any other `os.environ` read of
a `TORCH_TPU_*` name).

On/off switches read one spelling rule. An on-by-default switch (kind "on")
is on unless its variable is set to 0, false, no or off (any case, surrounding
spaces ignored); unset or anything else keeps it on. An off-by-default switch
(kind "off") is on only when set to 1, true, yes or on.

No reader caches: a variable read once (at import, or at first use) is cached
by the module that reads it, as before the table.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")

# kind: on / off (switches, by their default), auto (on, off or decided
# elsewhere), int, number, bytes (a size such as 512M), choice (one of a few
# words), path, text.
KINDS = ("on", "off", "auto", "int", "number", "bytes", "choice", "path", "text")


@dataclass(frozen=True)
class Switch:
    """One environment variable: what docs/environment.md says of it, and who reads it."""

    name: str
    kind: str
    default: str   # as the docs' default column shows it: `1`, unset, CPU count, ...
    doc: str       # one line
    where: tuple[str, ...]   # the files (from the repository root) that read it

    @property
    def value(self) -> str:
        """The default as a value (`1` -> "1"); "" when it is computed by the reader."""
        d = self.default
        if self.kind != "path" and d.count("`") == 2 and d.startswith("`") and d.endswith("`"):
            return d[1:-1]
        return ""


def _s(name: str, kind: str, default: str, doc: str, *where: str) -> Switch:
    return Switch(name, kind, default, doc, where)


_R, _C, _D = "torch_tpu/runtime/", "torch_tpu/cache/", "torch_tpu/compile/"

TABLE: dict[str, Switch] = {s.name: s for s in (
    # -- the device, the platform, XLA:CPU ----------------------------------------------
    _s("TORCH_TPU_PLATFORM", "choice", "best present",
       "tpu, gpu or cpu: the JAX platform behind the tpu device",
       _R + "platform.py", "torch_tpu/device/module.py"),
    _s("TORCH_TPU_CPU_XLA_DEFAULTS", "on", "`1`",
       "0: add none of torch_tpu's XLA:CPU options (flags, dot forms)",
       _R + "xla_flags.py", _C + "graphs.py"),
    _s("TORCH_TPU_CPU_DOT_PIECE_MB", "number", "`16`",
       "MiB of a half-precision x @ W.T's float32 W copy above which it is split",
       _R + "xla_flags.py", _C + "graphs.py"),
    _s("TORCH_TPU_CPU_NATIVE_BF16_DOTS", "auto", "`auto`",
       "bfloat16 x @ W.T as one dot reading W as stored (auto: AMX/AVX512-BF16 hosts)",
       _R + "xla_flags.py"),
    _s("TORCH_TPU_CPU_HALF_DOTS_F32", "auto", "`auto`",
       "half-precision matmuls as float32 dots rounded once (auto: hosts without the unit)",
       _R + "xla_flags.py"),
    _s("TORCH_TPU_CPU_FALLBACK", "on", "`1`",
       "0: an op without a lowering raises instead of running on the CPU",
       "torch_tpu/ops/fallback.py", _C + "graphs.py"),
    # -- eager execution ----------------------------------------------------------------
    _s("TORCH_TPU_CACHE_SIZE", "int", "`8192`",
       "entries of the in-memory executable cache", _R + "programs.py"),
    _s("TORCH_TPU_CACHE_BYTES", "bytes", "1/16 of host memory (≥ 256 MiB)",
       "bytes of the in-memory executable cache", _R + "programs.py"),
    _s("TORCH_TPU_MEMORY_LIMIT", "bytes", "PJRT's `bytes_limit`; on CPU the host's memory",
       "device memory limit of the out-of-memory check (off: no check)", _R + "oom.py"),
    _s("TORCH_TPU_LAUNCH_BLOCKING", "off", "`0`",
       "1: every op waits for its results (errors raised at the op)",
       _R + "context.py", _R + "async_compile.py"),
    _s("TORCH_TPU_INDEX_CHECKS", "on", "`1`",
       "0: indexing ops do not check index values on the device",
       "torch_tpu/ops/bounds.py"),
    _s("TORCH_TPU_NATIVE", "on", "`1`",
       "0: the pure-Python eager path, no native extension (also at install)",
       _R + "fastpath.py", "setup.py"),
    _s("TORCH_TPU_NATIVE_KERNEL", "on", "`1`",
       "0: cache hits through the ops' Python kernels", _R + "fastpath.py"),
    _s("TORCH_TPU_NATIVE_UNBOXED", "on", "`1`",
       "0: the C++ kernel registered boxed for every op", _R + "fastpath.py"),
    _s("TORCH_TPU_NATIVE_MEMO", "on", "`1`",
       "0: the C++ kernel keeps no memo of recent hits", _R + "fastpath.py"),
    _s("TORCH_TPU_COMPILE_THREADS", "int", "CPU count",
       "threads compiling eager misses in the background (0: compile inline)",
       _R + "async_compile.py"),
    _s("TORCH_TPU_EAGER", "choice", "`strict`",
       "fused: the whole process in fused eager mode", _R + "fused.py"),
    _s("TORCH_TPU_FUSED_MAX_OPS", "int", "`2000`",
       "fused mode: recorded ops after which the trace runs", _R + "fused.py"),
    _s("TORCH_TPU_DONATE", "on", "`1`",
       "0: never donate input buffers (compiled graphs, fused mode)",
       _R + "fused.py", _D + "graph_cache.py"),
    # -- caches -------------------------------------------------------------------------
    _s("TORCH_TPU_CACHE_DIR", "path", "`~/.cache/torch_tpu`",
       "the disk compile cache (\"\": none)", _C + "store.py"),
    _s("TORCH_TPU_CACHE_MAX_BYTES", "bytes", "4 GiB",
       "size cap of the disk cache", _C + "store.py"),
    _s("TORCH_TPU_SHARED_CACHE_DIR", "path", "unset",
       "a read-only cache directory consulted after the local one", _C + "store.py"),
    _s("TORCH_TPU_PRECOMPILE", "on", "`1`",
       "0: do not keep dynamo's compile packages in the cache directory",
       _D + "persist/artifacts.py"),
    _s("TORCH_TPU_STEP_CACHE", "on", "`1`",
       "0: compile_step traces its step in every process", _D + "persist/steps.py"),
    _s("TORCH_TPU_GRAPH_CACHE_SIZE", "int", "`512`",
       "compiled graphs kept in memory", _R + "programs.py"),
    _s("TORCH_TPU_GRAPH_CACHE", "on", "`1`",
       "0: compiled graphs are not loaded from the disk cache's graph index",
       _C + "graphs.py"),
    _s("TORCH_TPU_EAGER_INDEX", "on", "`1`",
       "0: eager programs are not loaded through the disk cache's eager index",
       _C + "eager.py"),
    _s("TORCH_TPU_EAGER_PREFETCH", "on", "`1`",
       "0: no loading ahead of the programs the previous run asked for",
       _C + "prefetch.py"),
    _s("TORCH_TPU_XLA_OPT_LEVEL", "int", "`3`",
       "XLA optimization level of every program, 0-3", _R + "opt_level.py"),
    # -- torch.compile ------------------------------------------------------------------
    _s("TORCH_TPU_DECOMP_TABLE", "choice", "`core`",
       "AOTAutograd's decompositions: core or full", _D + "backend.py"),
    _s("TORCH_TPU_PARTITIONER", "choice", "`default`",
       "how training graphs split: default or min_cut", _D + "backend.py"),
    _s("TORCH_TPU_PREBUILD_BACKWARD", "off", "`0`",
       "1: compile a static graph's backward in the background from the forward's call",
       _D + "graph.py"),
    _s("TORCH_TPU_DYNAMO_BOOKKEEPING", "off", "`0`",
       "1: keep dynamo's guard timing and source-line log headers", _D + "backend.py"),
    _s("TORCH_TPU_COMPILE_GC", "off", "`0`",
       "1: keep the cyclic collector running while a program compiles",
       _R + "gc_pause.py"),
    _s("TORCH_TPU_GC_FREEZE", "on", "`1`",
       "0: no gc.freeze() when the backend loads", _R + "gc_pause.py"),
    _s("TORCH_TPU_DYNAMIC", "choice", "`bucket`",
       "torch.compile's dynamic shapes: bucket or exact", _D + "dynamic.py"),
    _s("TORCH_TPU_BUCKETS", "text", "powers of two",
       "explicit bucket sizes, e.g. 64,128,512", _D + "dynamic.py"),
    _s("TORCH_TPU_MAX_SPECIALIZATIONS", "int", "`64`",
       "under exact: programs kept per graph", _D + "dynamic.py"),
    _s("TORCH_TPU_INDUCTOR_REDIRECT", "on", "`1`",
       "0: the default backend does not hand tpu graphs to tpu", _D + "redirect.py"),
    # -- debugging ----------------------------------------------------------------------
    _s("TORCH_TPU_LOG", "text", "unset",
       "compile, fallback or all: those events through logging",
       "torch_tpu/debug/_events.py"),
    _s("TORCH_TPU_DUMP_DIR", "path", "unset",
       "write every compiled program there",
       "torch_tpu/debug/_events.py", "torch_tpu/debug/__init__.py", _C + "index.py"),
    _s("TORCH_TPU_PROFILE_DIR", "path", "`./tpu_profile`",
       "default directory of torch_tpu.profiler.trace()", "torch_tpu/profiler.py"),
    # -- torch.distributed --------------------------------------------------------------
    _s("TORCH_TPU_COORDINATOR_ADDRESS", "text", "unset",
       "host:port of JAX's coordination service", "torch_tpu/distributed/runtime.py"),
    _s("TORCH_TPU_COORDINATOR_PORT", "int", "free port",
       "in process 0: the coordinator's port", "torch_tpu/distributed/runtime.py"),
    _s("TORCH_TPU_HEARTBEAT_TIMEOUT", "number", "`100`",
       "seconds without a heartbeat before a process is declared dead",
       "torch_tpu/distributed/runtime.py"),
    _s("TORCH_TPU_SHUTDOWN_TIMEOUT", "number", "`300`",
       "seconds a normal exit waits for the other processes",
       "torch_tpu/distributed/runtime.py"),
    _s("TORCH_TPU_DIST_CHECKS", "on", "`1`",
       "0: no cross-process check of each collective", "torch_tpu/distributed/programs.py"),
    _s("TORCH_TPU_DIST_DEBUG", "off", "unset",
       "1: print the traceback of a failed collective",
       "torch_tpu/distributed/process_group.py"),
    # -- the docs build (tools/mkdocs_hooks.py: no torch_tpu import there) ---------------
    _s("TORCH_TPU_DOCS_RUN", "on", "`1`",
       "0: render the notebooks' last snapshots", "tools/mkdocs_hooks.py"),
    _s("TORCH_TPU_DOCS_FORCE", "off", "`0`",
       "1: re-run every notebook", "tools/mkdocs_hooks.py"),
    _s("TORCH_TPU_DOCS_JOBS", "int", "`2`",
       "notebooks run in parallel", "tools/mkdocs_hooks.py"),
)}


def declared(name: str, *kinds: str) -> Switch:
    """`name`'s row; a name the table lacks (or of another kind) is a bug."""
    row = TABLE.get(name)
    if row is None:
        raise KeyError(f"{name} is not declared in torch_tpu/runtime/switches.py TABLE")
    if kinds and row.kind not in kinds:
        raise TypeError(f"{name} is a {row.kind!r} variable, not {' or '.join(kinds)}")
    return row


def switch_on(name: str) -> bool:
    """Is the on-by-default switch `name` on?"""
    declared(name, "on")
    return os.environ.get(name, "").strip().lower() not in _OFF


def switch_set(name: str) -> bool:
    """Is the off-by-default switch `name` turned on?"""
    declared(name, "off")
    return os.environ.get(name, "").strip().lower() in _ON


def switch_auto(name: str) -> bool | None:
    """A switch whose default is decided elsewhere: True or False when `name`
    is set to one of the spellings above, None when it is unset or `auto`;
    any other value raises ValueError naming the variable."""
    declared(name, "auto")
    text = os.environ.get(name, "").strip().lower()
    if text in ("", "auto"):
        return None
    if text in _ON or text in _OFF:
        return text in _ON
    raise ValueError(f"{name}={text!r}: expected auto, 1 or 0")


def switch_value(name: str) -> str:
    """`name`'s value without surrounding spaces; when unset or blank, the
    declared default (`2000` -> "2000"), or "" where the reader computes it."""
    row = declared(name)
    return os.environ.get(name, "").strip() or row.value


def switch_raw(name: str) -> str | None:
    """`name`'s value exactly as set, None when unset (for a variable whose
    empty value means something, or to restore it)."""
    declared(name)
    return os.environ.get(name)
