"""The runtime: the bottom layer, where an eager op becomes a cached XLA executable.

Everything that runs a `tpu` op lives here: the lowering table, the tensor ↔
`jax.Array` storage, the executor and its native fast path, the one program
cache, the PJRT platform, and the process state they key on (current device,
RNG, optimization level, fused mode). docs/architecture.md ("The layers",
"The data path") tells the whole story; this is the map.

The modules, one line each:

- `registry`: the lowering table (ATen overload → JAX function); a leaf.
- `storage`: `DeviceData`, the `jax.Array` behind a storage; views as layouts.
- `executor`: the eager op: key, cache lookup, compile on a miss, call, wrap.
- `calling`: how a lowering is called (bind, split, conform); executor and compile share it.
- `scalars`: Python numbers as program inputs (32 bits unless the op is 64-bit).
- `programs`: THE program cache (one LRU, one statistics table) and its compile step.
- `async_compile`: the background compile pool; the host runs ahead of XLA.
- `fused`: fused eager mode: record ops, run them later as one program.
- `fastpath`: loads the C++ fast path (`_native`, csrc/; `_native.pyi` types it).
- `platform`: which JAX/PJRT platform backs `tpu`, and its devices.
- `context`: the eager context, one object (`CONTEXT`): opt level, fused
  mode, launch blocking, the precision token's source; the C++ kernel reads it.
- `device_index`: this thread's current device index.
- `rng`: per-device seed and offset; the key every random op takes as an input.
- `precision`: the float32 matmul precision of the programs compiled now (in
  every key; `torch_tpu.precision` is its user-facing module).
- `opt_level`: XLA optimization level of the programs compiled now.
- `asserts`: device-side asserts, reported at the next host read.
- `oom`: device memory limits and `torch.OutOfMemoryError`.
- `verdict`: PyTorch's own error text for a call CPU rejects.
- `counters`: transfer, sync and fallback counters any layer bumps.
- `gc_pause`: Python's GC paused while a program compiles.
- `loading`: the package's load step, as a hook (`loading.load()`).
- `switches`: every `TORCH_TPU_*` variable declared once, and its readers.
- `xla_flags`: XLA:CPU options set by default (in XLA_FLAGS, before JAX starts).
- `_dlpack`: the one way to make a tensor on a device other than tpu:0.

What it may import: itself, `torch_tpu._version`, and torch, JAX, numpy. Nothing above: not `device`, `cache`, `ops`, `compile` or `debug`
(`python tools/import_graph.py --check` enforces it).

Upper layers reach down through hooks declared here instead:
`programs.set_disk_tier` / `set_index_tier` (cache's persistence tiers),
`programs.COMPILE_LISTENERS` / `LOWERED_LISTENERS` (debug's compile log and
HLO dumps), `programs.add_compile_hook` (distributed's SPMD compiles),
`programs.SETTLE_HOOKS`,
`programs.ON_DROP` (the native memo), `storage.BEFORE_HOST_READ` (asserts),
`loading.set_loader` (the package's load step) and `fastpath.JAX_DEVICE`
(platform's device lookup).

This file holds a docstring only: it runs on every import of a submodule.
"""
