// The C++ kernel: an op's cache hits run from the dispatcher, in front of
// its Python kernel (register.cpp puts it there; kernel.cpp runs it).
//
// register_kernel(schema_name, overload, op, name, kinds) puts a boxed C++
// kernel in front of an op's Python kernel (runtime/executor.py _Runner):
// the Python kernel moves to the PrivateUse2 key, which no tensor carries,
// and this kernel, at PrivateUse1, runs a call itself only when it is a hit
// of the executor's cache whose entry the executor marked fast
// (executor._fast_spec): plain tpu tensors, Python scalars and static values
// in; tensors out. It builds the executor's key (the same tuple as
// _Runner.__call__), finds the entry in the same LRU, updates the same
// statistics, calls the executable as call() does and makes the result
// tensors as wrap() does. In fused mode it records the hit instead
// (fused.record_native: the same recording as the executor's, without its
// Python path) and wraps the result nodes. Anything else (a miss, complex32
// and lazy conj/neg views, CPU tensors, a recording that would run the trace,
// an entry still compiling or an input still being computed in the
// background, CONTEXT.launch_blocking, any Python error) redispatches to the Python
// kernel, which stays the definition of behaviour.
#pragma once

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "classify.h"
#include "entry.h"
#include "memo.h"
#include "native.h"

#pragma GCC visibility push(hidden)
namespace torch_tpu::native {

enum Conv : int { C_TENSOR, C_SCALAR, C_SCALAR1, C_STATIC_INT, C_STATIC_FLOAT, C_STATIC_BOOL,
                  C_STATIC_STR, C_STATIC_DTYPE, C_STATIC_INTLIST, C_STATIC_SCALAR };

struct ArgSpec {
  long kind;
  int conv;
};

// What setup_kernel() (register.cpp) gives the kernel; g_spec_fn is in entry.h.
extern PyObject* g_context;          // runtime.context.CONTEXT, the eager context
// Offsets of its `fused`, `launch_blocking` and `opt_level` slots: read there
// on every call, with no attribute or dict lookup.
extern Py_ssize_t g_ctx_fused, g_ctx_launch_blocking, g_ctx_opt_level;
extern PyObject* g_cache;            // programs.CACHE: the program LRU (an OrderedDict)
extern PyObject* g_record_native;    // fused.record_native
extern PyObject* g_narrow;           // scalars.narrow
extern PyObject* g_precision_state;  // CONTEXT.precision_state: jax config state (.value) or None
extern PyObject* g_precision_fn;     // CONTEXT.precision_token: precision.cache_token
extern PyObject* g_array_type;       // jax's ArrayImpl
extern bool g_memo_on;               // fastpath.MEMO (TORCH_TPU_NATIVE_MEMO=0: off)

// A slot of the eager context (borrowed; null, with no error set, if unset).
inline PyObject* ctx_slot(Py_ssize_t offset) {
  return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(g_context) + offset);
}

struct FastKernel;
// Every registered kernel (they live as long as the library).
extern std::vector<FastKernel*> g_kernels;
extern const at::Tensor kNotGiven;  // run()'s "this argument is in iv[]" marker
extern uint64_t g_pending_hits;     // hits not yet handed to programs.STATS

struct FastKernel final : c10::OperatorKernel {
  PyObject* op;    // owned: the key's head
  PyObject* name;  // owned: str(op)
  uint64_t hits = 0;  // hits since the last take_stats()
  std::vector<ArgSpec> args;
  size_t n_returns;
  std::unordered_map<MemoKey, Memo, MemoKeyHash> memo;  // recent hits (memo.h)

  // kernel.cpp defines run() and, inline for run() alone, the rest.

  // 1: done, results in `made`; 0: the Python kernel's call; -1: a Python
  // error (cleared by the caller, which then also hands the call to Python).
  // The call's arguments: `tens[i]`, unless it is &kNotGiven, is argument i
  // as the unboxed kernel received it (a tensor, or null for None); else iv[i].
  int run(const c10::IValue* iv, const at::Tensor* const* tens, std::vector<at::Tensor>& made);

  // A hit the memo knows: the entry's executable on this call's arrays.
  int run_memo(Memo& m, MemoCall& mc, std::vector<at::Tensor>& made, bool fused_on);

  void remember(MemoCall& mc, PyObject* entry, PyObject* tkey, FastSpec* spec);

  // The call's memo key (1), or 0 where the memo cannot describe it, or -1.
  int describe(const c10::IValue* iv, const at::Tensor* const* tens, MemoCall& m);

  int memo_tensor(MemoCall& m, const ArgSpec& a, const at::Tensor* t);

  int memo_value(MemoCall& m, const ArgSpec& a, const c10::IValue& v);

  int argument(Classifier& c, const ArgSpec& a, const c10::IValue& v);

  // A tensor argument (null: None).
  int tensor_arg(Classifier& c, const ArgSpec& a, const at::Tensor* t);

  // The key's context parts, as _Runner.__call__ appends them.
  int finish_key(long device, PyObject* key);

  // A cache hit: its executable run (strict mode) or the op recorded (fused
  // mode) on the call's DeviceData and Scalars (`dyn`; null: none), the
  // entry's place in the LRU order kept (unless `cache` is null), the hit
  // counted and the result tensors made.
  int hit(bool fused_on, PyObject* entry, FastSpec* spec, PyObject* const* datas, Py_ssize_t ns,
          PyObject* dyn, long device, PyObject* cache, PyObject* tkey,
          std::vector<at::Tensor>& made);

  // Fused mode's hit: fused.record_native(entry, datas, dyn, device, name)
  // records the op and returns (result nodes, ()) as the executable returns
  // its arrays; 0 (nothing recorded) where the executor's path must decide
  // (no program, or the recording would run the trace and may raise the
  // recorded ops' errors, which reach the user from there).
  int record(PyObject* entry, PyObject* const* datas, Py_ssize_t ns, PyObject* dyn, long device,
             PyObject** result);

  int execute(FastSpec* spec, PyObject* const* datas, Py_ssize_t ns, PyObject* dyn, long device,
              PyObject** result);

  // The entry's place in the LRU order, as _Runner.__call__ keeps it on a
  // hit. The hit counts stay in C++ (this kernel's `hits`, g_pending_hits)
  // until programs.CacheStats reads them (take_stats): no Python objects per
  // call.
  int move_to_end(PyObject* cache, PyObject* tkey);

  int push_results(FastSpec* spec, PyObject* result, long device, std::vector<at::Tensor>& made);

  // Run the call in C++ (true, results in `made`), or false: the caller
  // hands it to the Python kernel.
  bool try_run(const c10::IValue* iv, const at::Tensor* const* tens, std::vector<at::Tensor>& made) {
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = run(iv, tens, made);
    if (rc < 0) PyErr_Clear();  // the Python kernel redoes the call and raises its error
    if (rc > 0) ++n_kernel, n_unboxed += tens != nullptr;
    else ++n_kernel_fallback;
    PyGILState_Release(gil);
    return rc > 0;
  }

  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet, torch::jit::Stack* stack) {
    std::vector<at::Tensor> made;
    if (try_run(stack->data() + (stack->size() - args.size()), nullptr, made)) {
      torch::jit::drop(*stack, args.size());
      for (auto& t : made) torch::jit::push(*stack, std::move(t));
      return;
    }
    handle.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse2), stack);
  }
};

}  // namespace torch_tpu::native
#pragma GCC visibility pop
