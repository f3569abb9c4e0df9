"""JAX's private modules, read and set in one checked place.

JAX has no public API for what these features need: its persistent cache's
slot (the disk tier is installed there), its cache's read and write
functions, a `Compiled` rebuilt from a loaded executable (the eager index),
a thread-local setting as a context, and the distributed runtime's state.
Each feature names the JAX code it relies on; before first use that code
is checked against the fingerprint recorded for the installed JAX
(``jax_<major>_<minor>.py``, see `torch_tpu._compat`). On a mismatch the
feature is off with one warning and its caller takes the safe way: no disk
tier, a lowered op instead of a rebuilt one, JAX's own cache write, the
pure-Python call path; never a wrong result or a crash.

Importing this module imports no JAX: every function imports it lazily.
"""

from __future__ import annotations

import contextlib
from typing import Any

from . import Patch, apply, verified

CC = "jax._src.compilation_cache"
PXLA = "jax._src.interpreters.pxla"

DISK_TIER = "the compile cache's disk tier (JAX's persistent cache slot)"
OWN_WRITES = "every process writing its own compile-cache misses"
SINGLE_WRITER = "the compile cache writing each entry once (JAX's own write off per compile)"
EAGER_INDEX = "the eager index (ops run from the disk without lowering)"
NATIVE_CALL = "the native fast path's call of JAX's C++ call path (Compiled._call)"
PRECISION = "reading JAX's matmul precision without a config lookup"
GEQRF = "torch.geqrf on tpu (JAX's geqrf)"
DISTRIBUTED = "joining a jax.distributed runtime started elsewhere, and exiting after a failure"

# The JAX code each feature reads (not replaced): the functions whose
# behaviour the feature's writes and calls depend on.
READS: dict[str, list[str]] = {
    DISK_TIER: [f"{CC}:_get_cache", f"{CC}:_initialize_cache", f"{CC}:is_cache_used",
                f"{CC}:reset_cache", f"{CC}:get_executable_and_time"],
    # (MeshExecutable.unsafe_call is a property, which a fingerprint cannot
    # read: the function that builds it, and the attribute it carries)
    OWN_WRITES: [f"{CC}:put_executable_and_time", "jax._src.stages:Compiled.__init__",
                 f"{PXLA}:MeshExecutable.__init__", f"{PXLA}:UnloadedMeshExecutable.build_unsafe_call",
                 f"{PXLA}:ExecuteReplicated.__init__"],
    # (State.value is C++; __call__, the context, is the Python part)
    SINGLE_WRITER: ["jax._src.config:persistent_cache_min_compile_time_secs",
                    "jax._src.config:State.__call__", "jax._src.compiler:_cache_write"],
    # functions, not classes: a class's fingerprint parses its whole module
    # (UnloadedMeshExecutable's: 0.7 s); from_hlo builds one with every field
    EAGER_INDEX: ["jax._src.stages:Compiled.__init__", "jax._src.stages:make_args_info",
                  f"{PXLA}:MeshExecutable.__init__", f"{PXLA}:UnloadedMeshExecutable.from_hlo",
                  f"{PXLA}:UnloadedMeshExecutable.load", f"{PXLA}:_get_layouts_from_executable",
                  f"{PXLA}:get_dispatch_layouts", f"{PXLA}:is_default_layout"],
    NATIVE_CALL: ["jax._src.stages:Compiled.__call__"],
    PRECISION: ["jax._src.config:default_matmul_precision", "jax._src.config:State.__init__"],
    GEQRF: ["jax._src.lax.linalg:geqrf"],
    DISTRIBUTED: ["jax._src.distributed:State.initialize", "jax._src.distributed:State.shutdown",
                  "jax._src.distributed:global_state",
                  "jax._src.xla_bridge:backends_are_initialized"],
}

# JAX's persistent-cache slot and the flags that say it is set up: what
# `install_disk_tier` writes (the feature's one replacement of JAX state).
_SLOT_WHY = ("JAX has no API to give it a cache object (only a directory it opens "
             "itself); the disk tier is that object, keyed and trusted by torch_tpu")


def _slot_patches(store: Any) -> list[Patch]:
    return [
        Patch(f"{CC}:_cache", DISK_TIER, _SLOT_WHY, lambda _old: store),
        Patch(f"{CC}:_cache_initialized", DISK_TIER,
              "set so that JAX does not open its own cache over ours", lambda _old: True),
        Patch(f"{CC}:_cache_checked", DISK_TIER,
              "cleared so that JAX decides again whether the cache is used, with ours "
              "in place", lambda _old: False),
        Patch(f"{CC}:_cache_used", DISK_TIER, "re-evaluated with _cache_checked",
              lambda _old: False),
    ]


