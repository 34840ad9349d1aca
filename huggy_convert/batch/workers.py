"""The worker pool of a batch (and of ``verify OUT/``): processes forked after every import.

A Huggy-size checkpoint costs ~60 ms of work of which ~44 ms hold the interpreter lock (the ONNX
built in Python, verification's bookkeeping), so threads never reach two cores. ``Pool`` therefore
forks ``jobs`` worker processes from a parent that has already imported everything the work needs
and traced the ``.pt2`` template (``warm``: ``torch._dynamo``'s import and the first trace, ~1.5 s,
are paid once, not once per worker), after ``gc.freeze()`` (the collector then never walks, and so
never copies, the pages of the objects inherited from the parent). The workers share the parent's
pages copy-on-write: the pool's memory, summed as PSS over all its processes, is little more than
one process's.

Fork-safety: the pool forks only from the thread that created it while no other thread of the
package runs (torch and onnxruntime are used with one thread: no OpenMP team exists to be
inherited half-held); a worker never returns into the parent's stack (``os._exit``), dies with the
parent (``PR_SET_PDEATHSIG`` on Linux) and on Ctrl-C (its task's ``ArtifactSet`` transaction
rolls the files back first; the first SIGINT interrupts the task, later ones are ignored, so
nothing cuts the rollback short). A worker that dies (killed, out of memory) fails its task with one
line and is replaced. Where ``fork`` is not available (Windows, macOS, where forking a process
that loaded system frameworks is unsafe) or ``jobs`` is 1, the tasks run in a thread pool
(``mode`` says which: ``processes``, ``threads`` or ``serial``).

Tasks are ``(function, args)`` with a module-level function; the state every task needs (the
batch's context, its ``.pt2`` writer) is ``shared()``: set by the parent before forking, inherited
by every worker, never pickled. Results travel back pickled, so they are plain data (manifest
entries). A task that raises gives ``TaskError`` with its one line (``errors.HuggyError.one_line``).
"""
from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import signal
import sys
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from multiprocessing.connection import Pipe
from multiprocessing.connection import wait as wait_conns
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from ..errors import EXIT_INTERRUPTED, one_line

PROCESSES, THREADS, SERIAL = "processes", "threads", "serial"
_SHARED: Dict[str, Any] = {}


def shared() -> Dict[str, Any]:
    """The state the parent set before forking (``Pool(shared=...)``), in the parent and every worker."""
    return _SHARED


class TaskError(Exception):
    """A task raised (in a worker or here): its one-line message."""


