"""The package's import graph: no cycle, no import that climbs the layer order ARCHITECTURE.md states,
and no function-local import of a package module.

The graph is read from the source (an AST walk over every module), not from what an interpreter
happened to import: every ``import`` and ``from … import`` counts, at module level, inside a function
or under ``if TYPE_CHECKING``, relative ones resolved (``from . import x`` is an edge to the submodule
``x`` where there is one, else to the package). Importing ``a.b.c`` from outside ``a.b`` also runs
the package ``a.b``'s ``__init__``: that edge counts too (the root package excepted: it is the public
API on top, run first by any import of the package).
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "huggy_convert"
PKG = PACKAGE.name


def _layer_table() -> List[Tuple[str, ...]]:
    """The layer order ARCHITECTURE.md states, bottom first: the first column of its layer table, each
    row one layer of one or more modules or packages (``contract/``, ``pipeline.py``, ``rundir.py``...),
    named relative to the package (``huggy_convert`` itself: the root package, the public API)."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("## The layers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split("|")[1]
        names = tuple(n.strip("/").removesuffix(".py") for n in re.findall(r"`([^`]+)`", first))
        rows.append(names)
    return rows


LAYERS = _layer_table()

# The table mirrored: what this test holds ARCHITECTURE.md to (a change of layers is a change of both).
EXPECTED_LAYERS = [
    ("contract",),
    ("errors",),
    ("core",),
    ("blocks",),
    ("converter",),
    ("exporters",),
    ("runtime", "host"),
    ("verify",),
    ("importers",),
    ("conformance",),
    ("pipeline",),
    ("batch",),
    ("console",),
    ("modes",),
    ("cli",),
    (PKG, "api", "__main__"),
]

# Third-party modules a function may import where it needs them: optional or heavy dependencies whose
# import the package defers (ARCHITECTURE.md, "What a conversion imports"). Every other import is at
# module level.
DEFERRED = {
    "torch": "heavy (~1 s with its libraries): the numpy-only paths (the spec, the key rules' types, the "
             "canonical file's metadata) do not pay for it at import; and torch.export, torch._export, "
             "torch._dynamo (the .pt2 only: ~1 s more with sympy; --no-program never imports them)",
    "torch_npu": "optional: Ascend NPUs only, and importing it changes torch's device backends",
    "onnx": "heavy (protobuf): only what builds or reads a graph pays for it",
    "onnxruntime": "heavy (~0.3 s): only what runs a session pays for it",
    "safetensors": "only what writes or reads the canonical file pays for it",
    "click": "the command line only (the library's stages never import it)",
    "fcntl": "POSIX only (the writer's lock; absent on Windows)",
    "resource": "POSIX only (peak memory; absent on Windows)",
    "ctypes": "only where a worker's parent-death signal is set (Linux)",
    "openvino": "optional extra (huggy-convert[openvino]): the OpenVINO target only (exporters/runtime targets)",
    "litert_torch": "optional extra (huggy-convert[litert]): the LiteRT target's converter only",
    "ai_edge_litert": "optional extra (huggy-convert[litert]): the LiteRT target's interpreter only",
    "executorch": "optional extra (huggy-convert[executorch]), its own environment: the ExecuTorch target only",
}

# the root package's lazy public API (PEP 562 ``__getattr__``): ``import huggy_convert`` stays free of torch
# and onnx; the root is the top layer, so its one deferred import can hide no cycle
LAZY_ROOT = {"__init__.py"}  # a name ending in / would exempt every file under it


def _modules(package: Path) -> Dict[str, Tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``), for every module of ``package``."""
    out = {}
    for p in sorted(package.rglob("*.py")):
        parts = list(p.relative_to(package.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return out


class Import:
    __slots__ = ("source", "target", "line", "local")

    def __init__(self, source: str, target: str, line: int, local: bool):
        self.source, self.target, self.line, self.local = source, target, line, local

    def __repr__(self):
        return f"{self.source}:{self.line} -> {self.target}{' (function-local)' if self.local else ''}"


def _targets(module: str, is_pkg: bool, node, modules) -> List[str]:
    """The modules an import statement imports (relative ones resolved)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = module if is_pkg else module.rpartition(".")[0]
    for _ in range(node.level - 1 if node.level else 0):
        base = base.rpartition(".")[0]
    target = (base + ("." + node.module if node.module else "")) if node.level else node.module
    names = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]
    return list(dict.fromkeys(names))