def patches() -> dict:
    """Every JAX target, for `python -m torch_tpu._compat` and the tests: the
    slot patches, and each feature's reads as patches that replace nothing."""
    out: dict[str, list[Patch]] = {}
    seen: set[str] = set()
    for feature, targets in READS.items():  # (a target two features read: listed once)
        out[feature] = [Patch(t, feature, "read, not replaced", lambda o: o)
                        for t in targets if t not in seen]
        seen.update(targets)
    out[DISK_TIER] += _slot_patches(None)
    return out


def usable(feature: str) -> bool:
    """Whether the JAX code `feature` reads is what it was written for (one
    warning and False otherwise; the caller then takes its safe way)."""
    return verified(feature, READS[feature])


# -- the disk tier ------------------------------------------------------------------


def install_disk_tier(store: Any) -> bool:
    """Make `store` JAX's persistent compilation cache for this process.

    False (one warning) where JAX's cache code differs: JAX then keeps its
    own cache (none unless the user configured one) and torch_tpu's tier
    stays out of JAX's compiles.
    """
    if not usable(DISK_TIER):
        return False
    from jax._src import compilation_cache as cc

    with cc._cache_initialized_mutex:
        return apply(DISK_TIER, _slot_patches(store))


def load_executable(jax_key: str, device: Any) -> Any:
    """The loaded executable stored under `jax_key` for `device`, or None
    (absent, unreadable by this jaxlib, or the disk tier off)."""
    if not usable(DISK_TIER):
        return None
    from jax._src import compilation_cache as cc
    from jax._src.lib import xla_client as xc

    try:
        exe, _ = cc.get_executable_and_time(jax_key, None, device.client,
                                            xc.DeviceList((device,)))
    except Exception:  # noqa: BLE001 - an entry this jaxlib cannot load: lower instead
        return None
    return exe


def has_host_callbacks(compiled: Any) -> bool:
    """Whether `compiled` calls back into Python (True where it cannot be told,
    or JAX's executables changed): such programs are never stored."""
    if not usable(OWN_WRITES):
        return True
    unsafe_call = getattr(getattr(compiled, "_executable", None), "unsafe_call", None)
    return bool(getattr(unsafe_call, "has_host_callbacks", True))


def store_executable(key: str, name: str, compiled: Any, seconds: float) -> bool:
    """Write `compiled`'s executable under JAX cache key `key` (False: not written,
    because JAX's cache code changed; the program still runs)."""
    if not (usable(OWN_WRITES) and usable(DISK_TIER)):
        return False
    from jax._src import compilation_cache as cc

    exe = compiled.runtime_executable()
    cc.put_executable_and_time(key, name, exe, exe.client, int(max(seconds, 0.0)))
    return True


def no_jax_cache_write() -> contextlib.AbstractContextManager:
    """A context in which JAX's own persistent-cache write is off, on this thread.

    The tier writes each entry itself (from every process); where the
    setting changed, JAX writes too (process 0), and the tier sees that
    write and skips its own: one entry either way.
    """
    if not usable(SINGLE_WRITER):
        return contextlib.nullcontext()
    from jax._src import config as jax_config

    return jax_config.persistent_cache_min_compile_time_secs(float("inf"))


# -- the eager index: describing and rebuilding a Compiled ---------------------------


def describe_compiled(compiled: Any, aval_text: Any) -> dict | None:
    """What rebuilding `compiled` needs besides its executable, or None (not
    indexable, or JAX's Compiled changed). `aval_text(aval)`: an aval's
    stored form (None: not storable)."""
    if not usable(EAGER_INDEX):
        return None
    import jax
    from jax._src import stages
    from jax._src.interpreters import pxla

    if type(compiled) is not stages.Compiled:
        return None
    mexe = compiled._executable
    if type(mexe) is not pxla.MeshExecutable:
        return None
    u = mexe._unloaded_executable
    if (u is None or u.ordered_effects or u.unordered_effects or u.host_callbacks
            or u.mut is not None or u.keepalive or compiled._params.const_args
            or compiled._params.is_high or len(u.device_list) != 1):
        return None
    shardings = list(mexe._in_shardings) + list(mexe._out_shardings)
    if not all(type(s) is jax.sharding.SingleDeviceSharding and s.memory_kind in (None, "device")
               for s in shardings):
        return None
    if any(layout is not None for layout in mexe._dispatch_in_layouts):
        return None
    infos = jax.tree_util.tree_leaves(compiled.args_info)
    if any(a.donated for a in infos):
        return None  # (the executor donates nothing; rebuilt programs never do)
    args = [aval_text(a._aval) for a in infos]
    outs = [aval_text(a) for a in mexe.out_avals]
    kept = sorted(mexe._kept_var_idx)
    if any(a is None for a in args) or any(o is None for o in outs):
        return None
    if [args[i] for i in kept] != [aval_text(a) for a in mexe.in_avals]:
        return None
    return {"name": u.name, "args": args, "kept": kept, "outs": outs,
            "committed": bool(u.committed), "in_tree": str(compiled.in_tree),
            "no_kwargs": bool(compiled._no_kwargs)}


