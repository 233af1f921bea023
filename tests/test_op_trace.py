"""The light tracer of decompositions (lazy/lower/op_trace.py) gives the steps make_fx gives (Note [Tracing
decompositions without FX]), for every decomposition the training models and a set of scalar-taking ops lower."""
import pytest
import torch
import torch.nn.functional as F

import lazy
import lazy.lower.decompose as D
from lazy.lower import op_trace

from models import MODELS, batch, loss_fn


def _canon(d):
    """A decomposition as plain data: each step's target, arguments, metadata, and the result."""
    if d is None:
        return None

    def c(v):
        if isinstance(v, D.ScalarRef):
            return ("scalar", v.k)
        if isinstance(v, (list, tuple)):
            return (type(v).__name__,) + tuple(c(x) for x in v)
        if isinstance(v, dict):
            return tuple(sorted((k, c(x)) for k, x in v.items()))
        return v
    return [(t, c(a), c(k), m, multi) for t, a, k, m, multi in d.steps], c(d.result)


@pytest.fixture
def decomposed_nodes(monkeypatch):
    """The nodes lowering decomposes while the test runs (one per signature)."""
    nodes = {}
    inner = D.decompose

    def collect(node):
        if node.op in D.table():
            nodes.setdefault((node.op, node.args, node.kwargs, tuple((i.shape, i.dtype) for i in node.inputs)), node)
        return inner(node)
    monkeypatch.setattr(D, "decompose", collect)
    import lazy.lower.graph as G
    monkeypatch.setattr(G, "decompose", collect, raising=False)
    return nodes


def _same_both_ways(nodes, monkeypatch):
    assert nodes
    for node in nodes.values():
        monkeypatch.setattr(D, "LIGHT_TRACE", True)
        light = _canon(D._trace(node))
        monkeypatch.setattr(D, "LIGHT_TRACE", False)
        fx = _canon(D._trace(node))
        assert light == fx, node.op


def test_training_steps_decompose_alike(decomposed_nodes, monkeypatch, cpp_compiler):
    for kind in sorted(MODELS):
        torch.manual_seed(0)
        model = MODELS[kind]().to("lazy")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for i in range(2):
            x, y = batch(kind, i, "lazy")
            loss = loss_fn(kind, model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            lazy.mark_step()
    _same_both_ways(decomposed_nodes, monkeypatch)


def test_ops_with_runtime_scalars_decompose_alike(decomposed_nodes, monkeypatch, cpp_compiler):
    x = torch.randn(6, 5).to("lazy")
    y = torch.randn(6, 5).abs().to("lazy") + 0.1
    outs = [F.leaky_relu(x, 0.2), F.elu(x, 0.7), F.softplus(x, 2.0, 10.0), F.hardtanh(x, -0.3, 0.4),
            torch.nan_to_num(x, 0.5, 2.0, -2.0), torch.logit(y, 1e-4), torch.xlogy(y, y),
            torch.linalg.vector_norm(x, 3.0, dim=1), torch.var_mean(x, 1, correction=2), x.std(0),
            torch.addmm(x, x.t()[:5, :6].t()[:6, :5] @ torch.eye(5).to("lazy"), torch.eye(5).to("lazy"),
                        beta=0.5, alpha=2.0),
            torch.logsumexp(x, 1), F.mse_loss(x, y), F.hardswish(x), F.mish(x), torch.hypot(x, y), x.frac(),
            F.layer_norm(x, (5,), eps=1e-3), F.group_norm(x.reshape(2, 3, 5), 3)]
    lazy.mark_step()
    assert all(o is not None for o in outs)
    _same_both_ways(decomposed_nodes, monkeypatch)


def test_what_the_light_tracer_cannot_follow_is_traced_by_make_fx():
    """A tensor the function did not get from its inputs nor make with an op is a constant to make_fx: the light
    tracer says so (Untraceable), and decomposition traces with make_fx instead."""
    constant = torch.ones(3, device="meta")
    with pytest.raises(op_trace.Untraceable):
        op_trace.trace(lambda a: a + constant, [torch.empty(3, device="meta")], D.table())
    steps = op_trace.trace(lambda a: torch.ops.aten.add.Tensor(a, 2 * a), [torch.empty(3, device="meta")], D.table())
    assert [s.op for s in steps] == ["placeholder", "call_function", "call_function", "output"]
    assert steps[-1].args[0] is steps[2] and steps[2].args == (steps[0], steps[1])
