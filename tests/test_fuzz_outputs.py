"""Issue 14, the output half: writes, outputs and the one place foreign failures become typed errors.

Every case is generated at test time from the committed fixtures (the small variant run directory:
its checkpoint converts in about a second in-process) and checked with ``tests/fuzzkit.py``: one
stderr line ``huggy-convert: error: <file>: <reason>`` of bounded length, exit 2 (3 for an internal
error), no traceback, nothing of the user's changed, no temporary left. Categories:

- ``unwritable``: OUT unwritable (parent is a file, dangling symlink, symlink loop, a name too
  long, ``/proc``, ``/sys``, mode 555 unless root) for a single conversion, a run directory and
  ``verify OUT/``; a read-only or full file system simulated at the write;
- ``full``: the disk fills up at each file of the set, into a fresh OUT and over a previous set;
- ``names``: 255-byte names, names whose temporary would pass NAME_MAX, non-UTF-8 names, spaces
  and newlines;
- ``kill``: stale temporaries of a killed conversion, and ``kill -9`` at seeded random moments;
- ``concurrent``: the lock on OUT/<stem>, and two conversions of different checkpoints with one stem;
- ``devices``: ``--verify-device`` cuda / npu / bogus before any write;
- ``foreign``: ``errors.from_os_error`` / ``from_foreign`` and the CLI's top level.
"""
from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import VARIANTS, step_checkpoints
from fuzzkit import MAX_LINE, check_line, promise, temporaries

import huggy_convert.core.files as PF
from huggy_convert.core.artifacts import SUFFIXES, TARGET_OF, ArtifactSet, clean_stale_temporaries, locked
from huggy_convert.cli import main
from huggy_convert.errors import (EXIT_INTERNAL, InputError, InternalError, OutputError, from_foreign,
                                  from_os_error)

SMALL_RUN = VARIANTS / "small"
SMALL = step_checkpoints(SMALL_RUN)[-1]
STEM = SMALL.stem
FAST = ["--verify-dtype", "float32"]
ROOT_USER = hasattr(os, "geteuid") and os.geteuid() == 0
SEED = 14


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """One verified set of the small checkpoint (copied by the cases that need a previous set)."""
    out = tmp_path_factory.mktemp("converted")
    r = run(SMALL, out, *FAST)
    assert r.exit_code == 0, r.output
    return out


def copy_set(converted: Path, dest: Path) -> Path:
    shutil.copytree(converted, dest)
    return dest