def imports(package: Path = PACKAGE) -> Tuple[Dict[str, Tuple[Path, bool]], List[Import]]:
    """Every import statement of every module of ``package`` (one entry per module it names)."""
    modules = _modules(package)
    found = []
    for module, (path, is_pkg) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))

        def visit(node, local):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for t in _targets(module, is_pkg, child, modules):
                        found.append(Import(module, t, child.lineno, local))
                visit(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        visit(tree, False)
    return modules, found


def _ours(name: str, root: str) -> bool:
    return name == root or name.startswith(root + ".")


def graph(modules, found: Iterable[Import], root: str = PKG) -> Dict[str, Set[str]]:
    """Module -> the package modules it imports: each import's target and the packages above the
    target (their ``__init__`` runs first), the root package excepted."""
    g: Dict[str, Set[str]] = {m: set() for m in modules}
    for imp in found:
        if not _ours(imp.target, root):
            continue
        parts = imp.target.split(".")
        for k in range(2, len(parts) + 1):
            t = ".".join(parts[:k])
            # a package's own modules are run by its __init__, not the other way round
            if t in modules and t != imp.source and (k == len(parts) or not _ours(imp.source, t)):
                g[imp.source].add(t)
        if imp.target == root:
            g[imp.source].add(root)
    return g


def cycles(g: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (or a module importing itself), by
    Tarjan's algorithm (iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out = []
    counter = 0
    for start in sorted(g):
        if start in index:
            continue
        work = [(start, iter(sorted(g[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in g.get(v, ()):
                    out.append(sorted(comp))
    return out


def layer_of(module: str, layers=None, root: str = PKG) -> int:
    """The row of ``module`` in the layer table (its longest matching name); KeyError where none."""
    layers = LAYERS if layers is None else layers
    rel = module[len(root) + 1:] if module != root else root
    best = None
    for i, row in enumerate(layers):
        for name in row:
            if rel == name or rel.startswith(name + "."):
                if best is None or len(name) > best[1]:
                    best = (i, len(name))
    if best is None:
        raise KeyError(module)
    return best[0]


def climbing(modules, found: Iterable[Import], layers=None, root: str = PKG) -> List[str]:
    """Every import of a package module from a lower layer than the importing module's (a climb)."""
    out = []
    for imp in found:
        if not _ours(imp.target, root) or imp.target not in modules:
            continue
        a, b = layer_of(imp.source, layers, root), layer_of(imp.target, layers, root)
        if b > a:
            out.append(f"{imp!r} climbs: layer {a} ({'/'.join((layers or LAYERS)[a])}) imports layer "
                       f"{b} ({'/'.join((layers or LAYERS)[b])})")
    return out


def _third_party(name: str) -> bool:
    return not _ours(name, PKG)


def _deferred_ok(name: str) -> bool:
    return any(name == d or name.startswith(d + ".") for d in DEFERRED)


def function_local(modules, found: Iterable[Import], root: str = PKG, exempt: Set[str] = frozenset()) -> List[str]:
    """Function-local imports that are not of a DEFERRED dependency: every package module, every module
    of the standard library not named there (the files in ``exempt`` excepted)."""
    out = []
    for imp in found:
        rel = modules[imp.source][0].relative_to(modules[root][0].parent).as_posix()
        if not imp.local or any(rel == e or (e.endswith("/") and rel.startswith(e)) for e in exempt):
            continue
        if _ours(imp.target, root):
            out.append(f"{imp!r}: a package module (import it at module level)")
        elif not _deferred_ok(imp.target):
            out.append(f"{imp!r}: not a deferred dependency (import it at module level, or name it in DEFERRED)")
    return out


# --- the package ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def package():
    return imports(PACKAGE)


def test_the_layer_table_is_architecture_md(package):
    assert LAYERS == EXPECTED_LAYERS
    modules, _ = package
    unplaced = []
    for m in modules:
        try:
            layer_of(m)
        except KeyError:
            unplaced.append(m)
    assert not unplaced, f"modules in no layer of ARCHITECTURE.md's table: {unplaced}"


def test_no_import_cycle(package):
    modules, found = package
    found_cycles = cycles(graph(modules, found))
    assert not found_cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found_cycles)


def test_no_import_climbs_a_layer(package):
    modules, found = package
    climbs = climbing(modules, found)
    assert not climbs, f"{len(climbs)} imports climb the layer order:\n" + "\n".join(climbs)


def test_function_local_imports_are_deferred_dependencies_only(package):
    modules, found = package
    bad = function_local(modules, found, exempt=LAZY_ROOT)
    assert not bad, f"{len(bad)} function-local imports:\n" + "\n".join(bad)


def test_core_imports_only_the_contract_and_errors(package):
    modules, found = package
    allowed = (f"{PKG}.contract", f"{PKG}.errors", f"{PKG}.core")
    bad = [repr(i) for i in found if i.source.startswith(f"{PKG}.core") and _ours(i.target, PKG)
           and not any(_ours(i.target, a) for a in allowed)]
    assert not bad, "\n".join(bad)


# --- the checks themselves catch what they are for -------------------------------------------------

def _toy(tmp_path, files: Dict[str, str]):
    pkg = tmp_path / "toy"
    for rel, text in {"__init__.py": "", **files}.items():
        p = pkg / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return imports(pkg)


def test_a_cycle_hidden_in_a_function_is_found(tmp_path):
    modules, found = _toy(tmp_path, {
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from ..high import b\n",
        "high/__init__.py": "",
        "high/b.py": "from ..low import a\n",
        "c.py": "from .low import a\nfrom . import d\n",
        "d.py": "from toy import c\n",
    })
    got = cycles(graph(modules, found, "toy"))
    assert sorted(got) == [["toy.c", "toy.d"], ["toy.high.b", "toy.low.a"]]
    assert [i.local for i in found if i.source == "toy.low.a"] == [True]


def test_a_package_init_is_part_of_the_graph(tmp_path):
    """Importing a submodule runs its package's __init__: a cycle through it is a cycle."""
    modules, found = _toy(tmp_path, {
        "low/__init__.py": "from .a import x\nfrom ..high import y\n",
        "low/a.py": "x = 1\n",
        "high.py": "from .low.a import x\ny = 2\n",
    })
    assert cycles(graph(modules, found, "toy")) == [["toy.high", "toy.low"]]


def test_a_climbing_import_is_found(tmp_path):
    modules, found = _toy(tmp_path, {
        "low.py": "import json\nfrom . import high\n",
        "high.py": "from .low import json\n",
    })
    layers = [("low",), ("high",), ("toy",)]
    got = climbing(modules, found, layers, "toy")
    assert len(got) == 1 and got[0].startswith("toy.low:2 -> toy.high") and "climbs" in got[0]
    with pytest.raises(KeyError):
        layer_of("toy.other", layers, "toy")


def test_a_function_local_import_is_found(tmp_path):
    modules, found = _toy(tmp_path, {
        "a.py": "import os\ndef f():\n    import torch\n    import json\n    from . import b\n    return os\n",
        "b.py": "x = 1\n",
        "sub/__init__.py": "",
        "sub/c.py": "def g():\n    import json\n",
    })
    got = function_local(modules, found, "toy")
    assert len(got) == 3 and "toy.a:4 -> json" in got[0] and "toy.a:5 -> toy.b" in got[1] and "toy.sub.c:2" in got[2]
    assert function_local(modules, found, "toy", exempt={"a.py"}) == got[2:]
    assert function_local(modules, found, "toy", exempt={"sub/", "a/"}) == got[:2]


def test_a_spec_has_its_blocks_whatever_is_imported_first():
    """core.spec never imports the blocks; the registry binds itself when the package is imported
    (``huggy_convert/__init__`` imports the converter, which imports the blocks). A fresh interpreter
    that imports nothing but the spec gets its ports and parameter count (and no torch, no onnx)."""
    code = ("import sys\nfrom huggy_convert.core.spec import PolicySpec\n"
            "s = PolicySpec('ppo', (59,), True, 512, 3, 21)\n"
            "print(s.parameter_count(), s.encoded_width, s.input_names(), 'torch' in sys.modules, 'onnx' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-800:]
    assert r.stdout.split() == ["566826", "59", "['obs_0']", "False", "False"]
