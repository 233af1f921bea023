"""Configuration knobs and metrics API."""
import os
import subprocess
import sys

import pytest
import torch

import lazy
import lazy.cache.graph_cache
from lazy.config import KNOBS


def test_every_knob_has_env_and_help():
    names = {k.name for k in KNOBS}
    assert len(names) == len(KNOBS)
    for knob in KNOBS:
        assert knob.env.startswith("LAZY_") and knob.help
        assert getattr(lazy.config, knob.name) is not None
    assert "backing_device" in lazy.config.describe()


def test_override_restores():
    before = lazy.config.graph_cache_size
    with lazy.config.override(graph_cache_size=3):
        assert lazy.config.graph_cache_size == 3
    assert lazy.config.graph_cache_size == before
    with pytest.raises(AttributeError, match="no knob"):
        lazy.config.no_such_knob = 1


def test_env_vars_are_read_at_import():
    env = dict(os.environ, LAZY_STRICT="1", LAZY_GRAPH_CACHE_SIZE="7")
    out = subprocess.run([sys.executable, "-c", "import lazy; print(lazy.config.strict, lazy.config.graph_cache_size)"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "7"]


def test_debug_logging_names_the_sync(capfd):
    with lazy.config.override(debug=2):
        (torch.ones(3, device="lazy") * 2).sum().item()
    err = capfd.readouterr().err
    assert "[lazy:1] sync (item)" in err and "test_config.py" in err and "[lazy:2] compiled" in err


def test_metrics_api():
    lazy.cache.graph_cache.clear()
    lazy.metrics.reset()
    assert lazy.metrics.counters() == {}
    assert "nothing recorded" in lazy.metrics.report()
    (torch.ones(2, device="lazy") + 1).cpu()
    c = lazy.metrics.counters()
    assert c["traced_ops"] >= 1 and c["sync.cpu"] == 1 and c["compiles"] == 1
    assert lazy.metrics.counter("graph_cache.miss") == 1 and lazy.metrics.counter("nope") == 0
    text = lazy.metrics.report()
    assert "sync.cpu" in text and "compiles" in text
    lazy.metrics.reset()
    assert lazy.metrics.counters() == {}


def test_counters_from_threads_add_up():
    """Counters bumped from several threads at once (the launch worker and the recorder) lose no update: each is one
    step under the GIL (metrics.py), with a switch interval short enough to interleave them."""
    import sys
    import threading

    lazy.metrics.reset()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        def work():
            for _ in range(20000):
                lazy.metrics.bump("threads.one")
                lazy.metrics.bump_many(("threads.two", 2), ("threads.half", 0.5))
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    c = lazy.metrics.counters()
    assert (c["threads.one"], c["threads.two"], c["threads.half"]) == (80000, 160000, 40000)
    with pytest.raises(TypeError):
        lazy.metrics.bump("threads.bad", "not a number")


def test_cache_summary_line():
    lazy.metrics.reset()
    lazy.metrics.bump("graph_cache.hit", 3)
    lazy.metrics.bump("graph_cache.miss", 1)
    assert lazy.metrics.cache_summary() == "graph cache hit rate 75.0% (1 compiles)"
