"""A policy family is one file: no code outside ``blocks/`` and ``contract/`` names a family.

The count reads the source, not what runs: every identifier and every string literal of every module of
the package, comments and docstrings left out (they explain; they do not branch). An identifier is split
into its words (``snake_case``, ``CamelCase``, ``ALL_CAPS``), a string into its words, and a word that
names a family counts its line once. The families and their words:

- discrete actions: ``discrete``;
- continuous actions and SAC's head: ``continuous``, ``sac``, ``squash`` / ``squashed``;
- memory (the LSTM): ``memory``, ``lstm``, ``recurrent``;
- goal conditioning: ``goal`` / ``goals``, ``hyper`` / ``hypernetwork``;
- visual observations: ``visual``, ``camera`` / ``cameras``, ``cnn``, ``resnet``;
- attention over variable-length observations: ``attention``, ``entity`` / ``entities``.

``FOREIGN`` lists identifiers of other libraries whose words only look like a family's (a computer's
memory, not an LSTM's), each with the reason; nothing else is exempt.
"""
from __future__ import annotations

import io
import re
import tokenize
from collections import defaultdict
from pathlib import Path
from typing import Dict, Set

PACKAGE = Path(__file__).resolve().parents[1] / "huggy_convert"
OWNERS = ("blocks/", "contract/")

FAMILIES = {
    "discrete": {"discrete"},
    "continuous": {"continuous", "sac", "squash", "squashed"},
    "memory": {"memory", "lstm", "recurrent"},
    "goal": {"goal", "goals", "hyper", "hypernetwork"},
    "visual": {"visual", "camera", "cameras", "cnn", "resnet"},
    "attention": {"attention", "entity", "entities"},
}
WORD_FAMILY = {w: fam for fam, words in FAMILIES.items() for w in words}
# an f-string is one STRING token before Python 3.12, its parts after
TEXT_TOKENS = {tokenize.NAME, tokenize.STRING} | ({tokenize.FSTRING_MIDDLE} if hasattr(tokenize, "FSTRING_MIDDLE") else set())

FOREIGN = {
    "MemoryError": "Python's out-of-memory exception",
    "max_memory_allocated": "torch.cuda's peak device memory",
    "reset_peak_memory_stats": "torch.cuda's peak device memory",
    "may_share_memory": "numpy: whether two arrays share a buffer",
    "share_memory": "torch.nn.Module's shared-memory tensors (a name it forwards)",
}


def _words(text: str):
    for token in re.findall(r"[A-Za-z0-9]+", text):
        for part in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+", token):
            yield part.lower()


def _docstring_tokens(tokens) -> Set[int]:
    """Indices of the string tokens that stand alone as a statement (docstrings)."""
    out = set()
    for i, t in enumerate(tokens):
        if t.type != tokenize.STRING:
            continue
        j = i - 1
        while j >= 0 and tokens[j].type in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            j -= 1
        k = i + 1
        while k < len(tokens) and tokens[k].type == tokenize.STRING:  # implicit concatenation
            k += 1
        starts_statement = j < 0 or tokens[j].type == tokenize.NEWLINE
        ends_statement = k >= len(tokens) or tokens[k].type in (tokenize.NEWLINE, tokenize.ENDMARKER)
        if starts_statement and ends_statement:
            out.update(range(i, k))
    return out


def family_lines(root: Path = PACKAGE) -> Dict[str, Dict[str, Set[int]]]:
    """family -> file (relative to the package) -> the code lines naming it, outside ``OWNERS``."""
    found: Dict[str, Dict[str, Set[int]]] = defaultdict(lambda: defaultdict(set))
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(OWNERS):
            continue
        tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline))
        docs = _docstring_tokens(tokens)
        for i, t in enumerate(tokens):
            if i in docs or t.type not in TEXT_TOKENS:
                continue
            text = t.string
            for name in FOREIGN:
                text = text.replace(name, " ")
            for w in set(_words(text)) & set(WORD_FAMILY):
                found[WORD_FAMILY[w]][rel].add(t.start[0])
    return found


def report(found) -> str:
    lines = []
    for fam in FAMILIES:
        files = found.get(fam, {})
        n = sum(len(s) for s in files.values())
        if n:
            top = ", ".join(f"{f} {len(s)}" for f, s in sorted(files.items(), key=lambda x: (-len(x[1]), x[0])))
            lines.append(f"{fam}: {n} lines in {len(files)} files ({top})")
    return "\n".join(lines)


def test_words_split_as_stated():
    assert list(_words("OUT_DISC_DET discrete_branches isRecurrent LSTMCell 'a camera'")) == [
        "out", "disc", "det", "discrete", "branches", "is", "recurrent", "lstm", "cell", "a", "camera"]


def test_the_counter_sees_code_not_docstrings(tmp_path):
    (tmp_path / "blocks").mkdir()
    (tmp_path / "blocks" / "memory.py").write_text("memory_size = 1\n")
    (tmp_path / "m.py").write_text('"""memory in a docstring"""\n# lstm in a comment\n'
                                   'def f(spec):\n    """discrete too"""\n    return spec.memory_size, "a camera", MemoryError\n')
    found = family_lines(tmp_path)
    assert {fam: {f: sorted(s) for f, s in files.items()} for fam, files in found.items()} == {
        "memory": {"m.py": [5]}, "visual": {"m.py": [5]}}


def test_no_family_named_outside_its_block_and_the_contract():
    found = family_lines()
    assert not any(found.values()), "code outside blocks/ and contract/ names a family:\n" + report(found)
