"""Background C++ builds (lazy/runtime/cpp_build.py, Note [C++ compiles in the background]): under 'auto' a graph
runs on the reference executor while its library builds, then compiled; values are eager's throughout."""
import copy
import warnings

import pytest
import torch

import lazy
from lazy.cache import graph_cache
from lazy.debug import metrics
from lazy.runtime import cpp_build


@pytest.fixture
def background(tmp_path, cpu_backing):
    with lazy.config.override(compiler="auto", compile_after=2, compile_background=True, cache_dir=str(tmp_path)):
        graph_cache.clear()
        yield
    cpp_build.wait_all()


def _graph(x, k):
    y = ((x * k).sin() + x.square()).sum(0)
    lazy.mark_step()
    return y.cpu()


def test_a_graph_runs_on_the_reference_executor_until_its_library_is_built(background):
    x = torch.randn(64, 5)
    xl = x.to("lazy")
    want = ((x * 1.5).sin() + x.square()).sum(0)
    torch.testing.assert_close(_graph(xl, 1.5), want)  # run 1: reference, as always under 'auto'
    torch.testing.assert_close(_graph(xl, 1.5), want)  # run 2 tiers up: the build starts, the run does not wait
    program = graph_cache.latest()
    assert isinstance(program, cpp_build.BuildingProgram) and metrics.counter("warming_runs") == 1
    assert metrics.counter("kernels_launched") == 0
    assert cpp_build.wait_all()[0] == 1
    launched = metrics.counter("kernels_launched")
    torch.testing.assert_close(_graph(xl, 1.5), want)  # loads the library and runs it
    assert metrics.counter("kernels_launched") > launched and metrics.counter("warming_runs") == 1
    assert program.ready() and metrics.counter("cpp.compiles") == 1
    torch.testing.assert_close(_graph(xl, 0.5), ((x * 0.5).sin() + x.square()).sum(0))  # scalars stay inputs


def test_builds_run_one_at_a_time_and_each_program_switches_when_its_own_is_built(background):
    xs = [torch.randn(8 + i, 3) for i in range(3)]
    for _ in range(2):  # three graphs (three shapes) tier up: one build runs, two wait
        for x in xs:
            _graph(x.to("lazy"), 2.0)
    assert len(cpp_build._QUEUE) >= 2 and sum(b.started for b in cpp_build._QUEUE) == 1
    cpp_build.wait_all()
    assert not cpp_build._QUEUE
    for x in xs:
        torch.testing.assert_close(_graph(x.to("lazy"), 2.0), ((x * 2.0).sin() + x.square()).sum(0))
    assert metrics.counter("cpp.compiles") == 3


def test_a_failed_build_warns_once_and_stays_on_the_reference_executor(background):
    x = torch.randn(16, 4)
    xl = x.to("lazy")
    want = ((x * 3.0).sin() + x.square()).sum(0)
    # g++ for the probe of the instruction set, an error in a graph's source (its entry points become '@')
    with lazy.config.override(cxx="g++ -Dlz_seg0=@"):
        _graph(xl, 3.0)
        _graph(xl, 3.0)
        cpp_build.wait_all()
        with pytest.warns(RuntimeWarning, match="could not compile"):
            torch.testing.assert_close(_graph(xl, 3.0), want)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.testing.assert_close(_graph(xl, 3.0), want)
    assert metrics.counter("compile_fallback") == 1 and metrics.counter("kernels_launched") == 0
    assert metrics.counter("warming_runs") == 1  # the tier-up's run; not the failed program's


def test_a_captured_step_replays_on_the_reference_executor_then_compiled(background):
    torch.manual_seed(0)
    w0 = torch.randn(6, 3)
    w = w0.clone().to("lazy").requires_grad_()
    opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)

    @lazy.compile
    def step(x):
        loss = (x @ w).tanh().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    ref = w0.clone().requires_grad_()
    ref_opt = torch.optim.SGD([ref], lr=0.1, momentum=0.9)
    xs = [torch.randn(4, 6) for _ in range(8)]
    for i, x in enumerate(xs):
        if i == 4:
            cpp_build.wait_all()
        got = step(x.to("lazy"))
        loss = (x @ ref).tanh().square().mean()
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(got.cpu(), loss.detach())
    torch.testing.assert_close(w.detach().cpu(), ref.detach())
    assert metrics.counter("warming_runs") >= 1 and metrics.counter("capture.replays") >= 6
    assert metrics.counter("kernels_launched") > 0


