"""math-verify with a hard wall-clock timeout, callable from any thread: killable worker processes.

Why processes. math-verify's timeouts use ``signal.alarm``, which only works on the main thread (it raises
``ValueError`` elsewhere unless ``parsing_timeout``/``timeout_seconds`` are ``None``, which turns them off).
Turning them off and bounding the input size is not enough: sympy evaluates integer powers eagerly and
``\\boxed{9^{9^{9}}}`` makes CPython compute a 370-million-digit integer in C code that holds the GIL for
minutes, so no thread-based timeout can even fire. A process can be killed.

How. :class:`MathVerifier` starts one *template* process (:mod:`dlmrl.rewards._math_worker`, run as
``python <file>``: a fresh interpreter without torch's threads, and no re-import of the caller's
``__main__``) that imports and warms up math-verify once, then ``fork`` s a worker whenever the pool asks
(a few milliseconds; each worker talks to the pool over its own UNIX socket). Each (gold, prediction) pair
goes to an idle worker; the caller waits at most ``timeout`` seconds; past it the worker is killed
(``SIGKILL``), a replacement is forked in the background, and the pair counts as not equivalent.

Guarantees and costs:

- After the template is up (about a second, once; :meth:`MathVerifier.start` does it ahead of time), a call
  returns within ``timeout`` plus a few milliseconds, even right after kills.
- Thread-safe: concurrent calls each take their own worker (at most ``num_workers`` in flight; others wait).
- Results are cached per (gold, prediction) (GRPO groups repeat answers), timeouts included.
- Inputs longer than ``max_chars`` and obvious blow-ups (:func:`too_costly`) are refused without a worker
  (not equivalent), so they return in microseconds and cost no worker.
- POSIX only (``fork``, ``select``, descriptor passing over UNIX sockets).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import OrderedDict
from pathlib import Path

__all__ = ["MAX_BIG_DIGITS", "MathVerifier", "MathVerifierError", "default_verifier", "too_costly"]

_WORKER = str(Path(__file__).with_name("_math_worker.py"))
MAX_BIG_DIGITS = 4
_EXPONENT = re.compile(r"\^\s*(\{|\\left\s*\(|\()")
_BIG = r"\d{" + str(MAX_BIG_DIGITS + 1) + ",}"  # an integer literal with more than MAX_BIG_DIGITS digits
_BIG_EXPONENT = re.compile(r"(\^|\*\*)\s*\{?\s*" + _BIG)
_BIG_FACTORIAL = re.compile(_BIG + r"\s*!")


class MathVerifierError(RuntimeError):
    """The math-verify worker cannot start (e.g. math-verify is not installed); the message says why."""


def _exponent_is_costly(text: str, start: int, open_ch: str, close_ch: str) -> bool:
    """Whether the group opening at ``start`` holds ``^``, ``*`` or ``!`` before it closes (or never closes)."""
    depth = 0
    for j in range(start, len(text)):
        ch = text[j]
        if ch == open_ch:
            depth += 1
        elif ch == close_ch:
            depth -= 1
            if depth == 0:
                return False
        elif ch in "^*!":
            return True
    return False


def too_costly(latex: str) -> bool:
    """Whether ``latex`` holds a power or factorial sympy could take unbounded time or memory on (module doc).

    Conservative and cheap (linear in the input for ordinary text): an exponent group that contains ``^``,
    ``*`` or ``!``; an exponent or a factorial argument with more than ``MAX_BIG_DIGITS`` digits; ``**`` used
    twice (a tower in Python notation).
    """
    if _BIG_EXPONENT.search(latex) or _BIG_FACTORIAL.search(latex) or latex.count("**") > 1:
        return True
    for m in _EXPONENT.finditer(latex):
        brace = m.group(1) == "{"
        if _exponent_is_costly(latex, m.end() - 1, "{" if brace else "(", "}" if brace else ")"):
            return True
    return False


class _Channel:
    """Newline-terminated messages over a socket, read with a deadline."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer = sock, b""

    def read_line(self, deadline: float) -> str | None:
        """The next line; ``""`` at EOF or on a socket error; None on timeout."""
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                ready, _, _ = select.select([self.sock], [], [], remaining)
                if not ready:
                    return None
                chunk = self.sock.recv(65536)
            except OSError:
                return ""
            if not chunk:
                return ""
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode("utf-8", "replace")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class _Worker(_Channel):
    """One forked worker: its socket and its pid (a child of the template, killed by pid)."""

    def __init__(self, sock: socket.socket, pid: int):
        super().__init__(sock)
        self.pid = pid

    def send(self, gold: str, pred: str) -> bool:
        try:
            self.sock.sendall((json.dumps([gold, pred]) + "\n").encode())
            return True
        except OSError:
            return False

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        self.close()


