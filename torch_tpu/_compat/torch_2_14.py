"""Fingerprints of the PyTorch 2.14 code each patch was written for (torch_tpu._compat).

Recorded with `python -m torch_tpu._compat --write` on torch 2.14.1. 64
targets are the 2.13 code unchanged (the same fingerprint as torch_2_13.py);
the 21 that changed were read against their patches:
signatures that only gained annotations or comments
(`_TorchCompileInductorWrapper.__call__`, `aot_autograd`,
`_setup_privateuseone_for_python_backend`), keyword arguments
the wrappers pass through (`_optimize`: `shapes_spec` renamed
`dynamic_shapes`; `CheckFunctionManager.__init__`: `guard_build_local_state`;
`Tensor.__dlpack__`: `read_only`), bodies the wrappers call unchanged
(`_TorchDynamoContext.__call__`, `CompilePackage.install`,
`load_guard_manager`, `serialize_guards`, `innermost_fn`), and reads whose
use here is the same (`register_backend` by name, `FakeTensorMode`
keywords, `elementwise_dtypes` (docstring only), `int_oo`, `GraphPickler`,
the post-autograd decompositions (one more op kept: linalg_vector_norm)).

`autograd_cache_key` gained a fifth positional argument (`act_input_paths`),
which the 2.13 patch (compile/persist/artifacts.py, `_cache_key`) did not
take: every AOTAutograd compile would have raised TypeError, so it stayed
unrecorded (its feature off on 2.14, as the check is for) until the patch
passed its extra arguments through; recorded since.
"""