def rebuild_compiled(exe: Any, device: Any, avals: list, kept: list[int], out_avals: list,
                     in_tree: Any, out_tree: Any, meta: dict) -> Any:
    """The `jax.stages.Compiled` of loaded single-device executable `exe`, or
    None (the executable does not fit, or JAX's Compiled changed: the op is
    lowered instead)."""
    if not usable(EAGER_INDEX):
        return None
    import jax
    from jax._src import stages
    from jax._src.interpreters import pxla
    from jax._src.lib import xla_client as xc

    in_avals = [avals[i] for i in kept]
    if list(exe.local_devices()) != [device]:
        return None  # compiled for another device (another process's entry)
    if (len(exe.get_parameter_layouts()) != len(in_avals)
            or len(exe.get_output_layouts()) != len(out_avals)):
        return None
    sharding = jax.sharding.SingleDeviceSharding(device)
    in_sh, out_sh = [sharding] * len(in_avals), [sharding] * len(out_avals)
    unloaded = pxla.UnloadedMeshExecutable(
        xla_executable=exe, device_list=xc.DeviceList((device,)), backend=device.client,
        input_avals=in_avals, input_shardings=in_sh, output_avals=out_avals,
        output_shardings=out_sh, committed=bool(meta["committed"]), name=str(meta["name"]),
        unordered_effects=[], ordered_effects=[], keepalive=[], host_callbacks=[],
        kept_var_idx=set(kept), mut=None, all_args_info=None, pgle_profiler=None,
        **_layouts(pxla, exe, in_sh, in_avals, out_avals))
    args_info = jax.tree_util.tree_unflatten(
        in_tree, [stages.ArgInfo(a, False) for a in avals])
    return stages.Compiled(unloaded.load(), [], args_info, out_tree,
                           no_kwargs=bool(meta["no_kwargs"]))


def _layouts(pxla: Any, exe: Any, in_sh: list, in_avals: list, out_avals: list) -> dict:
    """The layout fields of an UnloadedMeshExecutable as `from_hlo` makes them
    for default layouts (JAX 0.8: computed inline, with auto_spmd_lowering)."""
    nones = [None] * len(in_avals), [None] * len(out_avals)
    if hasattr(pxla, "get_dispatch_layouts"):  # the 0.10 code (jax_0_10.py)
        xla_in, xla_out = pxla._get_layouts_from_executable(exe, *nones, 0, in_avals, out_avals)
        return {"xla_in_layouts": xla_in, "xla_out_layouts": xla_out,
                "dispatch_in_layouts": pxla.get_dispatch_layouts(xla_in, in_sh, in_avals)}
    xla_in, xla_out = pxla._get_layouts_from_executable(exe, *nones, 0)  # 0.8 (jax_0_8.py)
    dispatch = [None if pxla.is_default_layout(lay, s, a) else lay
                for lay, s, a in zip(xla_in, in_sh, in_avals)]
    return {"xla_in_layouts": xla_in, "xla_out_layouts": xla_out,
            "dispatch_in_layouts": dispatch, "auto_spmd_lowering": False}


# -- settings and functions read ---------------------------------------------------------


def native_call_usable() -> bool:
    """Whether the native fast path may call `Compiled._call` (the C++ call
    path `Compiled.__call__` makes and keeps there); else the Python path."""
    return usable(NATIVE_CALL)


def matmul_precision_state() -> Any:
    """JAX's matmul-precision State (its `.value` read in ~40 ns), or None:
    the caller reads `jax.config` instead."""
    if not usable(PRECISION):
        return None
    from jax._src.config import default_matmul_precision

    return default_matmul_precision


def geqrf() -> Any:
    """JAX's geqrf (LAPACK's on CPU/GPU, a Householder loop elsewhere; not
    exported from jax.lax.linalg), or None."""
    if not usable(GEQRF):
        return None
    from jax._src.lax.linalg import geqrf as fn

    return fn


def backends_started() -> bool:
    """Whether JAX has created its backends (True where it cannot be told:
    the caller then treats them as started and restarts them if allowed)."""
    if not usable(DISTRIBUTED):
        return True
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def distributed_state() -> Any:
    """JAX's distributed runtime state (`client`, `service`, `process_id`,
    `num_processes`, `coordinator_address`), or None where it changed."""
    if not usable(DISTRIBUTED):
        return None
    from jax._src import distributed

    return distributed.global_state



# -- public APIs newer than the oldest JAX supported ----------------------------------


def erfcx() -> Any:
    """jax.scipy.special.erfcx (JAX >= 0.10), or None: torch.special.erfcx
    is then not lowered (the CPU fallback, where on, runs it)."""
    import jax.scipy.special as jsp

    return getattr(jsp, "erfcx", None)

