"""The device layer: PyTorch's face of the `tpu` device.

Here PyTorch learns that `tpu` exists and how to talk to it: the PrivateUse1
registration, the `torch.tpu` module, `torch.accelerator` routing, printing
and `torch.save`/`torch.load`. It keeps no state the runtime reads: the
current device index (runtime/device_index.py), the RNG streams
(runtime/rng.py) and the memory numbers (runtime/storage.py, platform) live
in the runtime, and the functions here read and write them there.

The modules, one line each:

- `registration`: registers PrivateUse1 as `tpu` (what `import torch`'s
  autoload runs: no JAX) and the boxed fallback that loads the backend on
  the first op.
- `module`: `torch.tpu` (device count, current device, seeds and RNG state,
  synchronize, streams and events, memory), named like `torch.cuda`.
- `accelerator`: routes `torch.accelerator`'s C++ entry points to `torch.tpu`.
- `memory`: `torch.tpu.memory_*` statistics.
- `printing`: prints `tpu` tensors from one host copy.
- `serialization`: `torch.save` / `torch.load` of `tpu` tensors, `storage.tpu()`.
- `autocast`: `torch.autocast("tpu")` (the AutocastPrivateUse1 kernels, CUDA's
  op policy) and the torch.tpu precision/AMP functions.

What it may import: the runtime, the cache
layer, itself, and torch; never `ops`, `compile`, `distributed` or `debug`
(`python tools/import_graph.py --check` enforces it). `registration` and
`module` are in `import torch`'s start-up set, so they import no JAX at
module level: `module` reaches the runtime through lazy modules.

Hooks: `registration.set_fallback(handler)` is where `torch_tpu.ops` installs
the real fallback for ops without a `tpu` kernel once the backend has
loaded; everything PyTorch calls (the backend hooks, the device guard,
`torch.tpu`) is installed by `registration.register()`.

This file holds a docstring only: it runs on every import of a submodule.
"""
