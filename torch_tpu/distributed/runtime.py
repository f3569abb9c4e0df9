"""The multi-process JAX runtime under the "tpu" process group.

One process per device: every process sees exactly one `tpu` device
(`tpu:0`), and the devices of all processes form one global device list
(`jax.devices()`), so a collective is an XLA collective over a mesh of the
group's devices. On a Cloud TPU those are the chips and their interconnect;
on the host CPU (XLA:CPU), JAX runs the collectives through gloo over TCP.

`initialize()` starts JAX's distributed runtime (`jax.distributed`): a
coordination service in process 0 that the others connect to. Under
`init_process_group("tpu")` it is called with the c10d store, and the
coordinator's address travels through that store (process 0 picks a free
port next to the address the store reached it at), so no second port has
to be configured. `TORCH_TPU_COORDINATOR_ADDRESS=host:port` (or JAX's own
`JAX_COORDINATOR_ADDRESS`) sets it explicitly instead, which a multi-host
launch with a firewall may need.

JAX must start its runtime before its devices. If this process already
touched the device (e.g. `torch.manual_seed` asked for the device count)
but holds no device arrays, the device client is restarted; if tensors
already live on the device, initialization fails with a clear error.
"""

from __future__ import annotations

import atexit
import ctypes
import ipaddress
import sys
import os
import socket
import threading
import time

import jax

from .._compat import jax_api
from ..runtime import platform, programs
from ..runtime.switches import switch_raw
from .launch import set_tpu_launch_env

_lock = threading.RLock()
_state = None  # _Runtime once initialized

COORDINATOR_KEY = "torch_tpu/jax_coordinator"


class _Runtime:
    def __init__(self, process_id, num_processes, coordinator, distributed):
        self.process_id = process_id
        self.num_processes = num_processes
        self.coordinator = coordinator
        self.distributed = distributed   # False for a single process (no jax.distributed)
        self.devices = None              # global rank -> jax device
        self.broken = None               # the error that made the runtime unusable


def is_initialized() -> bool:
    return _state is not None


def state() -> _Runtime:
    if _state is None:
        raise RuntimeError(
            "torch_tpu.distributed is not initialized: call "
            "torch.distributed.init_process_group('tpu') first")
    return _state


def broken_by() -> BaseException | None:
    """The error that made the runtime unusable (None while it is usable or not
    initialized); the process group's worker checks it before each collective."""
    rt = _state
    return None if rt is None else rt.broken


def _env_int(name, default=None):
    v = switch_raw(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"{name}={v!r} is not an integer") from None


def _env_float(name, default):
    v = switch_raw(name)
    if v is None or v == "":
        return default
    try:
        return float(v)
    except ValueError:
        raise ValueError(f"{name}={v!r} is not a number") from None


def _backends_started() -> bool:
    return jax_api.backends_started()


def _restart_device_client():
    """Drop the JAX clients this process created before the runtime existed.

    Only allowed while no device array exists: the new clients see the
    global device list, and every cached executable of the old ones goes.
    """
    live = [a for a in jax.live_arrays() if not a.is_deleted()]
    if live:
        raise RuntimeError(
            "init_process_group('tpu') must run before any tensor is placed on the tpu "
            f"device: this process already holds {len(live)} device array(s), and JAX's "
            "multi-process runtime can only start before its devices are in use. Move "
            "init_process_group (or torch_tpu.distributed.initialize()) to the top of the "
            "script, before model.to('tpu').")
    from jax.extend.backend import clear_backends

    clear_backends()
    _clear_torch_tpu_caches()


def _clear_torch_tpu_caches():
    platform.platform.cache_clear()
    platform.devices.cache_clear()
    programs.clear()  # every program, compiled graphs included


