"""Every code block of README.md and the guides (docs/*.md,
docs/batch_study/README.md) runs, or says why it cannot.

A block that cannot run here (needs ImageNet, a cluster or a TPU, trains for
minutes, is a command's printed output or a formula) has, on a line of the
HTML comments directly above its fence, `<!-- not run: the reason -->`:
GitHub and the site show nothing of it. Every other block runs:

- `python`: a page's Python blocks run in order in one namespace (as doctest
  does), which starts with STAND_INS: the model and data that the guides call
  yours, tiny.
- a block without a language, `bash`, `sh` or `shell`: bash runs it (-e: every
  command must succeed) in an empty folder.
- any other language (yaml, ...) must be marked.

Our own runner over the fenced blocks, rather than pytest-markdown-docs or
sybil: it is 100 lines with no dependency, runs the shell blocks too, and
the reason, not only the skip, is required and checked.
"""

import os
import re
import subprocess

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
NOT_RUN = re.compile(r"^\s*<!-- not run: (\S.*?) -->\s*$")
SHELL = {"", "bash", "sh", "shell"}


def pages():
    docs = os.path.join(ROOT, "docs")
    found = ["README.md"]
    found += sorted(f"docs/{name}" for name in os.listdir(docs) if name.endswith(".md"))
    return found + ["docs/batch_study/README.md"]


def blocks(page):
    """[(line, language, code, reason or None)] for each fenced block of `page`."""
    with open(os.path.join(ROOT, page)) as f:
        lines = f.read().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, language = opening.groups()
        end = i + 1
        while not re.match(rf"^{indent}```\s*$", lines[end]):
            end += 1
        code = "\n".join(line[len(indent) :] for line in lines[i + 1 : end])
        reason, above = None, i - 1
        while above >= 0 and lines[above].strip().startswith("<!--"):
            marked = NOT_RUN.match(lines[above])
            reason = reason or (marked and marked.group(1))
            above -= 1
        found.append((i + 1, language, code, reason))
        i = end + 1
    return found


def stand_ins(tmp_path):
    """What the guides' examples take as given: a model, its data and loss, a
    log folder (tiny: 1,024 examples of 4 features, 3 classes)."""
    import keras

    keras.utils.set_random_seed(0)
    return {
        "model": keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]),
        "x": np.random.default_rng(0).normal(size=(1024, 4)).astype("float32"),
        "y": np.random.default_rng(1).integers(0, 3, size=1024),
        "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        "log_dir": str(tmp_path / "logs"),
    }


def test_every_block_runs_or_says_why_not():
    unmarked = [
        f"{page}:{line}: a ```{language} block: mark it <!-- not run: why -->"
        for page in pages()
        for line, language, _, reason in blocks(page)
        if reason is None and language not in SHELL | {"python"}
    ]
    assert unmarked == []
    assert sum(len(blocks(page)) for page in pages()) > 40  # the parser found them


def test_a_marker_stands_only_above_a_block():
    for page in pages():
        with open(os.path.join(ROOT, page)) as f:
            lines = f.read().splitlines()
        for number, line in enumerate(lines):
            if "<!-- not run" in line:
                assert NOT_RUN.match(line), f"{page}:{number + 1}: <!-- not run: reason -->"
                below = number + 1
                while lines[below].strip().startswith("<!--"):
                    below += 1
                assert FENCE.match(lines[below]), f"{page}:{number + 1}: no block below"


def _python_pages():
    return [p for p in pages() if any(b[1] == "python" and not b[3] for b in blocks(p))]


def _shell_blocks():
    return [
        pytest.param(page, line, code, id=f"{page}:{line}")
        for page in pages()
        for line, language, code, reason in blocks(page)
        if language in SHELL and not reason
    ]


@pytest.mark.parametrize("page", _python_pages())
def test_python_blocks_run_in_order(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = stand_ins(tmp_path)
    for line, language, code, reason in blocks(page):
        if language == "python" and not reason:
            try:
                exec(compile(code, f"{page}:{line}", "exec"), namespace)
            except Exception as error:
                pytest.fail(f"{page}:{line}: {type(error).__name__}: {error}")


@pytest.mark.parametrize("page, line, code", _shell_blocks())
def test_shell_blocks_run(page, line, code, tmp_path):
    done = subprocess.run(
        ["bash", "-e", "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{page}:{line}: exit {done.returncode}\n{done.stderr[-2000:]}"
