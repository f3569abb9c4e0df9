"""Cache keys: how an eager op's call and a helper program become a key.

An eager op's key (`Signature`, filled by `classify` or by the native kernel,
which builds the same parts, csrc/classify.h) holds the op, per argument what
the program bakes in (a storage's signature, a tensor's slot and view layout,
a Scalar's Python type, a static value, a list's length), then the context
parts (`programs.EAGER_CONTEXT`, appended by `Signature.finish`). A helper
program's key is `helper_key(kind, parts...)`. Both end with the XLA
optimization level: a program compiled at another level is another program.
runtime/key_decode.py reads an eager key back for the debug tools;
docs/architecture.md ("cache-key anatomy") describes the layout.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import programs
from . import storage as st
from .context import CONTEXT
from .fastpath import NATIVE as _NATIVE
from .precision import cache_token as precision_token

# How each argument of an overload enters the key, by its schema type. The
# values are the native kernel's too (csrc/native.h): keep their order.
# ALPHA: a Scalar `alpha` (add, sub, addmm, ...): a runtime input like any
# Scalar, except the int 1 (every call that leaves alpha out), which is part
# of the program (KeyTag.ONE): the executable then has no scalar input, which
# costs ~0.6 us per call in JAX's call path. The lowerings already skip the
# product for a literal 1 (elementwise._is_one), as under torch.compile.
(TENSOR, OPT_TENSOR, TENSOR_LIST, OPT_TENSOR_LIST, SCALAR, OPT_SCALAR, STATIC, GENERATOR,
 SCALAR_LIST, ALPHA) = range(10)
KIND_OF_TYPE = {
    "Tensor": TENSOR, "Optional[Tensor]": OPT_TENSOR, "List[Tensor]": TENSOR_LIST,
    "List[Optional[Tensor]]": OPT_TENSOR_LIST, "Scalar": SCALAR, "Optional[Scalar]": OPT_SCALAR,
    "number": SCALAR, "Optional[number]": OPT_SCALAR,
    "Optional[Generator]": GENERATOR, "Generator": GENERATOR,
    # Scalar lists (foreach ops: AdamW's per-step bias corrections) are
    # runtime inputs too, or every step would compile a new program.
    "List[number]": SCALAR_LIST,
}


def helper_key(kind: programs.ProgramKind, *parts: Any) -> tuple:
    """The key of a helper program (`programs.get_or_compile`): `kind`, the
    parts the program bakes in (shapes, dtypes, layouts, the device), and the
    XLA optimization level it compiles at, always last."""
    return (kind, *parts, CONTEXT.opt_level)


class Plan:
    """How to bind and classify one overload's arguments, from its schema."""

    __slots__ = ("op", "name", "args", "kinds", "writes", "out_names", "defaults",
                 "n_args", "arg_index", "has_dtype_arg")

    def __init__(self, op):
        schema = op._schema
        self.op = op
        self.name = str(op)
        self.args = schema.arguments
        self.n_args = len(self.args)
        self.kinds = tuple(ALPHA if k == SCALAR and a.name == "alpha" else k for a, k in zip(
            self.args, (KIND_OF_TYPE.get(str(a.type), STATIC) for a in self.args)))
        self.writes = tuple(bool(a.alias_info and a.alias_info.is_write) for a in self.args)
        self.out_names = tuple(a.name for a in self.args if a.is_out)
        self.defaults = tuple(a.default_value if a.has_default_value() else None
                              for a in self.args)
        self.arg_index = {a.name: i for i, a in enumerate(self.args)}
        self.has_dtype_arg = "dtype" in self.arg_index

    def bind(self, args, kwargs):
        n = len(args)
        if n == self.n_args:
            return args
        vals = list(args)
        if n < self.n_args:
            for i in range(n, self.n_args):
                name = self.args[i].name
                vals.append(kwargs[name] if name in kwargs else self.defaults[i])
        return vals


def device_mismatch(op_name, a, b):
    """PyTorch's error for tensors of one call on two devices."""
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two "
        f"devices, {a} and {b}! (when checking arguments for {op_name})")


