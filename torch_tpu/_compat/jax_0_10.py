"""Fingerprints of the JAX 0.10 code torch_tpu._compat.jax_api reads and sets.

Recorded with `python -m torch_tpu._compat --write` on jax 0.10.2 (jaxlib
0.10.2), after reading each target against its use in jax_api. The slots
(`_cache`, `_cache_*`) are fingerprinted by the type of their value before
the disk tier is installed (None, bool; `_cache`: also JAX's LRUCache, added
by hand: `--write` prints the value of this process only). A target not listed here (or
listed with another fingerprint) turns its feature off with one warning.
"""

FINGERPRINTS = {
    # None, or JAX's own file cache (LRUCache: a jax_compilation_cache_dir the
    # user set, opened by an earlier JAX compile), which the tier replaces
    'jax._src.compilation_cache:_cache': ('NoneType:no-source', 'd296e97fa6155ca5'),
    'jax._src.compilation_cache:_cache_checked': 'bool:no-source',
    'jax._src.compilation_cache:_cache_initialized': 'bool:no-source',
    'jax._src.compilation_cache:_cache_used': 'bool:no-source',
    'jax._src.compilation_cache:_get_cache': '6020e09317156271',
    'jax._src.compilation_cache:_initialize_cache': 'ead16c3d7c0d0047',
    'jax._src.compilation_cache:get_executable_and_time': '8729ac331b198794',
    'jax._src.compilation_cache:is_cache_used': '4b0482cad7e4c842',
    'jax._src.compilation_cache:put_executable_and_time': 'e7c1f7f18b5ef3c6',
    'jax._src.compilation_cache:reset_cache': '0bc5055ea867894b',
    'jax._src.compiler:_cache_write': '60ba8934e2c71f51',
    'jax._src.config:State.__call__': '95b6845abd7c2abd',
    'jax._src.config:State.__init__': '6923908c4f67d1a0',
    'jax._src.config:default_matmul_precision': 'builtin:default_matmul_precision',
    'jax._src.config:persistent_cache_min_compile_time_secs': 'builtin:persistent_cache_min_compile_time_secs',
    'jax._src.distributed:State.initialize': '86531b48952dda2c',
    'jax._src.distributed:State.shutdown': '4b22f334885e348d',
    'jax._src.distributed:global_state': 'c4e12380594d539d',
    'jax._src.interpreters.pxla:ExecuteReplicated.__init__': 'b6dabeada2bd47e5',
    'jax._src.interpreters.pxla:MeshExecutable.__init__': 'e6b7762b2cf13082',
    'jax._src.interpreters.pxla:UnloadedMeshExecutable.build_unsafe_call': 'fe0004541cdfea14',
    'jax._src.interpreters.pxla:UnloadedMeshExecutable.from_hlo': 'd012e6f49b3cc9dc',
    'jax._src.interpreters.pxla:UnloadedMeshExecutable.load': '144059486b05fcaa',
    'jax._src.interpreters.pxla:_get_layouts_from_executable': '12da7cf557c87e75',
    'jax._src.interpreters.pxla:get_dispatch_layouts': 'a66caf96e7e6de7d',
    'jax._src.interpreters.pxla:is_default_layout': 'builtin:is_default_layout',
    'jax._src.lax.linalg:geqrf': '4fc176477b6b0d78',
    'jax._src.stages:Compiled.__call__': '731c7621cbbf9e07',
    'jax._src.stages:Compiled.__init__': 'd2cf99767988f574',
    'jax._src.stages:make_args_info': 'd8fea01ffa6833d9',
    'jax._src.xla_bridge:backends_are_initialized': '9440abf1c21ff407',
}