def default_jobs() -> int:
    """The workers a pool gets unless told: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def fork_available() -> bool:
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


def _die_with_parent() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # pragma: no cover - best effort (not glibc)
        pass


_INTERRUPTED: List[bool] = []  # a worker's: [True] once it got a SIGINT


def _interrupt_once(signum, frame) -> None:
    """A worker's SIGINT: ``KeyboardInterrupt`` once, every later SIGINT ignored. A Ctrl-C reaches
    the whole process group, and the parent's ``close(interrupted=True)`` sends one more (for a
    worker that did not get the first): a second ``KeyboardInterrupt`` raised inside the task's
    rollback would leave part of its set (or a temporary) behind. The worker remembers it and
    exits 130 (``errors.EXIT_INTERRUPTED``) when the task ends, even where library code swallowed that one ``KeyboardInterrupt``
    (the task then ran to its end: its set is whole)."""
    _INTERRUPTED.append(True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _worker(conn, parent_pid: int) -> None:
    """A forked worker's whole life: tasks in, results out, ``os._exit`` at the end (never back
    into the parent's stack)."""
    code = 0
    try:
        _die_with_parent()
        if os.getppid() != parent_pid:  # the parent died between fork and prctl
            os._exit(1)
        signal.signal(signal.SIGINT, _interrupt_once)
        while True:
            if _INTERRUPTED:  # its KeyboardInterrupt was swallowed (see _interrupt_once): no next task
                code = EXIT_INTERRUPTED
                break
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            if msg is None:
                break
            tid, fn, args = msg
            try:
                out = (tid, True, fn(*args))
            except KeyboardInterrupt:
                code = EXIT_INTERRUPTED
                break
            except BaseException as exc:  # noqa: BLE001 - one line back to the parent
                out = (tid, False, one_line(exc))
            if _INTERRUPTED:  # the same, inside the task: it ran to its end
                code = EXIT_INTERRUPTED
                break
            try:
                conn.send(out)
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                conn.send((tid, False, f"internal error: result not picklable: {exc}"))
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except BaseException:  # noqa: BLE001 - the parent reports "a worker process died (exit 3)"
        code = 3
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class Pool:
    """``jobs`` workers (forked processes where possible, else threads); ``run(tasks)`` yields
    ``(index, ok, result_or_error_line)`` as tasks finish. ``warm``: called once in the parent
    before forking (imports, the ``.pt2`` trace)."""

    def __init__(self, jobs: int, shared_state: Optional[Dict[str, Any]] = None, warm: Optional[Callable] = None,
                 processes: bool = True):
        self.jobs = max(1, int(jobs))
        _SHARED.clear()
        _SHARED.update(shared_state or {})
        self.mode = PROCESSES if processes and self.jobs > 1 and fork_available() else \
            (THREADS if self.jobs > 1 else SERIAL)
        self.why = None if self.mode == PROCESSES or self.jobs == 1 else \
            ("fork is not available here" if processes else "processes not asked for")
        if warm is not None:
            warm()
        self._procs: Dict[int, Tuple[int, Any]] = {}  # slot -> (pid, conn)
        self._threads = None
        if self.mode == PROCESSES:
            gc.collect()
            gc.freeze()
            for slot in range(self.jobs):
                self._spawn(slot)
        elif self.mode == THREADS:
            self._threads = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="huggy-worker")

    def describe(self) -> str:
        if self.mode == PROCESSES:
            return f"{self.jobs} worker processes"
        if self.mode == THREADS:
            return f"{self.jobs} worker threads ({self.why})"
        return "1 worker (serial)"

    def pids(self) -> List[int]:
        return [pid for pid, _ in self._procs.values()]

    def _spawn(self, slot: int) -> None:
        parent_conn, child_conn = Pipe()
        parent = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker
            parent_conn.close()
            _worker(child_conn, parent)  # never returns
        child_conn.close()
        self._procs[slot] = (pid, parent_conn)

    def run(self, tasks: Iterable[Tuple[Callable, tuple]]) -> Iterable[Tuple[int, bool, Any]]:
        tasks = list(tasks)
        if self.mode == SERIAL:
            for i, (fn, args) in enumerate(tasks):
                try:
                    yield i, True, fn(*args)
                except Exception as exc:  # noqa: BLE001
                    yield i, False, one_line(exc)
            return
        if self.mode == THREADS:
            yield from self._run_threads(tasks)
            return
        yield from self._run_processes(tasks)

    def _run_threads(self, tasks):
        pending, queue = {}, list(enumerate(tasks))[::-1]
        while queue or pending:
            while queue and len(pending) < 2 * self.jobs:
                i, (fn, args) = queue.pop()
                pending[self._threads.submit(fn, *args)] = i
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                i = pending.pop(f)
                exc = f.exception()
                yield (i, False, one_line(exc)) if exc is not None else (i, True, f.result())

    def _run_processes(self, tasks, depth: int = 2):
        """Each worker holds up to ``depth`` tasks (the next one waits in its pipe while the parent
        handles a result); a worker that dies fails the task it had and its queued ones go back."""
        queue = deque(enumerate(tasks))
        held: Dict[int, deque] = {slot: deque() for slot in self._procs}  # slot -> task indices, oldest first
        while queue or any(held.values()):
            for slot in list(self._procs):
                while queue and len(held[slot]) < depth:
                    i, (fn, args) = queue.popleft()
                    try:
                        self._procs[slot][1].send((i, fn, args))
                        held[slot].append(i)
                    except (OSError, pickle.PicklingError, TypeError, AttributeError) as exc:
                        yield i, False, f"internal error: cannot hand the task to a worker: {exc}"
            busy = [s for s in held if held[s]]
            if not busy:
                continue
            conns = {self._procs[s][1]: s for s in busy}
            for conn in wait_conns(list(conns)):
                slot = conns[conn]
                try:
                    tid, ok, res = conn.recv()
                except (EOFError, OSError):  # the worker died with its oldest task
                    lost = held.pop(slot)
                    yield lost.popleft(), False, self._reap(slot)
                    queue.extendleft(reversed([(i, tasks[i]) for i in lost]))
                    self._spawn(slot)
                    held[slot] = deque()
                    continue
                held[slot].remove(tid)
                yield tid, ok, res

    def _reap(self, slot: int) -> str:
        pid, conn = self._procs.pop(slot)
        conn.close()
        try:
            _, status = os.waitpid(pid, 0)
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            how = f"killed by signal {signal.Signals(sig).name}" if sig else f"exit {os.WEXITSTATUS(status)}"
        except (ChildProcessError, ValueError):
            how = "gone"
        return f"a worker process died ({how}) while it had this checkpoint; its files were not written"

    def close(self, interrupted: bool = False) -> None:
        """Stop the workers (``interrupted``: at once, each rolling its files back) and wait for them.
        (A worker that already got the terminal's SIGINT ignores this one: ``_interrupt_once``.)"""
        if self._threads is not None:
            self._threads.shutdown(wait=True, cancel_futures=True)
            self._threads = None
        for slot, (pid, conn) in list(self._procs.items()):
            try:
                if interrupted:
                    os.kill(pid, signal.SIGINT)
                else:
                    conn.send(None)
            except (OSError, ValueError):
                pass
        for slot, (pid, conn) in list(self._procs.items()):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            conn.close()
        self._procs.clear()
        if self.mode == PROCESSES:
            gc.unfreeze()

    def __enter__(self):
        return self

    def __exit__(self, typ, exc, tb):
        self.close(interrupted=typ is not None)
        return False