def fail_writes(monkeypatch, err: int, nth=None, name=None):
    """Simulate a file system that fails a write with ``err`` (half the bytes written first): the
    ``nth`` file written, or every one, or the one called ``name``."""
    real = PF._write_fd
    calls = []

    def write(f, data, fsync):
        tmp = os.readlink(f"/proc/self/fd/{f.fileno()}") if name else ""  # the temporary's path
        calls.append(tmp)
        hit = (nth is None or len(calls) == nth) and (name is None or f"/.{PF.temporary_key(name)}." in tmp)
        if hit:
            f.write(data[:len(data) // 2])
            f.flush()
            raise OSError(err, os.strerror(err))
        real(f, data, fsync)

    monkeypatch.setattr(PF, "_write_fd", write)
    return calls


# --- unwritable -------------------------------------------------------------------------------
def _parent_is_file(tmp):
    (tmp / "afile").write_bytes(b"the user's")
    return tmp / "afile" / "out", os.strerror(errno.ENOTDIR)


def _dangling_symlink(tmp):
    (tmp / "out").symlink_to(tmp / "missing")
    return tmp / "out", "symbolic link to a missing folder"


def _symlink_loop(tmp):
    (tmp / "l1").symlink_to(tmp / "l2")
    (tmp / "l2").symlink_to(tmp / "l1")
    return tmp / "l1" / "out", os.strerror(errno.ELOOP)


def _name_too_long(tmp):
    return tmp / ("d" * 300), os.strerror(errno.ENAMETOOLONG)


def _proc(tmp):
    return Path("/proc/huggy-convert-out"), "cannot write"


def _proc_itself(tmp):
    return Path("/proc"), "cannot write"


def _proc_self(tmp):
    return Path("/proc/self/huggy-convert-out"), "cannot write"


def _sys(tmp):
    return Path("/sys/huggy-convert-out"), "cannot write"


def _mode_555(tmp):
    if ROOT_USER:
        pytest.skip("running as root: mode 555 does not stop root (the other unwritable cases cover it)")
    d = tmp / "ro"
    d.mkdir()
    d.chmod(0o555)
    return d, os.strerror(errno.EACCES)


UNWRITABLE = {"parent-is-a-file": _parent_is_file, "dangling-symlink": _dangling_symlink,
              "symlink-loop": _symlink_loop, "name-too-long": _name_too_long, "proc": _proc,
              "proc-itself": _proc_itself, "proc-self": _proc_self, "sys": _sys, "mode-555": _mode_555}


@pytest.mark.parametrize("source", ["checkpoint", "run-directory"])
@pytest.mark.parametrize("case", sorted(UNWRITABLE))
def test_unwritable_out_is_one_line(tmp_path, case, source):
    out, expect = UNWRITABLE[case](tmp_path)
    if case.startswith(("proc", "sys")) and not Path("/" + out.parts[1]).is_dir():
        pytest.skip(f"no /{out.parts[1]} here")
    try:
        src = SMALL if source == "checkpoint" else SMALL_RUN
        promise([src, out, "--no-verify"], watch=[tmp_path, SMALL_RUN], expect=expect)
    finally:
        if case == "mode-555":
            out.chmod(0o755)


@pytest.mark.parametrize("err", [errno.EROFS, errno.EACCES, errno.ENOSPC, errno.EDQUOT, errno.EIO])
def test_a_file_system_that_refuses_writes_is_one_line(tmp_path, monkeypatch, err):
    """Read-only, forbidden, full, over quota or failing: simulated at the write (root ignores mode
    bits and may not mount), into a fresh OUT."""
    fail_writes(monkeypatch, err)
    out = tmp_path / "out"
    promise([SMALL, out, "--no-verify"], watch=[SMALL_RUN], expect=os.strerror(err))
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("err", [errno.EROFS, errno.ENOSPC])
def test_verify_out_that_cannot_take_its_report(tmp_path, monkeypatch, converted, err):
    out = copy_set(converted, tmp_path / "out")
    fail_writes(monkeypatch, err)
    promise(["verify", out, *FAST], watch=[out], expect=f"{STEM}.verify.json: cannot write: {os.strerror(err)}")


@pytest.mark.skipif(ROOT_USER, reason="running as root: mode 555 does not stop root (simulated above)")
def test_verify_out_read_only_folder(tmp_path, converted):
    out = copy_set(converted, tmp_path / "out")
    out.chmod(0o555)
    try:
        promise(["verify", out, *FAST], watch=[out], expect=os.strerror(errno.EACCES))
    finally:
        out.chmod(0o755)


# --- full -----------------------------------------------------------------------------------------
# the files in the order a conversion writes them: the built set, then the golden file and the report
ORDER = ["safetensors", "onnx", "pt2", "golden", "report"]


@pytest.mark.parametrize("previous", [False, True], ids=["fresh", "over-a-previous-set"])
@pytest.mark.parametrize("nth", [1, 2, 3, pytest.param(4, marks=pytest.mark.slow),
                                 pytest.param(5, marks=pytest.mark.slow)], ids=ORDER)
def test_disk_full_mid_write(tmp_path, monkeypatch, converted, nth, previous):
    """ENOSPC half-way through the nth file: no partial file, no temporary, the previous set (when
    there was one) bitwise as it was; one line, exit 2."""
    out = copy_set(converted, tmp_path / "out") if previous else tmp_path / "out"
    calls = fail_writes(monkeypatch, errno.ENOSPC, nth=nth)
    args = [SMALL, out] + (FAST if nth > 3 else ["--no-verify"])
    promise(args, watch=[out, SMALL_RUN] if previous else [SMALL_RUN], expect=os.strerror(errno.ENOSPC))
    assert len(calls) == nth
    if not previous:
        assert list(out.iterdir()) == []


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd to see which file is written")
def test_disk_full_at_the_manifest(tmp_path, monkeypatch):
    """A run directory whose manifest cannot be written: one line naming it, exit 2, no temporary."""
    out = tmp_path / "out"
    fail_writes(monkeypatch, errno.ENOSPC, name="manifest.json")
    r = run(SMALL_RUN, out, "--no-verify", "--jobs", "1")
    assert r.exit_code == 2, r.output
    line = check_line(r.stderr, r.stdout)
    assert "manifest.json: cannot write: " + os.strerror(errno.ENOSPC) in line
    assert temporaries([out]) == []


# --- names ----------------------------------------------------------------------------------------
def test_a_temporary_fits_beside_any_file_name(tmp_path):
    names = ["n" * n for n in range(230, 256)] + ["\u00e9" * 127 + "n", os.fsdecode(b"\xff" * 255)]
    for name in names:
        PF.atomic_write_bytes(tmp_path / name, b"x")
        assert (tmp_path / name).read_bytes() == b"x"
    assert temporaries([tmp_path]) == []
    key = PF.temporary_key("n" * 255)
    (tmp_path / f".{key}.abc123.tmp").write_bytes(b"stale")
    assert [p.name for p in clean_stale_temporaries(tmp_path, ["n" * 255])] == [f".{key}.abc123.tmp"]


def test_a_255_byte_checkpoint_name(tmp_path):
    """Its artifacts' names cannot exist: one line, nothing written, OUT not even made."""
    src = tmp_path / ("S" * 252 + ".pt")
    shutil.copy(SMALL, src)
    out = tmp_path / "out"
    promise([src, out], watch=[tmp_path], expect="file name too long")
    assert not out.exists()


@pytest.mark.slow
def test_the_longest_name_that_fits(tmp_path):
    """The longest artifact name is exactly 255 bytes: the set is written (temporaries named by a
    digest) and verified, and nothing else is left."""
    stem = "L" * (255 - max(len(s) for s in SUFFIXES.values()))
    src = tmp_path / "src" / f"{stem}.pt"
    src.parent.mkdir()
    shutil.copy(SMALL, src)
    out = tmp_path / "out"
    r = run(src, out, *FAST)
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{stem}{s}" for k, s in SUFFIXES.items()
                                                           if k not in TARGET_OF)  # no --targets: none of theirs


NON_UTF8 = os.fsdecode(b"Small-\xff\xfe-4157.pt")


@pytest.mark.slow
def test_a_non_utf8_name_converts_and_its_metadata_is_utf8(tmp_path):
    src = tmp_path / "src" / NON_UTF8
    src.parent.mkdir()
    shutil.copy(SMALL, src)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "huggy_convert.cli", os.fsencode(src), os.fsencode(out), "--no-verify"],
                       capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    data = (out / (src.stem + ".safetensors")).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    meta = json.loads(data[8:8 + n].decode("utf-8"))["__metadata__"]  # strict UTF-8
    assert meta["source_file"] == "Small-\\xff\\xfe-4157.pt"