FINGERPRINTS = {
    'torch.distributed.tensor._utils:_compute_local_shape_and_global_offset': 'a9f3acf9c1fe1ae6',
    'torch._functorch._aot_autograd.autograd_cache:autograd_cache_key': '54bbe056335f53be',
    'torch._C:_accelerator_emptyCache': 'builtin:_accelerator_emptyCache() -> None',
    'torch._C:_accelerator_exchangeDevice': 'builtin:_accelerator_exchangeDevice(arg0: typing.SupportsInt | typing.SupportsIndex) -> int',
    'torch._C:_accelerator_getDeviceIndex': 'builtin:_accelerator_getDeviceIndex() -> int',
    'torch._C:_accelerator_getDeviceStats': 'builtin:_accelerator_getDeviceStats(arg0: typing.SupportsInt | typing.SupportsIndex) -> dict',
    'torch._C:_accelerator_getMemoryInfo': 'builtin:_accelerator_getMemoryInfo(arg0: typing.SupportsInt | typing.SupportsIndex) -> tuple[int, int]',
    'torch._C:_accelerator_isAllocatorInitialized': 'builtin:_accelerator_isAllocatorInitialized() -> bool',
    'torch._C:_accelerator_maybeExchangeDevice': 'builtin:_accelerator_maybeExchangeDevice(arg0: typing.SupportsInt | typing.SupportsIndex) -> int',
    'torch._C:_accelerator_resetAccumulatedStats': 'builtin:_accelerator_resetAccumulatedStats(arg0: typing.SupportsInt | typing.SupportsIndex) -> None',
    'torch._C:_accelerator_resetPeakStats': 'builtin:_accelerator_resetPeakStats(arg0: typing.SupportsInt | typing.SupportsIndex) -> None',
    'torch._C:_accelerator_setDeviceIndex': 'builtin:_accelerator_setDeviceIndex(arg0: typing.SupportsInt | typing.SupportsIndex) -> None',
    'torch._C:_accelerator_synchronizeDevice': 'builtin:_accelerator_synchronizeDevice(arg0: typing.SupportsInt | typing.SupportsIndex) -> None',
    'torch._decomp:_core_aten_decompositions_post_autograd': '8d7ff3772ee007c2',
    'torch._decomp:decomposition_table': 'dict:no-source',
    'torch._dynamo.backends.common:aot_autograd': '6b0787136abd0b4e',
    'torch._dynamo.backends.registry:_BACKENDS': 'dict:no-source',
    'torch._dynamo.backends.registry:_COMPILER_FNS': 'dict:no-source',
    'torch._dynamo.backends.registry:register_backend': 'bbd5e79b4bc60b22',
    'torch._dynamo.bytecode_transformation:_unique_id_counter': 'count:no-source',
    'torch._dynamo.callback:callback_handler': '0c9db162cefdc0eb',
    'torch._dynamo.convert_frame:ConvertFrameAssert.__call__': 'fff55260b39a556a',
    'torch._dynamo.eval_frame:_TorchDynamoContext.__call__': '274850f2b3081f46',
    'torch._dynamo.eval_frame:_optimize': '7ce92c6d71aaa80b',
    'torch._dynamo.eval_frame:innermost_fn': '608d22c209c9afc6',
    'torch._dynamo.funcname_cache:cache': 'dict:no-source',
    'torch._dynamo.guards:CheckFunctionManager': '607d2df42f819863',
    'torch._dynamo.guards:CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES': 'tuple:no-source',
    'torch._dynamo.guards:CheckFunctionManager.__init__': 'cdf968ed3839779c',
    'torch._dynamo.guards:CheckFunctionManager.serialize_guards': '87a9bbeef56c8323',
    'torch._dynamo.guards:GuardsStatePickler._unpickle_tensor': 'b1e433d1276590a6',
    'torch._dynamo.guards:_Missing': 'aa0c22bc92fdbb67',
    'torch._dynamo.guards:profile_guard_manager': 'builtin:profile_guard_manager(arg0: torch._C._dynamo.guards.RootGuardManager, arg1: object, arg2: typing.SupportsInt | typing.SupportsIndex) -> float',
    'torch._dynamo.package:CompilePackage': '5d48602fd706e5b8',
    'torch._dynamo.package:CompilePackage.code_context': 'b3b807bb67e253d6',
    'torch._dynamo.package:CompilePackage.install': '9c5ea7397b2a7e81',
    'torch._dynamo.package:DiskDynamoCache': '22f10cc6e0db93d2',
    'torch._dynamo.package:DynamoCache': '22f10cc6e0db93d2',
    'torch._dynamo.package:_DynamoCodeCacheEntry': 'dfca95220068069b',
    'torch._dynamo.package:load_guard_manager': 'f3749bff836e07cc',
    'torch._dynamo.package:load_guards_state': '08c630393a79c95f',
    'torch._dynamo.precompile_context:PrecompileContext': 'adb1be570fdea8cb',
    'torch._dynamo.source:DictGetItemSource': '820088d77c3ae8d9',
    'torch._dynamo.source:GlobalSource': '083f1f86da5a74b6',
    'torch._dynamo.symbolic_convert:get_funcname': '92c1161c4fc1edeb',
    'torch._dynamo.trace_rules:add': '487c7cee9e416651',
    'torch._dynamo.utils:counters': 'defaultdict:no-source',
    'torch._dynamo.utils:guard_failures': 'defaultdict:no-source',
    'torch._dynamo.variables.optimizer:_is_static_for_cudagraphs': '0a6a9cf94644b69e',
    'torch._dynamo:config': '47bc22fe10fc14ab',
    'torch._dynamo:optimize': '15828d0008395d99',
    'torch._functorch._aot_autograd.autograd_cache:AOTAUTOGRAD_CACHE_PREFIX': 'str:no-source',
    'torch._functorch._aot_autograd.autograd_cache:AOTAutogradCache._lookup': 'c43e144f9e517820',
    'torch._functorch._aot_autograd.autograd_cache:AOTAutogradCache._write_to_local_cache': '373a426506f26bc1',
    'torch._functorch._aot_autograd.autograd_cache:AOTAutogradCache.save': '509f45602d2f0b11',
    'torch._functorch._aot_autograd.autograd_cache:check_cacheable': '639ad04f407770c0',
    'torch._functorch._aot_autograd.autograd_cache:sanitize_gm_for_cache': 'b94f7d009738f66a',
    'torch._functorch._aot_autograd.schemas:SerializableAOTDispatchCompiler': 'ca7a2a83a4aa8d5d',
    'torch._guards:CompileContext': '2dc9cf39d3eb4e58',
    'torch._guards:TracingContext': '8b2701c84e71ee94',
    'torch._inductor.output_code:OutputCode': '6d050ef7daed6bd4',
    'torch._prims_common.wrappers:_maybe_resize_out': '149cf8724ffb3c38',
    'torch._prims_common:ELEMENTWISE_TYPE_PROMOTION_KIND': '765a69cfbfe82402',
    'torch._prims_common:elementwise_dtypes': 'c2889eec7891964c',
    'torch._prims_common:suggest_memory_format': '45d83c5a10928c3d',
    'torch._subclasses.fake_tensor:FakeTensor': '92155c0ad985bb31',
    'torch._subclasses.fake_tensor:FakeTensorMode': '3928fe9930454417',
    'torch._subclasses.fake_tensor:unset_fake_temporarily': 'eb581967cb0443df',
    'torch._tensor_str:_tensor_str': '1a38b20d97ba0738',
    'torch.compiler:is_compiling': '2b6bbc0220a54ab5',
    'torch.fx._graph_pickler:GraphPickler': '858b4942ec88142b',
    'torch.fx._graph_pickler:Options': '589b77f230e84526',
    'torch.fx._graph_pickler:_node_metadata_key_filter_safe': '6ab39796e0bd68a3',
    'torch.nn.utils.stateless:_reparametrize_module': '5bb3592995626cfc',
    'torch.storage:_StorageBase.tpu': 'absent',
    'torch.utils._python_dispatch:TorchDispatchMode': '9b894857d3219b27',
    'torch.utils._python_dispatch:_disable_current_modes': 'e83f946f5b06e23d',
    'torch.utils._sympy.numbers:int_oo': '25b370bf6da30328',
    'torch.utils.backend_registration:_setup_privateuseone_for_python_backend': '3b726fe4e0f64110',
    'torch.utils.dlpack:to_dlpack': 'builtin:_to_dlpack',
    'torch.utils:_pytree': 'module:no-source',
    'torch:Tensor.__dlpack__': 'c08da61097c3dc61',
    'torch:Tensor.__dlpack_device__': '972a7e61d2b95e70',
    'torch:UntypedStorage.resize_': 'builtin:resize_',
    'torch:_TorchCompileInductorWrapper.__call__': '99600b2ce1448e23',
    'torch:to_dlpack': 'builtin:_to_dlpack',
}