class Signature:
    """Collects dynamic inputs, storage slots and the cache key of one call.

    This is the hot path of every eager op: keep it free of needless work.
    """

    __slots__ = ("dyn", "key", "slots", "slot_data", "device", "plan")

    def __init__(self, plan):
        self.plan = plan
        self.dyn = []
        self.key = [plan.op]
        self.slots = {}
        self.slot_data = []
        self.device = None

    def tensor(self, t):
        if not isinstance(t, torch.Tensor):
            # The dispatcher hands wrapped numbers (`x + 2`) to Python as scalars.
            return self.scalar(t)
        data = getattr(t.untyped_storage(), "_tpu", None)
        if data is None:
            return self._foreign(t)
        index = data.index
        if self.device != index:
            if self.device is not None:
                raise device_mismatch(self.plan.name, f"tpu:{self.device}", f"tpu:{index}")
            self.device = index
        slot = self.slots.get(id(data))
        key = self.key
        if slot is None:
            slot = self.slots[id(data)] = len(self.slot_data)
            self.slot_data.append(data)
            key.append(data.sig)
        if t.is_conj() or t.is_neg():
            # Lazy conjugate/negative views reaching a kernel: read the value
            # they stand for.
            layout, offset = st.dynamic_layout(st.view_layout(t, data))
            bits = (t.is_conj(), t.is_neg())
            key.append((slot, layout, bits))
            i = len(self.dyn)
            self.dyn.append(offset)
            return ("b", slot, layout, bits, i)
        if (t.dtype is data.dtype and t.shape == data.shape and t.is_contiguous()
                and t.storage_offset() == 0):
            key.append(slot)
            return ("t", slot, None)
        # A view: its layout is static, its storage offset a runtime input
        # (st.dynamic_layout), so x[i] for every i shares one program.
        layout, offset = st.dynamic_layout(st.view_layout(t, data))
        key.append((slot, layout))
        i = len(self.dyn)
        self.dyn.append(offset)
        return ("t", slot, layout, i)

    def _foreign(self, t):
        """A tensor argument that is not a tpu tensor: 0-dim CPU ones are scalars."""
        if t.device.type == "cpu" and t.dim() == 0:
            i = len(self.dyn)
            self.dyn.append(_cpu_scalar(t))
            self.key.append((programs.KeyTag.CPU_SCALAR, t.dtype))
            return ("c", i)
        if t.device.type == "tpu":
            if st.adopt_imported(t):  # imported through DLPack: the exporter's storage
                return self.tensor(t)
            raise RuntimeError(f"{self.plan.name}: tpu tensor without device data")
        dev = f"tpu:{self.device}" if self.device is not None else "tpu:0"
        raise device_mismatch(self.plan.name, dev, t.device)

    def scalar(self, v):
        if isinstance(v, torch.Tensor):
            return self.tensor(v)
        i = len(self.dyn)
        self.dyn.append(v)
        self.key.append(type(v))
        return ("s", i)

    def finish(self) -> tuple:
        """The key: the parts so far, then the context parts, last and in this
        order (programs.EAGER_CONTEXT). `device` must be set."""
        key = self.key
        # Executables are committed to one device: tpu:1 needs its own.
        key.append(self.device)
        # PyTorch's type promotion reads the default dtype (int / int, int +
        # 2.5, dtype=None), and the user may change it: part of every key.
        key.append(torch.get_default_dtype())
        # Programs traced under another matmul precision differ.
        key.append(precision_token())
        # ... and at another XLA optimization level.
        key.append(CONTEXT.opt_level)
        return tuple(key)


def _cpu_scalar(t):
    return np.asarray(t.item(), dtype=st.TORCH_TO_JAX[t.dtype])


# classify's hit path in C++ (runtime/fastpath.py): fills the signature, or
# returns False for the Python classifier to run. None: pure-Python path.
fast_classify = _NATIVE.classify if _NATIVE is not None else None


def classify(plan, vals, sig):
    """Recipes to rebuild each argument inside the program; the key parts
    are appended to `sig` on the way."""
    recipes: list[Any] = []
    append = recipes.append
    key = sig.key
    for kind, v in zip(plan.kinds, vals):
        if kind == TENSOR:
            append(sig.tensor(v))
        elif kind == STATIC:
            if type(v) is list:
                v = tuple(v)
            append(("x", v))
            key.append(v if not isinstance(v, torch.device) else str(v))
        elif kind == SCALAR:
            append(sig.scalar(v))
        elif kind == ALPHA:
            if type(v) is int and v == 1:
                append(("x", 1))
                key.append(programs.KeyTag.ONE)
            else:
                append(sig.scalar(v))
        elif v is None:
            append(("x", None))
            key.append(None)
        elif kind == OPT_TENSOR:
            append(sig.tensor(v))
        elif kind == TENSOR_LIST or kind == OPT_TENSOR_LIST:
            append(("l", tuple(None if x is None else sig.tensor(x) for x in v)))
            key.append(len(v))
        elif kind == OPT_SCALAR:
            append(sig.scalar(v))
        elif kind == SCALAR_LIST:
            append(("l", tuple(sig.scalar(x) for x in v)))
            key.append(len(v))
        else:  # generator: torch_tpu keeps its own RNG state
            append(("x", None))
            key.append(None)
    return recipes