BAD_NAMES = {"non-utf8": NON_UTF8, "spaces": "my Small 4157.pt", "newline": "Small\n4157.pt",
             "tab-and-cr": "Small\t41\r57.pt", "leading-dash": "-Small-4157.pt"}


@pytest.mark.parametrize("case", sorted(BAD_NAMES))
def test_a_bad_checkpoint_with_an_odd_name_is_one_line(tmp_path, case):
    """A truncated checkpoint under an odd name: still one printable line (the name escaped)."""
    src = tmp_path / "src" / BAD_NAMES[case]
    src.parent.mkdir()
    src.write_bytes(SMALL.read_bytes()[:5000])
    out = tmp_path / "out"
    args = ["convert", "--", src, out] if case == "leading-dash" else [src, out]
    line = promise(args, watch=[tmp_path])
    line.encode("utf-8")  # printable as UTF-8
    assert not out.exists()


@pytest.mark.parametrize("case", ["spaces", "newline"])
def test_an_odd_name_converts(tmp_path, case):
    src = tmp_path / "src" / BAD_NAMES[case]
    src.parent.mkdir()
    shutil.copy(SMALL, src)
    r = run(src, tmp_path / "out", "--no-verify")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        f"{src.stem}{SUFFIXES[k]}" for k in ("safetensors", "onnx", "pt2"))


# --- kill -----------------------------------------------------------------------------------------
def test_a_single_conversion_removes_the_stale_temporaries_of_its_files(tmp_path):
    """What a kill mid-write leaves (``.<name>.<random>.tmp`` of the files it writes) goes at the
    next conversion of that stem; the user's own ``.tmp`` files and another stem's stay."""
    out = tmp_path / "out"
    out.mkdir()
    stale = [f".{STEM}.onnx.k1ll3d.tmp", f".{STEM}.safetensors.a_b_c1.tmp", f".{STEM}.verify.json.zz9.tmp"]
    users = [".notes.tmp", ".draft.onnx.x1y2z3.tmp", ".Other-1.onnx.k1ll3d.tmp", f".{STEM}.onnx.tmp"]
    for n in stale + users:
        (out / n).write_bytes(b"half a file")
    r = run(SMALL, out, "--no-verify")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(".tmp")) == sorted(users)
    assert not list(out.glob("*.lock"))


