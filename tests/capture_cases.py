"""Pure-Python functions the capture interpreter must run exactly as CPython does (tests/test_capture_interpreter.py).

No torch here: the same cases run under another CPython (3.11 and 3.12 differ in bytecode) with only the
interpreter's own modules loaded.
"""
import functools


def outcome(fn, *args, **kwargs):
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as e:  # noqa: BLE001 -- compared below
        ctx = e.__context__
        return ("raised", type(e), str(e), type(ctx) if ctx is not None else None)


class Base:
    def __init__(self, x):
        self.x = x

    def value(self, k):
        return self.x + k


class Child(Base):
    def __init__(self, x):
        super().__init__(x * 2)

    def value(self, k):
        return super().value(k) * 10


def calls(a, b=2, *rest, c=3, d, **kw):
    return a, b, rest, c, d, sorted(kw.items())


def control_flow(xs, n):
    total = 0
    for i, x in enumerate(xs):
        if x > n:
            total += x
        elif x == n:
            continue
        else:
            total -= i
        while total > 100:
            total //= 2
    else:
        total += 1
    return total


def comprehensions(xs):
    return ([x * 2 for x in xs if x], {x: x ** 2 for x in xs}, {x % 3 for x in xs},
            sum(x for x in xs if x % 2), [(a, b) for a in xs for b in range(a) if b])


def closures(n):
    count = 0

    def bump(k):
        nonlocal count
        count += k
        return count
    f = lambda y: bump(y) + n  # noqa: E731
    return [f(i) for i in range(4)], count


def gen(n):
    for i in range(n):
        got = yield i
        if got:
            yield -got
    return "done"


def delegate():
    result = yield from gen(3)
    yield result
    yield from [7, 8]


def generators():
    g = gen(3)
    out = [next(g), g.send(5), next(g), list(gen(4)), list(delegate())]
    g2 = delegate()
    next(g2)
    g2.close()
    return out


def exceptions(kind):
    log = []
    try:
        try:
            if kind == 1:
                {}["missing"]
            elif kind == 2:
                raise ValueError("bad value")
            return "no error"
        except KeyError as e:
            log.append(("key", str(e)))
            raise RuntimeError("wrapped") from e
        finally:
            log.append("finally")
    except RuntimeError as e:
        return log, str(e), type(e.__cause__).__name__


def reraise_in_handler():
    try:
        1 / 0
    except ZeroDivisionError:
        raise TypeError("while handling")


class Manager:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, kind, value, tb):
        self.log.append(("exit", kind.__name__ if kind else None))
        return kind is KeyError


def with_statements(fail):
    log = []
    with Manager(log) as m:
        log.append(m is not None)
        if fail:
            raise KeyError("swallowed")
    with Manager(log):
        pass
    return log


def unpacking_and_strings(seq):
    a, *middle, b = seq
    (c, d), e = (1, 2), 3
    first, second = "xy"
    return a, middle, b, c + d + e, f"{a!r:>6}|{b:.2f}|{first}{second}", seq[1:-1], seq[::-1], {**{"k": 1}, "j": 2}


def unbound_local():
    if False:
        x = 1  # noqa: F841
    return x  # noqa: F821


def class_use():
    c = Child(3)
    return c.value(1), c.x, isinstance(c, Base), Child.__mro__[1].__name__


def partials_and_builtins(xs):
    add = functools.partial(lambda a, b, c=0: a + b + c, 10, c=1)
    return add(5), sorted(xs, key=lambda v: -v), max(xs), min(xs, key=abs), list(map(abs, xs)), dict(zip("ab", xs))


CASES = [
    (calls, (1,), {"d": 4}), (calls, (1, 2, 3, 4), {"c": 5, "d": 6, "z": 7}), (calls, (), {"d": 1}),
    (calls, (1,), {}), (calls, (1,), {"a": 2, "d": 3}),
    (control_flow, ([1, 5, 3, 9, 50, 70], 3), {}), (comprehensions, ([0, 1, 2, 3, 4],), {}),
    (closures, (2,), {}), (generators, (), {}), (exceptions, (0,), {}), (exceptions, (1,), {}),
    (exceptions, (2,), {}), (reraise_in_handler, (), {}), (with_statements, (False,), {}),
    (with_statements, (True,), {}), (unpacking_and_strings, ([1.5, 2, 3, 4.25],), {}), (unbound_local, (), {}),
    (class_use, (), {}), (partials_and_builtins, ([3, -7, 2],), {}),
]
