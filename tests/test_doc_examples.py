"""Every code block of README.md and the guides (docs/*.md,
docs/batch_study/README.md) runs as a reader pastes it, or says why it cannot.

A block that cannot run here (needs ImageNet, a cluster or a TPU, trains for
minutes, is a command's printed output or a formula) has, on a line of the
HTML comments directly above its fence, `<!-- not run: the reason -->`:
GitHub and the site show nothing of it. Every other block runs:

- `python`: in a fresh namespace with nothing defined, as pasted alone into a
  new interpreter; unless the sentence just above it says which block it
  continues ("Continuing the example above"), then in the namespace of the
  page's blocks before it. The blocks check their own claims (`assert`), and
  CLAIMS below checks the complete examples' results.
- a block without a language, `bash`, `sh` or `shell`: bash runs it (-e: every
  command must succeed) in an empty folder.
- any other language (yaml, ...) must be marked.

Our own runner over the fenced blocks, rather than pytest-markdown-docs or
sybil: it is short with no dependency, runs the shell blocks too, and the
reason, not only the skip, is required and checked.
"""

import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
NOT_RUN = re.compile(r"^\s*<!-- not run: (\S.*?) -->\s*$")
CONTINUES = re.compile(r"\b[Cc]ontinu(?:es|ing) the [\w' ,-]*?(?:example|block)s? above\b")
SHELL = {"", "bash", "sh", "shell"}


def pages():
    docs = os.path.join(ROOT, "docs")
    found = ["README.md"]
    found += sorted(f"docs/{name}" for name in os.listdir(docs) if name.endswith(".md"))
    return found + ["docs/batch_study/README.md"]


def parse(text):
    """[(line, language, code, reason or None, continues)] for each fenced
    block of the Markdown `text`; `continues`: the prose just above it says
    it continues an earlier block."""
    lines = text.splitlines()
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
        while above >= 0 and not lines[above].strip():
            above -= 1
        lead = []  # the paragraph above
        while above >= 0 and lines[above].strip() and not FENCE.match(lines[above]):
            lead.insert(0, lines[above])
            above -= 1
        continues = bool(CONTINUES.search(" ".join(lead)))
        found.append((i + 1, language, code, reason, continues))
        i = end + 1
    return found


def blocks(page):
    with open(os.path.join(ROOT, page)) as f:
        return parse(f.read())


def run_python(page, text):
    """Runs the Python blocks of `text` as a reader pastes them; returns the
    namespaces, one for each block that starts afresh."""
    chains = []
    for line, language, code, reason, continues in parse(text):
        if language != "python" or reason:
            continue
        if not continues:
            chains.append({"__name__": "__main__"})
        elif not chains:
            raise AssertionError(f"{page}:{line}: says it continues, but no block runs before it")
        try:
            exec(compile(code, f"{page}:{line}", "exec"), chains[-1])
        except Exception as error:
            raise AssertionError(f"{page}:{line}: {type(error).__name__}: {error}") from error
    return chains


def _readme(chains):
    """The complete example trains, saves and loads a LARS with its schedule."""
    import keras_lars

    complete = chains[0]
    assert complete["accuracy"] > 0.8  # 4 classes: chance is 0.25
    assert isinstance(complete["model"].optimizer, keras_lars.LARS)
    assert int(complete["model"].optimizer.iterations) == 80  # 10 epochs of 8 steps


def _optimizers(chains):
    import keras_lars

    complete = chains[0]
    assert complete["accuracy"] > 0.8
    assert isinstance(complete["model"].optimizer, keras_lars.LAMB)


def _distributed(chains):
    import keras_lars

    complete = chains[0]
    assert isinstance(complete["model"].optimizer, keras_lars.LARS)
    assert int(complete["model"].optimizer.iterations) == 16  # 2 epochs of 8 steps


# What a page's complete examples produce, checked on the namespaces run_python returns.
CLAIMS = {
    "README.md": _readme,
    "docs/optimizers.md": _optimizers,
    "docs/distributed.md": _distributed,
}


def test_every_block_runs_or_says_why_not():
    unmarked = [
        f"{page}:{line}: a ```{language} block: mark it <!-- not run: why -->"
        for page in pages()
        for line, language, _, reason, _ in blocks(page)
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


def test_a_block_sees_only_what_it_defines_or_the_blocks_it_says_it_continues():
    first = "Text.\n\n```python\nvalue = 2\n```\n\n"
    continued = first + "Continuing the example above:\n\n```python\nassert value == 2\n```\n"
    assert run_python("page.md", continued)[0]["value"] == 2
    alone = first + "Another example:\n\n```python\nassert value == 2\n```\n"
    with pytest.raises(AssertionError, match=r"page\.md:9: NameError: name 'value'"):
        run_python("page.md", alone)
    marked = first + "<!-- not run: a template -->\n```python\nmodel.fit(x)\n```\n"
    assert len(run_python("page.md", marked)) == 1
    orphan = "Continuing the example above:\n\n```python\nvalue = 1\n```\n"
    with pytest.raises(AssertionError, match="no block runs before it"):
        run_python("page.md", orphan)
    failed_claim = "```python\nassert 1 == 2, 'claimed'\n```\n"
    with pytest.raises(AssertionError, match="page.md:1: AssertionError: claimed"):
        run_python("page.md", failed_claim)


def _python_pages():
    return [p for p in pages() if any(b[1] == "python" and not b[3] for b in blocks(p))]


def _shell_blocks():
    return [
        pytest.param(page, line, code, id=f"{page}:{line}")
        for page in pages()
        for line, language, code, reason, _ in blocks(page)
        if language in SHELL and not reason
    ]


def test_the_pages_with_complete_examples_run():
    assert set(CLAIMS) <= set(_python_pages())


@pytest.mark.parametrize("page", _python_pages())
def test_python_blocks_run_as_pasted(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open(os.path.join(ROOT, page)) as f:
        chains = run_python(page, f.read())
    CLAIMS.get(page, lambda chains: None)(chains)


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