@pytest.mark.parametrize("previous", [False, True], ids=["fresh", "over-a-previous-set"])
@pytest.mark.parametrize("nth", [1, 2, 3, 4, 5], ids=ORDER)
@pytest.mark.parametrize("where", ["after-the-rename", "inside-mkstemp"])
def test_an_interrupt_anywhere_in_a_set_write_is_rolled_back(tmp_path, monkeypatch, where, nth, previous):
    """Ctrl-C (a ``KeyboardInterrupt``) at the nth file of a transaction, where a rollback that went
    by how far the write got misses it: the file already renamed but its write not yet returned, or
    the temporary created but its name not yet returned by ``mkstemp``. The set is as it was (none,
    or the previous bytes) and no temporary is left."""
    import huggy_convert.core.artifacts as A

    arts = ArtifactSet(tmp_path, "s")
    kinds = ["safetensors", "onnx", "pt2", "golden", "report"]
    old = {k: f"old {k}".encode() for k in kinds}
    if previous:
        for k in kinds:
            arts.write(k, old[k])
    calls = []
    if where == "after-the-rename":
        real = A.sha256_bytes  # ArtifactSet.write hashes the bytes after atomic_write_bytes' rename

        def hashed(data):
            calls.append(1)
            if len(calls) == nth:
                raise KeyboardInterrupt
            return real(data)
        monkeypatch.setattr(A, "sha256_bytes", hashed)
    else:
        real = PF.tempfile.mkstemp

        def mkstemp(*a, **k):
            fd, name = real(*a, **k)
            calls.append(1)
            if len(calls) == nth:
                os.close(fd)
                raise KeyboardInterrupt  # as on return from os.open, the file there
            return fd, name
        monkeypatch.setattr(PF.tempfile, "mkstemp", mkstemp)
    with pytest.raises(KeyboardInterrupt):
        with arts.transaction() as tx:
            tx.write_all({k: f"new {k}".encode() for k in kinds[:3]})
            tx.write_all({k: f"new {k}".encode() for k in kinds[3:]})
    assert len(calls) == nth
    assert temporaries([tmp_path]) == []
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == \
        ({arts.name(k): old[k] for k in kinds} if previous else {})


@pytest.mark.slow
def test_kill_9_at_random_moments_then_the_same_command(tmp_path):
    """Seeded kills of a real process at moments spread over its run; after each, the same command
    (in-process) leaves no temporary and a complete set."""
    out = tmp_path / "out"
    args = [str(SMALL), str(out), "--no-verify"]
    cmd = [sys.executable, "-m", "huggy_convert.cli", *args]
    t0 = time.monotonic()
    subprocess.run(cmd, capture_output=True, timeout=300, check=True)
    span = time.monotonic() - t0
    rng = random.Random(SEED)
    for _ in range(3):
        shutil.rmtree(out, ignore_errors=True)
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.6, 1.05) * span)
        p.send_signal(signal.SIGKILL)
        p.wait()
        r = run(*args)
        assert r.exit_code == 0, r.output
        assert temporaries([out]) == []
        assert sorted(p.name for p in out.iterdir()) == sorted(
            f"{STEM}{SUFFIXES[k]}" for k in ("safetensors", "onnx", "pt2"))


