"""Effectful ops in a compiled graph: run on the host, after the program.

AOTAutograd threads ops with side effects through effect tokens:
``torch.linalg.cholesky`` traces to ``linalg_cholesky_ex`` plus
``with_effects(token, aten._linalg_check_errors, info, "linalg.cholesky",
is_matrix=True)``, the op that raises `torch.linalg.LinAlgError` when the
factorization failed. The graph takes a token input and returns a token
output; AOTAutograd's runtime wrapper passes None for the one and drops the
other, so the tokens carry no data at run time.

An XLA program cannot raise. `hoist` rewrites the graph once, before it is
lowered: each ``with_effects`` of an op that returns nothing is removed,
its tensor arguments become extra outputs of the graph (computed by the
program like any other), and the token output is the token input again.
After each run, `run_hoisted` calls the ops, in graph order, on those
values, eagerly on the tpu device: the same op, error type and text as in
eager mode, and the same host wait as eager's check. An effectful op that
returns a value cannot be hoisted; the graph then runs op by op (the
backend's eager fallback), which calls ``with_effects`` as PyTorch does.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

with_effects = torch.ops.higher_order.with_effects


class Hoisted:
    """One effectful call taken out of a graph: `op(*args, **kwargs)`, each
    argument a slot: `("out", k)`, the graph's output k (one of the extra
    outputs `hoist` appended), or `("const", value)`."""

    __slots__ = ("op", "args", "kwargs")

    def __init__(self, op: Any, args: tuple, kwargs: dict):
        self.op = op
        self.args = args
        self.kwargs = kwargs


def token_placeholders(gm: torch.fx.GraphModule) -> set:
    """Placeholders passed as the token argument of a `with_effects` call."""
    tokens = set()
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is with_effects and n.args \
                and isinstance(n.args[0], torch.fx.Node) and n.args[0].op == "placeholder":
            tokens.add(n.args[0])
    return tokens


def hoist(gm: torch.fx.GraphModule) -> tuple[list[Hoisted], set, int]:
    """Rewrite `gm` in place (see the module docstring). Returns the hoisted
    calls, the token placeholders and the graph's output count before the
    rewrite (the extra outputs follow it)."""
    graph = gm.graph
    tokens = token_placeholders(gm)
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    outs = output.args[0]
    single = not isinstance(outs, (list, tuple))
    outs = [outs] if single else list(outs)
    n_before = len(outs)
    calls = [n for n in graph.nodes if n.op == "call_function" and n.target is with_effects]
    if not calls:
        return [], tokens, n_before
    hoisted: list[Hoisted] = []
    for n in calls:
        token, op, *op_args = n.args
        returns = getattr(getattr(op, "_schema", None), "returns", None)
        users = list(n.users)
        if returns is None or len(returns) != 0 or not all(
                u.target is operator.getitem and u.args[1] == 0 for u in users):
            continue  # returns a value: left in place (the graph runs op by op)
        def slot(a, outs=outs):  # this iteration's list (`outs` is rebound below)
            if isinstance(a, torch.fx.Node):
                outs.append(a)
                return ("out", len(outs) - 1)
            return ("const", a)

        args = tuple(slot(a) for a in op_args)
        kwargs = {k: slot(v) for k, v in n.kwargs.items()}
        hoisted.append(Hoisted(op, args, kwargs))
        for u in users:
            outs = [token if o is u else o for o in outs]
            u.replace_all_uses_with(token)
            graph.erase_node(u)
        graph.erase_node(n)
    if hoisted:
        output.args = (tuple(outs),) if not single or len(outs) > 1 else (outs[0],)
        graph.lint()
        gm.recompile()
    return hoisted, tokens, n_before


def run_hoisted(results: list, hoisted: list[Hoisted], n_before: int) -> list:
    """Call each hoisted op on the values the graph computed for it; the
    results without those values (the first `n_before`)."""
    def value(s):
        return results[s[1]] if s[0] == "out" else s[1]

    for h in hoisted:
        h.op(*[value(s) for s in h.args], **{k: value(s) for k, s in h.kwargs.items()})
    del results[n_before:]
    return results
