"""Fingerprints of the JAX 0.9 code torch_tpu._compat.jax_api reads and sets.

Recorded with `python -m torch_tpu._compat --write` on jax 0.9.0 (jaxlib
0.9.0), after reading each target against its use in jax_api. The eager
index's rebuild code is 0.8's (jax_0_8.py: no get_dispatch_layouts,
auto_spmd_lowering); the rest differs from 0.10 in code jax_api does not
depend on (the arguments of a distributed client, a raise condition, a
State property). `_cache` also accepts 0.9's LRUCache (added by hand).
"""

FINGERPRINTS = {
    # None, or JAX's own file cache (LRUCache), as in jax_0_10.py
    'jax._src.compilation_cache:_cache': ('NoneType:no-source', '0f1dd072a0e90b2e'),
    'jax._src.compilation_cache:_cache_checked': 'bool:no-source',
    'jax._src.compilation_cache:_cache_initialized': 'bool:no-source',
    'jax._src.compilation_cache:_cache_used': 'bool:no-source',
    'jax._src.compilation_cache:_get_cache': '6020e09317156271',
    'jax._src.compilation_cache:_initialize_cache': 'ead16c3d7c0d0047',
    'jax._src.compilation_cache:get_executable_and_time': '8729ac331b198794',
    'jax._src.compilation_cache:is_cache_used': '4b0482cad7e4c842',
    'jax._src.compilation_cache:put_executable_and_time': 'e7c1f7f18b5ef3c6',
    'jax._src.compilation_cache:reset_cache': '7b919118b739ef92',
    'jax._src.compiler:_cache_write': '9363a37d1f09fa3d',
    'jax._src.config:State.__call__': '95b6845abd7c2abd',
    'jax._src.config:State.__init__': '6923908c4f67d1a0',
    'jax._src.config:default_matmul_precision': 'builtin:default_matmul_precision',
    'jax._src.config:persistent_cache_min_compile_time_secs': 'builtin:persistent_cache_min_compile_time_secs',
    'jax._src.distributed:State.initialize': '1f604b15a3844f30',
    'jax._src.distributed:State.shutdown': '4b22f334885e348d',
    'jax._src.distributed:global_state': 'dcc8ec51e306cb0f',
    'jax._src.interpreters.pxla:ExecuteReplicated.__init__': 'b6dabeada2bd47e5',
    'jax._src.interpreters.pxla:MeshExecutable.__init__': '069bc7144caf5f35',
    'jax._src.interpreters.pxla:UnloadedMeshExecutable.build_unsafe_call': 'fe0004541cdfea14',
    'jax._src.interpreters.pxla:UnloadedMeshExecutable.from_hlo': 'd91c25b6902b3787',
    'jax._src.interpreters.pxla:UnloadedMeshExecutable.load': '86d6cc01aa85a2ad',
    'jax._src.interpreters.pxla:_get_layouts_from_executable': '201d1de088564e05',
    'jax._src.interpreters.pxla:get_dispatch_layouts': 'absent',
    'jax._src.interpreters.pxla:is_default_layout': 'builtin:is_default_layout',
    'jax._src.lax.linalg:geqrf': '4fc176477b6b0d78',
    'jax._src.stages:Compiled.__call__': '731c7621cbbf9e07',
    'jax._src.stages:Compiled.__init__': 'd2cf99767988f574',
    'jax._src.stages:make_args_info': 'd8fea01ffa6833d9',
    'jax._src.xla_bridge:backends_are_initialized': '9440abf1c21ff407',
}
