"""Recording with symbolic sizes (lazy/capture/symbolic.py): one recording of a training step's ops, replayed on
lazy tensors of other sizes, equals eager at each; sizes that break a guard of the recording are refused."""
import copy

import pytest
import torch
import torch.nn as nn

import lazy
from lazy.capture.symbolic import Recorder
from models import TinyGPT, loss_fn

EAGER = str(lazy.sync.backing_device())  # lazy is checked against eager on the device its graphs run on
CLOSE = dict(rtol=1e-4, atol=1e-5)  # compiled kernels and eager's round differently


def close(got, want):
    torch.testing.assert_close(got.cpu(), want.detach().cpu(), **CLOSE)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 5))


def test_an_sgd_step_recorded_once_replays_at_other_batch_sizes_on_the_current_parameters():
    ref = mlp()
    model = copy.deepcopy(ref).to("lazy")
    ref = ref.to(EAGER)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sizes = (5, 8, 13, 2, 3)
    data = [(torch.randn(b, 20), torch.randint(0, 5, (b,))) for b in sizes]

    def step(net, optimizer, x, y):
        loss = nn.functional.cross_entropy(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  # in place on the parameters and the momentum buffers
        return loss

    # the first step creates the momentum buffers (a Python-level branch the recording does not guard): plainly
    losses = [step(model, opt, data[0][0].to("lazy"), data[0][1].to("lazy")).detach().cpu()]
    rec = Recorder()
    with rec:
        xs = rec.input("x", data[1][0].to("lazy"), [0])
        ys = rec.input("y", data[1][1].to("lazy"), [0])
        assert isinstance(xs.shape[0], torch.SymInt)
        loss = step(model, opt, xs, ys)
    losses.append(loss.concrete.cpu())
    for x, y in data[2:]:  # each replay steps the parameters and buffers again, at its own batch size
        losses.append(rec.instantiate({"x": x.to("lazy"), "y": y.to("lazy")})[rec.id_of(loss)].cpu())
    for (x, y), got in zip(data, losses):
        close(got, step(ref, ref_opt, x.to(EAGER), y.to(EAGER)))
    for p, q in zip(model.parameters(), ref.parameters()):
        close(p, q)


def batch(b, t):
    seq = torch.randint(0, 17, (b, t + 1))
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def gpt_recording(dynamic):
    torch.manual_seed(0)
    ref = TinyGPT(vocab=17, d=16, heads=2, layers=2, block=16)
    model = copy.deepcopy(ref).to("lazy")
    ref = ref.to(EAGER)
    rec = Recorder()
    with rec:
        x, y = batch(4, 8)
        xs, ys = rec.input("x", x.to("lazy"), dynamic), rec.input("y", y.to("lazy"), dynamic)
        loss = loss_fn("gpt", model(xs), ys)
        grads = torch.autograd.grad(loss, list(model.parameters()))
    return ref, rec, [rec.id_of(loss)] + [rec.id_of(g) for g in grads]


def test_a_gpt_step_with_symbolic_batch_and_length_replays_at_other_sizes():
    ref, rec, ids = gpt_recording([0, 1])
    for b, t in ((4, 8), (7, 8), (2, 3), (5, 16)):
        x, y = batch(b, t)
        env = rec.instantiate({"x": x.to("lazy"), "y": y.to("lazy")})
        ref.zero_grad()
        want = loss_fn("gpt", ref(x.to(EAGER)), y.to(EAGER))
        want.backward()
        got = [env[i] for i in ids]
        close(got[0], want)
        for g, p in zip(got[1:], ref.parameters()):
            close(g, p.grad)


def test_sizes_past_a_guard_or_a_static_dimension_are_refused():
    _, rec, _ = gpt_recording([0, 1])
    x, y = batch(2, 17)  # longer than the positional table: pos[:T] guarded T <= 16
    with pytest.raises(ValueError, match="guard"):
        rec.instantiate({"x": x.to("lazy"), "y": y.to("lazy")})
    x, y = batch(1, 8)  # a symbol is never 1 (a size-1 dimension broadcasts): as torch.compile, a new capture
    with pytest.raises(ValueError, match="2 <= s"):
        rec.instantiate({"x": x.to("lazy"), "y": y.to("lazy")})
    _, rec, _ = gpt_recording([0])
    x, y = batch(3, 5)  # the length is static in this recording
    with pytest.raises(ValueError, match="does not match"):
        rec.instantiate({"x": x.to("lazy"), "y": y.to("lazy")})


def test_a_branch_on_a_symbolic_size_is_guarded():
    rec = Recorder()
    with rec:
        xs = rec.input("x", torch.randn(6, 3).to("lazy"), [0])
        out = xs * 2 if xs.shape[0] > 4 else xs * 3
    x = torch.randn(9, 3)
    close(rec.instantiate({"x": x.to("lazy")})[rec.id_of(out)], x * 2)
    with pytest.raises(ValueError, match="guard"):
        rec.instantiate({"x": torch.randn(3, 3).to("lazy")})


def test_a_factory_of_a_symbolic_size_replays_at_the_new_size():
    rec = Recorder()
    with rec:
        xs = rec.input("x", torch.randn(6, 3).to("lazy"), [0])
        out = xs + torch.arange(xs.shape[0], device=xs.device)[:, None]
    x = torch.randn(11, 3)
    close(rec.instantiate({"x": x.to("lazy")})[rec.id_of(out)], x + torch.arange(11)[:, None])


def test_sizes_used_as_numbers_and_in_containers_replay_at_the_new_sizes():
    """The op list's arguments at other sizes: symbolic ints and floats (one expression read twice, ``b * t`` and
    ``1 / t``), lists of tensors and of sizes, keyword arguments, and an op returning a tuple."""
    rec = Recorder()
    with rec:
        xs = rec.input("x", torch.randn(4, 6).to("lazy"), [0, 1])
        b, t = xs.shape
        mean = xs.sum(1, keepdim=True) / t + xs.sum() * (1 / t) / (b * t)
        parts = torch.split(xs, [t // 2, t - t // 2], dim=1)
        out = torch.cat([parts[1], parts[0] * b], dim=1).reshape(b * t) + torch.full((b * t,), t * 0.5,
                                                                                     device=xs.device)
        viewed = mean.expand(b, t).reshape([t, b])
    for b, t in ((3, 10), (5, 8), (4, 6)):  # the recording guards b < t
        x = torch.randn(b, t)
        env = rec.instantiate({"x": x.to("lazy")})
        want_mean = x.sum(1, keepdim=True) / t + x.sum() * (1 / t) / (b * t)
        want = torch.cat([x[:, t // 2:], x[:, :t // 2] * b], dim=1).reshape(b * t) + t * 0.5
        close(env[rec.id_of(out)], want)
        close(env[rec.id_of(viewed)], want_mean.expand(b, t).reshape(t, b))


def test_composite_matmul_and_linear_keep_sizes_symbolic():
    """Note [Python kernels of composite ops]: a 3-d input through ``matmul`` and a ``linear`` without bias (a
    tied head) replays at other batch sizes and lengths."""
    w = torch.randn(5, 16)
    rec = Recorder()
    with rec:
        xs = rec.input("x", torch.randn(4, 8, 16).to("lazy"), [0, 1])
        out = nn.functional.linear(xs, w.to("lazy")) + torch.matmul(xs, w.t().to("lazy"))
    for b, t in ((7, 3), (2, 9)):
        x = torch.randn(b, t, 16)
        close(rec.instantiate({"x": x.to("lazy")})[rec.id_of(out)], 2 * x.to(EAGER) @ w.to(EAGER).t())


def test_reading_data_while_sizes_are_symbolic_raises():
    rec = Recorder()
    with rec:
        xs = rec.input("x", torch.randn(6, 3).to("lazy"), [0])
        with pytest.raises(RuntimeError, match="symbolic"):
            xs.sum().item()
        with pytest.raises(RuntimeError, match="symbolic"):
            (xs * 2).cpu()


def test_the_compiled_check_agrees_with_the_shape_env():
    _, rec, _ = gpt_recording([0, 1])
    check = rec.compile_check()
    for b, t in ((1, 1), (4, 8), (9, 16), (3, 17), (2, 40)):
        x, y = batch(b, t)
        values = {"x": x.to("lazy"), "y": y.to("lazy")}
        sizes = check(values)
        assert (sizes is None) == (rec.check(rec.binding(values)) is not None)
        if sizes is not None:
            assert dict(zip(rec.symbols(), sizes)) == rec.binding(values)
    assert check({"x": torch.zeros(2, 3, 1).to("lazy"), "y": torch.zeros(2, 3).to("lazy")}) is None  # rank


def test_guards_print_as_exact_python():
    """Note [Checks of symbolic sizes]: each guard form a ShapeEnv makes (torch's Mod and FloorDiv of a convolution's
    and a pooling's sizes among them) evaluates in the compiled check as sympy evaluates it, at every size tried;
    a form the printer does not know is refused, for the check to evaluate it with sympy."""
    import itertools

    import sympy
    from torch.utils._sympy.functions import FloorDiv, Max, Mod, PythonMod

    from lazy.capture.symbolic import _python, _Unprintable
    a, b = sympy.symbols("s0 s1", integer=True, positive=True)
    guards = [sympy.Eq(Mod(a - 2, 2), 0), sympy.Ne(FloorDiv(a, 2) - 2, 1), FloorDiv(16, FloorDiv(b, 2)) >= 2,
              sympy.Eq(Max(1, (FloorDiv(a, 2) - 2) * FloorDiv(b, 2)), 3 * b), sympy.Ne(PythonMod(8 * a - 16, b), 0),
              sympy.Or(sympy.Eq(a, b), sympy.Not(sympy.Lt(a ** 2, 4 * b + 1))), sympy.Le(2 * a * b - a, 40)]
    for g in guards:
        text = _python(g)
        for x, y in itertools.product(range(2, 13), range(3, 14)):
            assert eval(text, {"s0": x, "s1": y}) is bool(g.xreplace({a: x, b: y})), (g, text, x, y)
    with pytest.raises(_Unprintable):
        _python(sympy.sin(a) > 0)



def test_the_generators_of_the_op_list_are_found_as_it_grows():
    """``Recorder.generators`` (kept between calls): every generator the op list's random ops take, once each, in
    order, also after ops are recorded past an earlier call."""
    from torch.utils._pytree import tree_flatten

    def every(rec):
        return list({id(g): g for _, args, kwargs, _ in rec.ops for g in tree_flatten((args, kwargs))[0]
                     if isinstance(g, torch.Generator)}.values())

    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    rec = Recorder()
    with rec:
        xs = rec.input("x", torch.randn(6, 3).to("lazy"), [0])
        a = xs + torch.empty_like(xs).uniform_(generator=g1)
        first = rec.generators()
        assert len(first) == 1 and first == every(rec)
        b = a * torch.empty_like(xs).uniform_(generator=g2) + torch.empty_like(xs).uniform_(generator=g1)
    assert len(rec.generators()) >= 2 and rec.generators() == every(rec) and rec.generators()[0] is first[0]
    assert rec.id_of(b) is not None