class _Template(_Channel):
    """The process that has math-verify imported and forks workers on request."""

    def __init__(self, startup_timeout: float):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen([sys.executable, _WORKER, str(theirs.fileno())],
                                         pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
        finally:
            theirs.close()
        super().__init__(mine)
        line = self.read_line(time.monotonic() + startup_timeout)
        if line != "ready":
            self.shutdown()
            raise MathVerifierError(
                line[len("error "):] if line and line.startswith("error ")
                else f"no 'ready' from the math-verify template within {startup_timeout:.0f} s (got {line!r})")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, timeout: float = 10.0) -> _Worker | None:
        """A new worker, or None if the template does not answer."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            socket.send_fds(self.sock, [b"fork\n"], [theirs.fileno()])
        except OSError:
            mine.close()
            return None
        finally:
            theirs.close()
        line = self.read_line(time.monotonic() + timeout)
        if line is None or not line.isdigit():
            mine.close()
            return None
        return _Worker(mine, int(line))

    def shutdown(self) -> None:
        self.close()  # (the template kills its workers and exits when its socket closes)
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class MathVerifier:
    """``verify(parse(gold), parse(pred))`` of math-verify in killable worker processes (module docstring).

    Args:
        timeout: seconds one (gold, prediction) check may take once sent to a worker; past it the worker is
            killed and the pair is not equivalent. math-verify's own default is 5 s; typical MATH answers take
            1-50 ms, a few symbolic ones ~250 ms.
        num_workers: worker processes (forked from the template, so they share its memory until they write);
            concurrent calls beyond it wait for a free worker.
        max_chars: longer inputs are not equivalent without a check.
        startup_timeout: seconds to wait for the template to import math-verify before
            :class:`MathVerifierError`.
        cache_size: (gold, prediction) results kept.

    Attributes:
        timeouts: checks that hit ``timeout`` (their worker was killed).
        lost: workers that died by themselves during a check (the check counted as not equivalent).
    """

    def __init__(self, timeout: float = 1.0, num_workers: int = 2, max_chars: int = 1000,
                 startup_timeout: float = 120.0, cache_size: int = 65536):
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers!r}")
        self.timeout, self.num_workers, self.max_chars = float(timeout), int(num_workers), int(max_chars)
        self.startup_timeout = float(startup_timeout)
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._starting = 0
        self._busy = 0
        self._error: str | None = None
        self._closed = False
        self._cache: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self._cache_size = cache_size
        self._template: _Template | None = None
        self._template_lock = threading.Lock()
        self.timeouts = 0  # checks that hit the timeout (their worker was killed)
        self.lost = 0  # workers that died by themselves (their check counted as not equivalent)
        _LIVE.add(self)

    # -- pool -------------------------------------------------------------------------------------
    def _spawn(self) -> None:
        """Start one worker in the background (caller holds the lock)."""
        self._starting += 1
        threading.Thread(target=self._boot, daemon=True, name="dlmrl-math-verify-boot").start()

    def _template_ready(self) -> _Template:
        """The template process, started (or restarted after a crash) when needed."""
        with self._template_lock:
            if self._template is None or not self._template.alive():
                if self._template is not None:
                    self._template.shutdown()
                self._template = None
                self._template = _Template(self.startup_timeout)
            return self._template

    def _boot(self) -> None:
        """Fork one worker from the template (starting the template first if needed)."""
        worker, error = None, None
        try:
            template = self._template_ready()
            with self._template_lock:
                worker = template.fork()
            if worker is None:
                error = "the math-verify template did not fork a worker"
        except MathVerifierError as e:
            error = str(e)
        except OSError as e:
            error = f"{type(e).__name__}: {e}"
        with self._cond:
            self._starting -= 1
            if error is not None:
                self._error = error
            elif self._closed:
                worker.kill()
            else:
                self._error = None
                self._idle.append(worker)
            self._cond.notify_all()

    def _fill(self) -> None:
        while len(self._idle) + self._starting + self._busy < self.num_workers:
            self._spawn()

    def start(self, wait: bool = True) -> MathVerifier:
        """Start the workers; with ``wait``, block until one is ready.

        Raises:
            MathVerifierError: if a worker cannot start.
        """
        with self._cond:
            self._closed = False
            self._fill()
            if wait:
                self._wait_idle()
        return self

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while not self._idle:
            if self._error is not None and self._starting == 0 and self._busy == 0:
                raise MathVerifierError(f"math-verify worker failed to start: {self._error}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise MathVerifierError(f"no math-verify worker ready after {self.startup_timeout:.0f} s")
            self._cond.wait(remaining)

    def close(self) -> None:
        """Stop the template and every worker (busy ones when their check ends; a later call starts anew)."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
        for w in idle:
            w.kill()
        with self._template_lock:
            template, self._template = self._template, None
        if template is not None:
            template.shutdown()

    # -- checks ------------------------------------------------------------------------------------
    def equivalent(self, gold: str, pred: str) -> bool:
        """Whether math-verify finds ``pred`` equal to ``gold`` (both LaTeX, e.g. ``\\boxed{\\frac{1}{2}}``).

        False for oversize or too-costly inputs, unparsable ones (a gold that math-verify reads only as its
        own string, such as ``???``, matches nothing), and checks past ``timeout``. Answers are cached; a check
        that timed out or lost its worker is not (the next call checks again).

        Raises:
            MathVerifierError: if no worker can be started.
        """
        if len(gold) > self.max_chars or len(pred) > self.max_chars or too_costly(pred) or too_costly(gold):
            return False
        key = (gold, pred)
        with self._cond:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            self._closed = False
            self._fill()
            self._wait_idle()
            worker = self._idle.pop()
            self._busy += 1
        line, answered = None, False
        try:
            line = worker.read_line(time.monotonic() + self.timeout) if worker.send(gold, pred) else ""
            answered = True
        finally:  # (an exception here, e.g. KeyboardInterrupt, kills the worker and caches nothing)
            healthy, result = line in ("0", "1"), line == "1"
            with self._cond:
                self._busy -= 1
                keep = healthy and not self._closed
                if keep:
                    self._idle.append(worker)
                if not healthy:
                    self.timeouts += answered and line is None
                    self.lost += line is not None
                    self._fill()
            if line is None or (healthy and not keep):  # (timed out, or closed meanwhile: kill by pid)
                worker.kill()
            elif not keep:  # (the worker is gone: its pid may already be reaped, so no kill)
                worker.close()
            with self._cond:
                if healthy:  # (a timeout or a lost worker says nothing about the pair: never cached)
                    self._cache[key] = result
                    if len(self._cache) > self._cache_size:
                        self._cache.popitem(last=False)
                self._cond.notify_all()
        return result


    def parsable(self, gold: str) -> bool:
        """Whether math-verify reads ``gold`` (LaTeX, unboxed) as math, i.e. whether any answer can match it:
        :meth:`equivalent` of its boxed form with itself."""
        boxed = "\\boxed{" + gold + "}"
        return self.equivalent(boxed, boxed)


_DEFAULT: dict[tuple, MathVerifier] = {}
_DEFAULT_LOCK = threading.Lock()
_LIVE: weakref.WeakSet = weakref.WeakSet()  # every verifier, closed at exit


def default_verifier(timeout: float = 1.0, num_workers: int = 2) -> MathVerifier:
    """The process-wide verifier for these settings (created on first use, closed at exit)."""
    key = (float(timeout), int(num_workers))
    with _DEFAULT_LOCK:
        if key not in _DEFAULT:
            _DEFAULT[key] = MathVerifier(timeout=timeout, num_workers=num_workers)
        return _DEFAULT[key]


@atexit.register
def _close_all() -> None:
    for v in list(_LIVE):
        v.close()
