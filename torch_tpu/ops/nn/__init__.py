"""Neural-network lowerings: convolution, pooling, normalization, losses,
embedding, dropout, attention, upsampling and padding.

Each forward op and the backward op PyTorch's autograd formula calls for it
is one lowering, so a layer's forward and its backward each run as one
compiled executable. Backward lowerings either write the gradient out
(normalizations, losses) or take `jax.vjp` of the forward lowering inside the
program (convolution, padding, average pooling, attention), which keeps the
two consistent by construction.

Half-precision inputs (bfloat16, float16) compute in float32 and are rounded
once at the end, like PyTorch's CPU kernels (accumulation types): `@opmath`
and `upcast` from `ops/opmath.py`. Matmul-like
ops (convolution, attention, adaptive pooling) run float32 inputs at
`Precision.HIGHEST`, so results match PyTorch's float32 on a TPU too; inputs
that came from a half type are exact in bfloat16 and use the default (one-pass)
precision.

Two PyTorch routes need kernels outside the table (`_install_routes`):
`scaled_dot_product_attention` is CompositeImplicitAutograd and on PrivateUse1
always takes the many-op math path, so it is routed to the fused
`_scaled_dot_product_fused_attention_overrideable` (one executable forward,
one backward); `native_batch_norm` takes optional running statistics that it
updates in place, which is routed to the `_native_batch_norm_legit` overloads
(mutated, non-optional running stats, or none).

The lowerings live in one module per family (`convolution`, `pooling`,
`normalization`, `losses`, `embedding`, `dropout`, `attention`, `upsampling`,
`grid_sample`, `padding`, `routes`, `ctc`); importing the package imports
them all, in that order, which fills the lowering table and installs the
kernels and routes.
"""

from . import (  # noqa: F401  (imported for their registrations)
    convolution,
    pooling,
    normalization,
    losses,
    embedding,
    dropout,
    attention,
    upsampling,
    grid_sample,
    padding,
    routes,
    ctc,
)
