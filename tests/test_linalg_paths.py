"""Linear algebra on every path: warm processes, torch.compile forward and backward.

- **Warm**: a second process on the cache the first one filled loads every
  LAPACK-backed op's program from the index tiers without lowering it. It
  died with SIGSEGV (jaxlib's LAPACK table is filled only by lowering); each
  index entry now records the custom calls its executable needs and the
  process is made ready for them first (`torch_tpu.cache.needs`).
- **Compiled**: `torch.compile(backend="tpu")` of each linalg op, forward
  and gradient, against PyTorch on the CPU; linalg's error checks (effect
  tokens) raise as in eager mode.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_tpu  # noqa: F401
from torch_tpu.cache import needs

L = torch.linalg


def _spd(n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g)
    return a @ a.T + torch.eye(n)


# One entry per family of LAPACK kernels (potrf, syevd, gesdd, geqrf/orgqr,
# getrf, getrf+trsm, trsm, geev) and the composites built on them.
CASES = {
    "cholesky": lambda a, b: L.cholesky(a),
    "cholesky_ex": lambda a, b: L.cholesky_ex(a)[0],
    "eigh": lambda a, b: L.eigh(a)[0],
    "eigvalsh": lambda a, b: L.eigvalsh(a),
    "svd": lambda a, b: L.svd(a)[1],
    "svdvals": lambda a, b: L.svdvals(a),
    "qr": lambda a, b: L.qr(a)[1],
    "lu_factor": lambda a, b: L.lu_factor(a)[0],
    "lu": lambda a, b: L.lu(a)[2],
    "lu_solve": lambda a, b: L.lu_solve(*L.lu_factor(a), b),
    "solve": lambda a, b: L.solve(a, b),
    "inv": lambda a, b: L.inv(a),
    "det": lambda a, b: L.det(a),
    "slogdet": lambda a, b: L.slogdet(a)[1],
    "solve_triangular": lambda a, b: L.solve_triangular(L.cholesky(a), b, upper=False),
    "cholesky_solve": lambda a, b: torch.cholesky_solve(b, L.cholesky(a)),
    "cholesky_inverse": lambda a, b: torch.cholesky_inverse(L.cholesky(a)),
    "pinv": lambda a, b: L.pinv(a),
    "matrix_norm_2": lambda a, b: L.matrix_norm(a, ord=2),
    "cond": lambda a, b: L.cond(a),
    "lstsq": lambda a, b: L.lstsq(a, b).solution,
    "matrix_power_neg": lambda a, b: L.matrix_power(a, -2),
    "eigvals": lambda a, b: L.eigvals(a).real,
    "matrix_exp": lambda a, b: L.matrix_exp(a * 0.1),
    "ldl_factor": lambda a, b: L.ldl_factor(a)[0],
    "householder_product": lambda a, b: L.householder_product(*torch.geqrf(a)),
}


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_linalg_forward_and_grad(name, fresh_dynamo, recwarn):
    f = CASES[name]
    a, b = _spd(), torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    want = f(a, b)
    got = torch.compile(f, backend="tpu")(a.to("tpu"), b.to("tpu"))
    torch.testing.assert_close(got.cpu(), want, atol=1e-3, rtol=1e-3)

    ac = a.clone().requires_grad_()
    at = a.clone().to("tpu").requires_grad_()
    try:
        f(ac, b).sum().backward()
    except (RuntimeError, NotImplementedError) as e:  # no derivative on CPU either
        with pytest.raises(Exception, match="derivative") as info:
            torch.compile(f, backend="tpu")(at, b.to("tpu")).sum().backward()
        assert "derivative" in str(e) and "derivative" in str(info.value)
    else:
        torch.compile(f, backend="tpu")(at, b.to("tpu")).sum().backward()
        torch.testing.assert_close(at.grad.cpu(), ac.grad, atol=1e-2, rtol=1e-2)
    # One program per graph: nothing ran op by op.
    assert not [w for w in recwarn if "runs op by op" in str(w.message)]


# Gradients that are not symmetric, on a general matrix (the SPD matrix above
# hides a transposed gradient), given contiguous and as a transposed view:
# PyTorch's det/slogdet factor A^T where A is contiguous, and the backward
# solves with that LU (compiled, A's own LU gave the transposed gradient).
GENERAL = {
    "det": L.det,
    "slogdet": lambda a: L.slogdet(a)[1],
    # (diagonally dominant: a positive determinant, and not symmetric)
    "logdet": lambda a: torch.logdet(a + 5 * torch.eye(a.shape[-1], device=a.device)),
    "inv": L.inv,
    "solve": lambda a: L.solve(a, torch.arange(10.0, device=a.device).reshape(5, 2)),
}


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("name", sorted(GENERAL))
def test_compiled_linalg_grad_on_a_general_matrix(name, layout, fresh_dynamo):
    f = GENERAL[name]
    a = torch.randn(5, 5, generator=torch.Generator().manual_seed(2))
    assert not torch.allclose(a, a.T)
    view = (lambda x: x) if layout == "contiguous" else (lambda x: x.mT)
    src = a if layout == "contiguous" else a.T.contiguous()  # view(src) == a
    ac = src.clone().requires_grad_()
    out = f(view(ac))
    assert out.isfinite().all()
    out.sum().backward()
    at = src.to("tpu").requires_grad_()
    torch.compile(lambda x: f(view(x)), backend="tpu")(at).sum().backward()
    torch.testing.assert_close(at.grad.cpu(), ac.grad, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("fn, api", [(L.cholesky, "linalg.cholesky"), (L.inv, "linalg.inv"),
                                     (lambda a: L.solve(a, a), "linalg.solve")])
def test_compiled_linalg_raises_as_eager(fn, api, fresh_dynamo):
    bad = {"linalg.cholesky": -torch.eye(3)}.get(api, torch.zeros(3, 3))
    with pytest.raises(torch.linalg.LinAlgError) as cpu:
        fn(bad)
    with pytest.raises(torch.linalg.LinAlgError) as tpu:
        torch.compile(fn, backend="tpu")(bad.to("tpu"))
    assert api in str(tpu.value)
    assert str(tpu.value) == str(cpu.value)


def test_unknown_custom_call_is_lowered_again():
    assert needs.prepare([]) is True
    assert needs.prepare(["TopK", "__onednn$matmul"]) is True
    before = needs.stats()["unknown"].get("some_plugin_kernel", 0)
    assert needs.prepare(["lapack_spotrf_ffi", "some_plugin_kernel"]) is False
    assert needs.stats()["unknown"]["some_plugin_kernel"] == before + 1
    assert needs.prepare(None) is False  # an entry written without the list


def test_recorded_targets_of_a_lapack_program():
    import jax
    import jax.numpy as jnp
    import numpy as np

    eye = np.eye(3, dtype=np.float32)
    exe = jax.jit(jnp.linalg.cholesky).lower(eye).compile().runtime_executable()
    assert needs.of(exe) == ["lapack_spotrf_ffi"]
    exe = jax.jit(lambda x: x * 2).lower(eye).compile().runtime_executable()
    assert needs.of(exe) == []


_WARM_SCRIPT = textwrap.dedent("""
    import json, sys, torch, torch_tpu
    sys.path.insert(0, {tests!r})
    from test_linalg_paths import CASES, _spd
    a, b = _spd().to("tpu"), torch.ones(5, 3).to("tpu")
    out = {{}}
    for name in sorted(CASES):
        out[name] = CASES[name](a, b).cpu().tolist()
    out["compiled_cholesky"] = torch.compile(CASES["cholesky"], backend="tpu")(a, b).cpu().tolist()
    s = torch_tpu.cache.stats()
    out["_stats"] = [s["eager_index"]["hits"], s["graph_disk"]["hits"],
                     s["index_needs"]["ready"], s["index_needs"]["unknown"]]
    print("RESULT" + json.dumps(out))
""")


def test_warm_process_runs_every_lapack_family(tmp_path):
    """Cold, then warm on the same directory: same values, the programs come
    from the index tiers, and the warm process does not crash."""
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("TORCH_TPU_SHARED_CACHE_DIR", None)
    script = _WARM_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)))
    runs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           text=True, timeout=600)
        assert p.returncode == 0, f"exit {p.returncode} (a signal if < 0):\n{p.stderr[-3000:]}"
        line = next(x for x in p.stdout.splitlines() if x.startswith("RESULT"))
        runs.append(json.loads(line[len("RESULT"):]))
    cold, warm = runs
    eager_hits, graph_hits, ready, unknown = warm.pop("_stats")
    cold.pop("_stats")
    assert warm == cold
    assert eager_hits > 0 and graph_hits > 0
    assert "lapack" in ready and unknown == {}