def _reachable_host(master_addr: str | None) -> str:
    """An address of this host that the other processes can reach."""
    if not master_addr:
        return "127.0.0.1"
    try:
        infos = socket.getaddrinfo(master_addr, None)
        ip = ipaddress.ip_address(infos[0][4][0])
        if ip.is_loopback:
            return "127.0.0.1"
    except (OSError, ValueError, IndexError):
        pass
    # The interface this host would use to reach the store's host.
    for family, addr in ((socket.AF_INET, (master_addr, 1)), (socket.AF_INET6, (master_addr, 1))):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(addr)
                host = s.getsockname()[0]
                return f"[{host}]" if family == socket.AF_INET6 else host
        except OSError:
            continue
    return socket.gethostname()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _explicit_coordinator():
    return (switch_raw("TORCH_TPU_COORDINATOR_ADDRESS")
            or os.environ.get("JAX_COORDINATOR_ADDRESS") or None)


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids=None, *, store=None,
               timeout: float | None = None) -> _Runtime:
    """Start JAX's multi-process runtime for this process (idempotent).

    Arguments default to torchrun's environment (RANK, WORLD_SIZE,
    LOCAL_RANK). The coordinator address comes from `coordinator_address`,
    else TORCH_TPU_COORDINATOR_ADDRESS / JAX_COORDINATOR_ADDRESS, else
    through `store` (a c10d Store every process shares: process 0 publishes
    the address it listens on), else MASTER_ADDR and MASTER_PORT + 1.

    `timeout` (seconds) bounds the wait for every process to connect.
    Environment: TORCH_TPU_HEARTBEAT_TIMEOUT (seconds without a heartbeat
    before JAX declares a process dead, default 100) and
    TORCH_TPU_SHUTDOWN_TIMEOUT (how long exit waits for the others, 300).
    """
    global _state
    with _lock:
        if num_processes is None:
            num_processes = _env_int("WORLD_SIZE", 1)
        if process_id is None:
            process_id = _env_int("RANK", 0)
        if _state is not None:
            if (_state.process_id, _state.num_processes) != (process_id, num_processes):
                raise RuntimeError(
                    f"torch_tpu.distributed is already initialized as process "
                    f"{_state.process_id} of {_state.num_processes}; cannot re-initialize as "
                    f"process {process_id} of {num_processes}")
            return _state
        if not (0 <= process_id < num_processes):
            raise ValueError(f"process_id {process_id} is not in [0, {num_processes})")
        gs = jax_api.distributed_state()
        if gs is not None and gs.client is not None:
            # Someone (the user, a launcher) started jax.distributed already.
            if gs.num_processes != num_processes or gs.process_id != process_id:
                raise RuntimeError(
                    f"jax.distributed was initialized as process {gs.process_id} of "
                    f"{gs.num_processes}, but the process group is rank {process_id} of "
                    f"{num_processes}")
            _state = _Runtime(process_id, num_processes, gs.coordinator_address, True)
            _clear_torch_tpu_caches()
            _finish(_state)
            return _state
        timeout = 300.0 if timeout is None else float(timeout)
        plat = platform.platform_hint()
        if num_processes == 1:
            _state = _Runtime(0, 1, None, False)
            _finish(_state)
            return _state
        if plat == "tpu" and _env_int("LOCAL_WORLD_SIZE", 1) > 1 and not _backends_started():
            set_tpu_launch_env(local_rank=_env_int("LOCAL_RANK", 0),
                               local_world_size=_env_int("LOCAL_WORLD_SIZE", 1),
                               only_if_unset=True)
        if _backends_started():
            _restart_device_client()
        # One device per process: XLA:CPU would otherwise make as many devices
        # as XLA_FLAGS asks for in every process.
        jax.config.update("jax_num_cpu_devices", 1)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if local_device_ids is None and plat == "gpu":
            lr = _env_int("LOCAL_RANK")
            if lr is not None:
                local_device_ids = [lr]
        address = coordinator_address or _explicit_coordinator()
        if address is None and store is not None:
            address = _exchange_address(store, process_id, timeout)
        if address is None:
            master = os.environ.get("MASTER_ADDR")
            port = _env_int("MASTER_PORT")
            if master is None or port is None:
                raise RuntimeError(
                    "torch_tpu.distributed.initialize: no coordinator address. Run under "
                    "torchrun, pass coordinator_address='host:port', or set "
                    "TORCH_TPU_COORDINATOR_ADDRESS")
            address = f"{master}:{port + 1}"
        heartbeat = int(_env_float("TORCH_TPU_HEARTBEAT_TIMEOUT", 100))
        shutdown = int(_env_float("TORCH_TPU_SHUTDOWN_TIMEOUT", 300))
        t0 = time.perf_counter()
        try:
            jax.distributed.initialize(
                coordinator_address=address, num_processes=num_processes,
                process_id=process_id, local_device_ids=local_device_ids,
                cluster_detection_method="deactivate",
                initialization_timeout=max(1, int(timeout)),
                heartbeat_timeout_seconds=max(1, heartbeat),
                shutdown_timeout_seconds=max(1, shutdown))
        except Exception as e:
            raise RuntimeError(
                f"torch_tpu.distributed: process {process_id} of {num_processes} could not "
                f"join the JAX coordination service at {address} within {timeout:.0f} s "
                f"({type(e).__name__}: {e})") from e
        _clear_torch_tpu_caches()
        # Runs before JAX's own exit handler (registered earlier, atexit is LIFO).
        atexit.register(_at_exit)
        _state = _Runtime(process_id, num_processes, address, True)
        _state.init_seconds = time.perf_counter() - t0
        _finish(_state)
        return _state


