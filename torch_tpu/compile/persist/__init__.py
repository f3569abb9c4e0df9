"""What only torch.compile keeps in the cache directory, beside the program tiers.

- `steps`: `compile_step`'s traced graphs as JSON, so a warm process skips
  the trace (``TORCH_TPU_STEP_CACHE``);
- `artifacts`: PyTorch's own compile artifacts (dynamo precompile packages,
  on by default, ``TORCH_TPU_PRECOMPILE=0`` off) under the directory's trust check,
  and the `ArtifactStore` both use;
- `_output_code`: a compiled tpu graph in the form AOTAutograd's bundled
  cache pickles.

They use the disk tier's directory and entry format (torch_tpu.cache.store)
but are not program tiers: torch_tpu.cache (the executable tiers: store,
indexes, prefetch) never imports them; the dependency goes compile -> cache.
"""