# --- concurrent -----------------------------------------------------------------------------------
def test_the_lock_on_a_stem_excludes_and_cleans_up(tmp_path):
    inside, overlaps = [], []

    def hold(i):
        with locked(tmp_path, "Huggy-1"):
            if inside:
                overlaps.append(i)
            inside.append(i)
            time.sleep(0.05)
            inside.remove(i)

    threads = [threading.Thread(target=hold, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []
    assert list(tmp_path.iterdir()) == []
    with locked(tmp_path, "x" * 255) as p:  # a lock's name fits too
        assert p.exists()


@pytest.mark.slow
def test_two_conversions_with_one_stem_into_one_out(tmp_path):
    """Different checkpoints, the same stem, one OUT, at the same time: both finish, and what OUT
    holds is one checkpoint's set, verified as one (``verify OUT/`` compares every file with the
    sha256 its report recorded)."""
    a, b = tmp_path / "a" / f"{STEM}.pt", tmp_path / "b" / f"{STEM}.pt"
    a.parent.mkdir()
    b.parent.mkdir()
    shutil.copy(SMALL, a)
    shutil.copy(step_checkpoints(VARIANTS / "nonorm")[-1], b)
    out = tmp_path / "out"
    procs = [subprocess.Popen([sys.executable, "-m", "huggy_convert.cli", str(s), str(out), *FAST],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for s in (a, b)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
    r = run("verify", out, *FAST, "--json")
    assert r.exit_code == 0, r.output
    assert temporaries([out]) == [] and not list(out.glob(".*.lock"))


# --- devices --------------------------------------------------------------------------------------
def _has_cuda():
    import torch

    return torch.cuda.is_available()


def _has_npu_module():
    import importlib.util

    return importlib.util.find_spec("torch_npu") is not None


DEVICES = {"cuda": ("cuda", _has_cuda), "cuda:0": ("cuda", _has_cuda), "npu": ("npu", _has_npu_module),
           "bogus": ("unknown device", None), "long": ("unknown device", None)}


@pytest.mark.parametrize("command", ["checkpoint", "run-directory", "verify"])
@pytest.mark.parametrize("case", sorted(DEVICES))
def test_a_missing_device_fails_before_any_write(tmp_path, converted, case, command):
    expect, present = DEVICES[case]
    if present is not None and present():
        pytest.skip(f"this machine has {case}")
    dev = "x" * 5000 if case == "long" else case
    if command == "verify":
        out = copy_set(converted, tmp_path / "out")
        promise(["verify", out, "--verify-device", dev], watch=[out], expect=expect)
    else:
        out = tmp_path / "out"
        promise([SMALL if command == "checkpoint" else SMALL_RUN, out, "--verify-device", dev],
                watch=[tmp_path, SMALL_RUN], expect=expect)
        assert not out.exists()


# --- foreign --------------------------------------------------------------------------------------
ERRNOS = ["EACCES", "EROFS", "ENOSPC", "ENAMETOOLONG", "ENOTDIR", "ELOOP", "EDQUOT", "EIO", "EPERM", "EEXIST",
          "EISDIR", "EMFILE"]


@pytest.mark.parametrize("name", ERRNOS)
def test_from_os_error(name):
    code = getattr(errno, name)
    exc = OSError(code, os.strerror(code), "/x/.Huggy-1.onnx.abc.tmp")
    out = from_os_error(exc, "/x/Huggy-1.onnx")
    assert isinstance(out, OutputError) and isinstance(out, OSError) and out.errno == code and out.exit_code == 2
    assert out.one_line() == f"/x/Huggy-1.onnx: cannot write: {os.strerror(code)}"
    inp = from_os_error(exc, "/x/Huggy-1.pt", output=False)
    assert isinstance(inp, InputError) and inp.one_line() == f"/x/Huggy-1.pt: cannot read: {os.strerror(code)}"


def test_from_foreign():
    assert from_foreign(MemoryError(), "big.pt").one_line() == "big.pt: too large to process here (MemoryError)"
    e = from_foreign(ValueError("v" * 10000), "a.pt")
    assert isinstance(e, InternalError) and e.exit_code == EXIT_INTERNAL == 3
    assert e.one_line().startswith("a.pt: internal error: ValueError: vvv") and len(e.one_line()) < MAX_LINE
    denied = PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/f")
    assert from_foreign(denied).one_line() == f"/f: cannot read: {os.strerror(errno.EACCES)}"
    err = InputError("x")
    assert from_foreign(err) is err


INJECTED = {"bug": (ZeroDivisionError("division by zero"), 3, "internal error: ZeroDivisionError"),
            "out-of-memory": (MemoryError(), 2, "too large"),
            "permission": (PermissionError(13, "Permission denied", "/some/file"), 2, "/some/file: cannot read"),
            "interrupted-io": (InterruptedError(4, "Interrupted system call"), 2, "Interrupted system call"),
            "newline-bug": (RuntimeError("a\nb\nc" * 1000), 3, "internal error: RuntimeError")}


@pytest.mark.parametrize("command", ["convert", "verify", "info"])
@pytest.mark.parametrize("case", sorted(INJECTED))
def test_an_unexpected_failure_at_the_top_level_is_one_line(tmp_path, monkeypatch, converted, case, command):
    """No traceback, never exit 1 (a verdict); a bug is exit 3 naming its type."""
    exc, code, expect = INJECTED[case]

    def boom(*a, **k):
        raise exc

    if command == "convert":
        import huggy_convert.pipeline as P

        monkeypatch.setattr(P, "prepare_conversion", boom)
        args, watch = [SMALL, tmp_path / "out"], [tmp_path, SMALL_RUN]
    elif command == "verify":
        import huggy_convert.verify as V

        monkeypatch.setattr(V, "verify", boom)  # what verify OUT/ runs on each set (batch.reverify.verify_set)
        out = copy_set(converted, tmp_path / "out")
        args, watch = ["verify", out], [out]
    else:
        import huggy_convert.modes.info as I

        monkeypatch.setattr(I, "spec_dict", boom)
        args, watch = ["info", SMALL], [SMALL_RUN]
    promise(args, watch=watch, expect=expect, code=code)