def test_a_training_loop_with_launched_runs_gives_eager_values_through_the_switch(background):
    """Asynchronous execution (each mark_step's program launched on the worker, which checks the build there): an MLP
    trained for 40 steps while its step graph builds, switches and runs compiled equals eager step for step."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    model = copy.deepcopy(ref).to("lazy")
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ref, model)]
    batches = [(torch.randn(64, 8), torch.randint(0, 3, (64,))) for _ in range(4)]
    with lazy.config.override(async_execution=True, async_min_run_us=0):
        for step in range(40):
            x, y = batches[step % 4]
            losses = []
            for m, opt, dev in ((ref, opts[0], "cpu"), (model, opts[1], "lazy")):
                loss = torch.nn.functional.cross_entropy(m(x.to(dev)), y.to(dev))
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.detach())
            lazy.mark_step()
            if step == 20:
                cpp_build.wait_all()
            if step % 5 == 4:
                torch.testing.assert_close(losses[1].cpu(), losses[0])
    for a, b in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(b.detach().cpu(), a.detach())
    assert metrics.counter("warming_runs") >= 1 and metrics.counter("kernels_launched") > 0


def test_a_child_forked_during_a_build_leaves_the_parents_build_alone(background):
    """Note [Builds across a fork]: a forked child that polls, ends every build it knows and exits normally neither
    kills the parent's compiler nor removes its directory; the child runs the graph on the reference executor."""
    import os
    x = torch.randn(32, 6)
    xl = x.to("lazy")
    want = ((x * 1.25).sin() + x.square()).sum(0)
    _graph(xl, 1.25)
    _graph(xl, 1.25)  # the tier-up: the build runs
    program = graph_cache.latest()
    assert isinstance(program, cpp_build.BuildingProgram) and cpp_build._QUEUE
    tmp = cpp_build._QUEUE[0].tmp
    pid = os.fork()
    if pid == 0:  # the child: its checks must not touch the parent's build
        code = 1
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ok = torch.allclose(_graph(xl, 1.25), want) and not program.ready()
            cpp_build.wait_all()
            cpp_build._end_all()
            code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert os.path.isdir(tmp)
    cpp_build.wait_all()
    torch.testing.assert_close(_graph(xl, 1.25), want)
    assert program.ready() and metrics.counter("compile_fallback") == 0


def test_background_builds_run_niced_and_synchronous_ones_at_the_callers_priority(background, monkeypatch):
    """Note [Background builds yield the cores]: a background build's compiler runs under ``nice`` at
    ``compile_nice`` (none at 0, none for a build the caller waits for, none for a compiler not found); its library
    gives eager's values."""
    started = []
    inner = cpp_build.Build._start
    monkeypatch.setattr(cpp_build.Build, "_start", lambda self: started.append(self) or inner(self))
    x = torch.randn(32, 7)
    want = ((x * 2.5).sin() + x.square()).sum(0)
    for _ in range(2):
        _graph(x.to("lazy"), 2.5)
    cpp_build.wait_all()
    torch.testing.assert_close(_graph(x.to("lazy"), 2.5), want)
    assert metrics.counter("kernels_launched") > 0 and len(started) == 1
    for cmd in started[0].commands:
        assert cmd[0].endswith("nice") and cmd[1:3] == ["-n", "10"] and cmd[3] == "g++"
    with lazy.config.override(compile_nice=0):
        assert cpp_build._niced(["g++", "-O2"]) == ["g++", "-O2"]
    with lazy.config.override(compile_nice=19):
        assert cpp_build._niced(["g++"])[1:] == ["-n", "19", "g++"]
    assert cpp_build._niced(["/nonexistent/c++"]) == ["/nonexistent/c++"]
    build = cpp_build.Build(["int f() { return 1; }\n"], ["-shared", "-fPIC"], "k", "", background=False)
    try:
        assert build.commands[0][0] == "g++"
    finally:
        build.wait()
        build.close()


def test_the_stand_in_of_a_building_program_keeps_no_text(background, tmp_path):
    """A building program's reference stand-in formats no graph text (its dumps are the program's), and the graph's
    text is made only for a dump (LAZY_DUMP_DIR), where it is written."""
    x = torch.randn(16, 3)
    for _ in range(2):
        _graph(x.to("lazy"), 1.25)
    program = graph_cache.latest()
    assert isinstance(program, cpp_build.BuildingProgram) and program._fallback.source == ""
    assert program.graph_text == "" and "lz_seg0" in program.source
    dumps = tmp_path / "dumps"
    with lazy.config.override(dump_dir=str(dumps)):
        for _ in range(2):
            _graph(x.to("lazy"), 1.25)
            _graph(torch.randn(5, 3).to("lazy"), 1.25)
    text = "".join(p.read_text() for p in dumps.iterdir() if p.name.endswith("_cpp.txt"))
    assert "/* graph:\n" in text and "aten.sin" in text and graph_cache.latest().graph_text in text
