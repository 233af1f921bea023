"""Recording with symbolic sizes (lazy/capture/symbolic.py): one recording of a training step's ops, replayed on
lazy tensors of other sizes, equals eager at each; sizes that break a guard of the recording are refused."""
import pytest
import torch
import torch.nn as nn

from lazy.capture.symbolic import Recorder, SymLazy
from models import TinyGPT, loss_fn


def static_of(rec):
    return {rec.id_of(t): t for t in rec.tensors if not isinstance(t, SymLazy)}


def test_an_mlp_step_recorded_once_replays_at_other_batch_sizes():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 5))
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 5))
    model.load_state_dict(ref.state_dict())
    model = model.to("lazy")
    rec = Recorder()
    xs = rec.input("x", torch.randn(8, 20).to("lazy"), [0])
    ys = rec.input("y", torch.randint(0, 5, (8,)).to("lazy"), [0])
    assert isinstance(xs.shape[0], torch.SymInt)
    loss = nn.functional.cross_entropy(model(xs), ys)
    loss.backward()
    ids = [rec.id_of(loss)] + [rec.id_of(p.grad) for p in model.parameters()]
    for b in (8, 13, 1, 3):
        x, y = torch.randn(b, 20), torch.randint(0, 5, (b,))
        env = rec.instantiate({"x": x.to("lazy"), "y": y.to("lazy")}, static_of(rec))
        ref.zero_grad()
        want = nn.functional.cross_entropy(ref(x), y)
        want.backward()
        got = [env[i].cpu() for i in ids]
        torch.testing.assert_close(got[0], want.detach())
        for g, p in zip(got[1:], ref.parameters()):
            torch.testing.assert_close(g, p.grad)


def gpt_recording(dynamic):
    torch.manual_seed(0)
    ref = TinyGPT(vocab=17, d=16, heads=2, layers=2, block=16)
    model = TinyGPT(vocab=17, d=16, heads=2, layers=2, block=16)
    model.load_state_dict(ref.state_dict())
    model = model.to("lazy")
    rec = Recorder()
    x, y = batch(4, 8)
    xs, ys = rec.input("x", x.to("lazy"), dynamic), rec.input("y", y.to("lazy"), dynamic)
    params = {n: rec.input(n, p.detach(), []).requires_grad_() for n, p in model.named_parameters()}
    loss = loss_fn("gpt", torch.func.functional_call(model, params, (xs,), tie_weights=True), ys)
    grads = torch.autograd.grad(loss, list(params.values()))
    return ref, model, rec, [rec.id_of(loss)] + [rec.id_of(g) for g in grads]


def batch(b, t):
    seq = torch.randint(0, 17, (b, t + 1))
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def test_a_gpt_step_with_symbolic_batch_and_length_replays_at_other_sizes():
    ref, model, rec, ids = gpt_recording([0, 1])
    for b, t in ((4, 8), (7, 8), (2, 3), (5, 16)):
        x, y = batch(b, t)
        values = {"x": x.to("lazy"), "y": y.to("lazy"), **{n: p.detach() for n, p in model.named_parameters()}}
        env = rec.instantiate(values, static_of(rec))
        ref.zero_grad()
        want = loss_fn("gpt", ref(x), y)
        want.backward()
        got = [env[i].cpu() for i in ids]
        torch.testing.assert_close(got[0], want.detach())
        for g, p in zip(got[1:], ref.parameters()):
            torch.testing.assert_close(g, p.grad)


def test_sizes_past_a_guard_or_a_static_dimension_are_refused():
    _, model, rec, _ = gpt_recording([0, 1])
    params = {n: p.detach() for n, p in model.named_parameters()}
    x, y = batch(2, 17)  # longer than the positional table: pos[:T] guarded T <= 16
    with pytest.raises(ValueError, match="guard"):
        rec.instantiate({"x": x.to("lazy"), "y": y.to("lazy"), **params}, static_of(rec))
    _, model, rec, _ = gpt_recording([0])
    x, y = batch(3, 5)  # the length is static in this recording
    with pytest.raises(ValueError, match="does not match"):
        rec.instantiate({"x": x.to("lazy"), "y": y.to("lazy"), **params}, static_of(rec))


def test_a_branch_on_a_symbolic_size_is_guarded():
    rec = Recorder()
    xs = rec.input("x", torch.randn(6, 3).to("lazy"), [0])
    out = xs * 2 if xs.shape[0] > 4 else xs * 3
    for b, ok in ((9, True), (3, False)):
        x = torch.randn(b, 3)
        if ok:
            env = rec.instantiate({"x": x.to("lazy")}, {})
            torch.testing.assert_close(env[rec.id_of(out)].cpu(), x * 2)
        else:
            with pytest.raises(ValueError, match="guard"):
                rec.instantiate({"x": x.to("lazy")}, {})


def test_reading_data_while_sizes_are_symbolic_raises():
    rec = Recorder()
    xs = rec.input("x", torch.randn(6, 3).to("lazy"), [0])
    with pytest.raises(RuntimeError, match="symbolic"):
        xs.sum().item()
    with pytest.raises(RuntimeError, match="symbolic"):
        (xs * 2).cpu()