def _exchange_address(store, process_id, timeout):
    if process_id == 0:
        host = _reachable_host(os.environ.get("MASTER_ADDR"))
        port = _env_int("TORCH_TPU_COORDINATOR_PORT") or _free_port()
        address = f"{host}:{port}"
        store.set(COORDINATOR_KEY, address)
        return address
    from datetime import timedelta

    old = store.timeout
    try:
        store.set_timeout(timedelta(seconds=timeout))
        return store.get(COORDINATOR_KEY).decode()
    except Exception as e:
        raise RuntimeError(
            f"torch_tpu.distributed: process {process_id} did not receive the coordinator "
            f"address from process 0 within {timeout:.0f} s ({e})") from e
    finally:
        try:
            store.set_timeout(old)
        except Exception:  # pragma: no cover
            pass


def _finish(rt: _Runtime):
    plat = platform.platform()
    local = platform.devices()
    if rt.distributed:
        by_proc = {}
        for d in jax.devices(plat):
            by_proc.setdefault(d.process_index, d)
        missing = [r for r in range(rt.num_processes) if r not in by_proc]
        if missing:
            raise RuntimeError(f"torch_tpu.distributed: no device for process(es) {missing}")
        mine = by_proc[rt.process_id]
        if local[0] != mine:  # pragma: no cover - JAX orders local devices first
            raise RuntimeError("torch_tpu.distributed: tpu:0 is not this process's device")
        rt.devices = [by_proc[r] for r in range(rt.num_processes)]
    else:
        rt.devices = [local[0]]
    rt.local_device_count = len(local)


def device_of(rank: int):
    """The JAX device of global rank `rank` (each process has one)."""
    return state().devices[rank]


def mark_broken(err: BaseException) -> None:
    rt = _state
    if rt is not None and rt.broken is None:
        rt.broken = err


_leaked: list = []


def _at_exit():
    """After a failed collective, exit without JAX's shutdown barrier.

    The barrier waits (TORCH_TPU_SHUTDOWN_TIMEOUT, default 300 s) for every
    process, including a dead or hung one, and then aborts. A process whose
    group already failed skips it: the coordination client and service are
    detached from JAX (and deliberately never destroyed, which would run the
    same barrier).
    """
    rt = _state
    if rt is None or rt.broken is None or not rt.distributed:
        return
    gs = jax_api.distributed_state()
    if gs is None:
        return  # JAX's state changed: its shutdown barrier runs
    for name in ("preemption_sync_manager", "client", "service"):
        obj = getattr(gs, name, None)
        if obj is not None:
            _leaked.append(obj)
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
            setattr(gs, name, None)
    print("[torch_tpu] exiting without JAX's distributed shutdown barrier: the tpu process "
          f"group failed earlier ({str(rt.broken).splitlines()[0][:200]})", file=sys.stderr,
          flush=True)


def shutdown() -> None:
    """Stop the JAX runtime (all processes must call it); rarely needed."""
    global _state
    with _lock:
        if _state is None:
            return
        if _state.distributed and _state.broken is None:
            jax.distributed.shutdown()
        _state = None
