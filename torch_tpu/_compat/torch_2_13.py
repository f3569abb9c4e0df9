"""Fingerprints of the PyTorch 2.13 code each patch was written for (torch_tpu._compat).

Recorded with `python -m torch_tpu._compat --write` on torch 2.13.0, after
reading each target against its patch. A target not listed here (or listed
with another fingerprint) turns its feature off with one warning.
"""

FINGERPRINTS = {
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
    'torch._dynamo.convert_frame:ConvertFrameAssert.__call__': 'fff55260b39a556a',
    'torch._dynamo.eval_frame:_TorchDynamoContext.__call__': 'ec8473e8922ba677',
    'torch._dynamo.eval_frame:_optimize': '3a5b9ffdc2e1022a',
    'torch._dynamo.guards:CheckFunctionManager.__init__': 'f72e097630935923',
    'torch._dynamo.guards:CheckFunctionManager.serialize_guards': 'b48bad89b57a545a',
    'torch._dynamo.guards:GuardsStatePickler._unpickle_tensor': 'b1e433d1276590a6',
    'torch._dynamo.guards:profile_guard_manager': 'builtin:profile_guard_manager(arg0: torch._C._dynamo.guards.RootGuardManager, arg1: object, arg2: typing.SupportsInt | typing.SupportsIndex) -> float',
    'torch._dynamo.package:CompilePackage.code_context': 'b3b807bb67e253d6',
    'torch._dynamo.package:CompilePackage.install': '8fe12d4381bd744e',
    'torch._dynamo.package:DynamoCache': '22f10cc6e0db93d2',
    'torch._dynamo.package:load_guard_manager': 'c36a47bd506ad0f7',
    'torch._dynamo.package:load_guards_state': '08c630393a79c95f',
    'torch._dynamo.symbolic_convert:get_funcname': '92c1161c4fc1edeb',
    'torch._dynamo.variables.optimizer:_is_static_for_cudagraphs': '0a6a9cf94644b69e',
    'torch._dynamo:optimize': '15828d0008395d99',
    'torch._functorch._aot_autograd.autograd_cache:AOTAutogradCache._lookup': 'c43e144f9e517820',
    'torch._functorch._aot_autograd.autograd_cache:AOTAutogradCache._write_to_local_cache': '373a426506f26bc1',
    'torch._functorch._aot_autograd.autograd_cache:AOTAutogradCache.save': '509f45602d2f0b11',
    'torch._functorch._aot_autograd.autograd_cache:autograd_cache_key': '84310e109dca57b2',
    'torch._tensor_str:_tensor_str': '1a38b20d97ba0738',
    'torch.compiler:is_compiling': '2b6bbc0220a54ab5',
    'torch.storage:_StorageBase.tpu': 'absent',
    'torch.utils.dlpack:to_dlpack': 'builtin:_to_dlpack',
    'torch:Tensor.__dlpack__': 'a27f2a53f85deb93',
    'torch:Tensor.__dlpack_device__': '972a7e61d2b95e70',
    'torch:UntypedStorage.resize_': 'builtin:resize_',
    'torch:_TorchCompileInductorWrapper.__call__': 'ef772c2bc1b546bf',
    'torch:to_dlpack': 'builtin:_to_dlpack',
}
