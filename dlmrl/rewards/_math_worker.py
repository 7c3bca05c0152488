"""The math-verify template and workers of :class:`dlmrl.rewards.math_verifier.MathVerifier`.

Run as ``python _math_worker.py FD``: FD is a UNIX socket to the pool. The *template* imports and warms up
math-verify, sends ``ready`` (or ``error <message>`` and exits), then for each ``fork`` message (which carries
a new socket) forks a *worker* and answers with its pid. A worker reads ``[gold, pred]`` JSON lines from its
socket and answers ``1`` if ``verify(parse(gold), parse(pred))`` holds and the gold parses as math (not only
as its own string), else ``0``; it exits when its socket closes. When the pool's socket closes, the template kills its workers and exits.

Both strings are parsed with math-verify's LaTeX extraction only (``LatexExtractionConfig``: latex2sympy's
ANTLR grammar). Its plain-expression extraction is not used because it hands the text to sympy's
``parse_expr``, which ``eval`` s it. (sympy still calls ``eval``/``exec`` on code it generates itself, e.g.
``Integer (2 )`` for a numeric token of the grammar; the completion's text never reaches them, which
``tests/rewards/test_math_reward.py`` checks.) The pool bounds each request's wall-clock time and kills the
worker past it, so math-verify's own ``signal.alarm`` timeouts are off (``parsing_timeout=None``,
``timeout_seconds=None``). A worker's address space is capped (``RLIMIT_AS``, ``DLMRL_MATH_WORKER_MAX_BYTES``,
default 4 GiB) so that a huge integer power fails with ``MemoryError`` instead of exhausting the machine
before the deadline.
"""

import os
import sys


def _limit_memory() -> None:
    try:
        import resource

        limit = int(os.environ.get("DLMRL_MATH_WORKER_MAX_BYTES", str(4 << 30)))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass


def make_check():
    """``check(gold, pred) -> bool``: math-verify's LaTeX parse of both, then ``verify(gold, pred)``; any
    exception means not equivalent. Imports math-verify (raises ImportError without it)."""
    import logging
    from functools import lru_cache

    logging.disable(logging.CRITICAL)  # (math-verify logs a warning per call with timeouts off)
    from math_verify import LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig()]

    @lru_cache(maxsize=4096)
    def parsed(text: str):
        return parse(text, extraction_config=config, parsing_timeout=None)

    def check(gold: str, pred: str) -> bool:
        try:
            g, p = parsed(gold), parsed(pred)
            # a gold math-verify cannot read as math parses to its bare string only ("???" -> ['???']), which
            # would then match an identical string: such a gold matches nothing
            is_math = any(not isinstance(x, str) for x in g)
            return is_math and bool(p) and bool(verify(g, p, timeout_seconds=None))
        except (Exception, MemoryError):  # noqa: BLE001 (MemoryError, RecursionError, anything math-verify raises: not equivalent)
            return False

    check("\\boxed{\\frac{1}{2}}", "\\boxed{0.5}")  # warm-up: sympy's lazy imports and the grammar
    return check


def serve(sock, check) -> None:
    """A worker's loop: one ``[gold, pred]`` line in, ``1``/``0`` out, until the socket closes."""
    import json

    stream = sock.makefile("rwb")
    for line in stream:
        try:
            gold, pred = json.loads(line)
            ok = check(str(gold), str(pred))
        except Exception:  # noqa: BLE001 (a malformed request: not equivalent)
            ok = False
        stream.write(b"1\n" if ok else b"0\n")
        stream.flush()


def template(fd: int) -> None:
    """The template's loop (module docstring)."""
    import signal
    import socket

    ctl = socket.socket(fileno=fd)
    try:
        check = make_check()
    except Exception as e:  # noqa: BLE001 (reported to the pool, which raises with this message)
        ctl.sendall(("error " + f"{type(e).__name__}: {e}".replace("\n", " ")).rstrip().encode() + b"\n")
        return
    ctl.sendall(b"ready\n")
    children: set[int] = set()
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 64, 4)
        except OSError:
            break
        if not msg:
            break
        for wfd in fds:
            pid = os.fork()
            if pid == 0:  # the worker
                ctl.close()
                _limit_memory()
                try:
                    serve(socket.socket(fileno=wfd), check)
                finally:
                    os._exit(0)
            os.close(wfd)
            children.add(pid)
            ctl.sendall(f"{pid}\n".encode())
        while children:  # reap the workers that ended (killed by the pool)
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            children.discard(pid)
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


if __name__ == "__main__":
    # Run as a script, this file's folder (dlmrl/rewards) heads sys.path: it must not shadow top-level modules.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    template(int(sys.argv[1]))
