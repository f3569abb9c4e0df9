"""ATen kernels for the `tpu` device.

`registry.LOWERINGS` (the lowerings) and `core.KERNELS` (the storage-level
kernels) are two fields of the op table (`runtime/registry.py`), filled by the
family modules imported below. `install()` registers both with the
dispatcher for PrivateUse1 and puts the fallback (decompositions, then the
CPU) behind every other op (through the device's
PrivateUse1 fallback, `torch_tpu.device.registration.set_fallback`); `sparse.install()`
adds the sparse COO kernels (SparsePrivateUse1); `quantized.install()` refuses
quantized tensors with a NotImplementedError naming quantization.
"""

from __future__ import annotations

import torch

from ..runtime import calling
from . import registry  # noqa: F401  (the table, filled by the imports below)
from . import bounds, core, fallback, quantized, sparse
from . import elementwise, activations, fft, foreach, reductions, sorting, shape, nn, linalg, linalg_kernels, ldl, indexing, random, factories, special, collectives  # noqa: F401
from ..runtime import executor
from ..device import registration

_libs = []


def install() -> None:
    """Register every kernel and the fallback for PrivateUse1 (once)."""
    if _libs:
        return

    lib = torch.library.Library("aten", "IMPL")
    _libs.append(lib)
    registered = set()
    for op, fn in core.KERNELS.items():
        if bounds.spec_for(op) is not None:  # index bounds checked first (ops/bounds.py)
            lib.impl(op, bounds.guard(op, fn), "PrivateUse1")
        elif getattr(fn, "hits_as_runner", False):  # behind the native kernel, as a runner is
            executor.install_kernel(lib, op, executor.runner_for(op), fn)
        else:
            lib.impl(op, fn, "PrivateUse1")
        registered.add(op)
    for op in list(registry.LOWERINGS):
        if op in registered:
            continue
        runner = executor.runner_for(op)
        _install(_lib_for(op, lib), op, runner)
        registered.add(op)
        # The in-place and out= forms run through the same lowering.
        for variant in _variants(op):
            if variant not in registered and variant not in registry.LOWERINGS:
                r = executor.runner_for(variant)
                if r is not None:
                    _install(lib, variant, r)
                    registered.add(variant)
    # The device's one PrivateUse1 fallback was registered with the device
    # (torch_tpu.device.registration): it now hands every op with no kernel
    # of its own to fallback.handle.

    registration.register()
    registration.set_fallback(fallback.handle)
    sparse.install()
    quantized.install()


def _lib_for(op, aten_lib):
    """The IMPL library of `op`'s namespace (the table also holds torch_tpu's own ops)."""
    ns = op._schema.name.split("::")[0]
    if ns == "aten":
        return aten_lib
    for lib in _libs:
        if lib.ns == ns:
            return lib
    lib = torch.library.Library(ns, "IMPL")
    _libs.append(lib)
    return lib


def _install(lib, op, runner) -> None:
    if bounds.spec_for(op) is not None:  # index bounds checked first (ops/bounds.py)
        lib.impl(op, bounds.guard(op, runner.__call__), "PrivateUse1")
    else:
        executor.install_kernel(lib, op, runner)  # PrivateUse1, maybe behind the C++ kernel


def _variants(op):
    """In-place and out= overloads whose functional overload is `op`."""
    schema = op._schema
    ns_name, base = schema.name.split("::")
    ns = getattr(torch.ops, ns_name)
    found = []
    for name in (base + "_", base):
        packet = getattr(ns, name, None)
        if packet is None:
            continue
        for ov in packet.overloads():
            cand = getattr(packet, ov)
            if cand is op:
                continue
            try:
                if calling.functional_of(cand) is op:
                    found.append(cand)
            except Exception:
                continue
    return found
