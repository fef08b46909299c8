"""The docs: generated pages current, README short, its commands the real ones."""

import importlib.util
import os
import re

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _generator():
    spec = importlib.util.spec_from_file_location(
        "docs_generate", os.path.join(ROOT, "docs", "generate.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read(*parts):
    with open(os.path.join(ROOT, *parts)) as f:
        return f.read()


def test_generated_pages_are_current():
    generator = _generator()
    for name, render in generator.PAGES.items():
        assert _read("docs", name) == render(), f"docs/{name} is stale: run python docs/generate.py"


def test_flags_page_lists_every_setting_of_every_tool():
    from keras_lars.tools import make_tfrecords
    from keras_lars.tools import settings
    from keras_lars.tools import train

    page = _read("docs", "flags.md")
    for schema in (train.Config, make_tfrecords.ConversionSettings):
        for field in settings.fields(schema):
            assert f"| `--{field.name}` |" in page, field.name


def test_workarounds_page_holds_the_registry():
    from keras_lars import compat

    page = _read("docs", "workarounds.md")
    assert compat.table() in page
    for workaround in compat.WORKAROUNDS:
        assert f"`{workaround.name}`" in page


def test_readme_is_short_and_its_quick_start_is_what_ci_runs():
    readme = _read("README.md")
    assert len(readme.splitlines()) <= 225  # 200, and the complete example of Usage
    block = re.search(r"## Quick start\n.*?```\n(.*?)```", readme, re.S).group(1)
    commands = block.strip().splitlines()
    assert len(commands) == 2
    assert commands[0].endswith("&& keras-lars-train")
    assert commands[1] in _read(".ci", "run").splitlines()
    for link in re.findall(r"\]\(((?:docs/|tests/|[A-Z]+\.md)[^)#]*)", readme):
        assert os.path.exists(os.path.join(ROOT, link)), link


def test_readme_links_to_the_tables_it_used_to_copy():
    readme = _read("README.md")
    for header in ("| TensorFlow | Keras |", "| record |", "| peer and mode |", "| `--"):
        assert header not in readme
    for page in (
        "docs/versions.md",
        "docs/planning.md#checked-against-the-records",
        "docs/flags.md",
    ):
        assert f"]({page})" in readme, page
    versions = _read("docs", "versions.md")
    assert "<!-- matrix: nox -s matrix_table -->\n| TensorFlow | Keras | jax |" in versions


def test_readme_batch_size_control_example_runs_and_gives_the_closed_form():
    readme = _read("README.md")
    block = re.search(r"\*\*Batch-size control\.\*\*.*?```python\n(.*?)```", readme, re.S).group(1)
    import keras_lars

    found = {}
    exec(block, {"keras_lars": keras_lars}, found)
    assert [p.global_batch_size for p in found["phases"].phases] == [4096, 8192, 8192, 16384, 16384]
    # Step 20,000 is past the 90 epochs (312 + 156 + 78 steps an epoch over 30 each:
    # 90 epochs end at step 16,380): the end rate 1e-4, scaled linearly 16384 / 4096.
    assert float(found["schedule"](20000)) == np.float32(4e-4)


# What no file of the project may say: paths of the machines it was written on,
# notes outside the repository, and the words of its internal process.
OUTSIDE = re.compile(
    r"/work/|/root/|\.\./shared|\bDESIGN\.md\b|\bREFERENCES\.md\b|\bstop \d+\b"
    r"|\bissue \d+|\bclosing note",
    re.IGNORECASE,
)
SCANNED = (".md", ".py", ".cfg", ".toml", ".yml", ".txt")


def _project_files():
    """The repository's tracked text files (git ls-files)."""
    import subprocess

    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    return [name for name in listed if name.endswith(SCANNED)]


def test_no_file_names_our_machines_notes_outside_the_repository_or_process_words():
    files = _project_files()
    assert "README.md" in files and "keras_lars/lars.py" in files
    found = []
    for name in files:
        if name == "tests/test_docs.py":  # the pattern itself
            continue
        for number, line in enumerate(_read(name).splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
    assert OUTSIDE.search("see ../shared/DESIGN.md") and OUTSIDE.search("CI of stop 37")
    assert OUTSIDE.search("(Issue 41, item 3)") and OUTSIDE.search("see the closing note")
