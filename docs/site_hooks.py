"""mkdocs hooks for the documentation site (mkdocs.yml's `hooks`).

- The home page is README.md, and CONTRIBUTING.md, CHANGELOG.md and
  tests/golden/README.md are pages too: the site shows the repository's own
  Markdown, and the links between those files and docs/ resolve as on GitHub.
- mkdocstrings reads the code statically (griffe). The distribution installs
  models/ as `keras_lars.models` (setup.cfg's package_dir), which is not a
  folder of keras_lars/ on disk, so the hook gives griffe a tree of links laid
  out as the installed package.
- A fenced block without a language that starts with `$ ` is a transcript:
  the site fences it as `console`, and docs/stylesheets/extra.css makes the
  copy button leave out its prompts and output.
- `api_problems()`: every name of `keras_lars.__all__` and
  `keras_lars.models.__all__` has one `::: keras_lars...` entry in docs/api/,
  each entry is such a name, and each has a docstring. The build reports each
  problem as a warning, so `mkdocs build --strict` fails on it;
  tests/test_site.py runs the same check without mkdocs.

Only the standard library is imported at the top: the test loads this file.
"""

import ast
import logging
import os
import posixpath
import re
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
API = os.path.join(DOCS, "api")
# Repository Markdown outside docs/ shown on the site: path in the repository ->
# path on the site.
OUTSIDE_DOCS = {
    "README.md": "index.md",
    "CONTRIBUTING.md": "CONTRIBUTING.md",
    "CHANGELOG.md": "CHANGELOG.md",
    "tests/golden/README.md": "tests/golden/README.md",
}
# Where each public package's source lies in the repository.
PACKAGES = {"keras_lars": "keras_lars", "keras_lars.models": "models"}
# `::: keras_lars.NAME`, or `::: keras_lars.models.NAME.NAME` for a function
# defined in the module of its own name (griffe would show the module).
ENTRY = re.compile(r"^::: (keras_lars(?:\.models)?)\.(\w+)(?:\.\2)?\s*$", re.M)
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
LINK = re.compile(r"(\]\()([^)\s#]+\.md)(#[^)\s]*)?(\))")

log = logging.getLogger("mkdocs.plugins.keras_lars")


def _parse(*parts):
    with open(os.path.join(ROOT, *parts)) as f:
        return ast.parse(f.read())


def _statements(tree):
    """A module's top-level statements, those of its top-level `if` blocks
    included (keras_lars's imports wait under `if not _quiet.holding():`)."""
    for node in tree.body:
        if isinstance(node, ast.If):
            yield from node.body
            yield from node.orelse
        else:
            yield node


def public_names(package):
    """`package`'s `__all__`, read from its source (nothing imported)."""
    tree = _parse(PACKAGES[package], "__init__.py")
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise ValueError(f"{package} has no __all__")


def api_entries():
    """{(package, name): page} for each `::: package.name` line of docs/api/*.md."""
    entries = {}
    for page in sorted(os.listdir(API)):
        if page.endswith(".md"):
            with open(os.path.join(API, page)) as f:
                for package, name in ENTRY.findall(f.read()):
                    entries[(package, name)] = f"api/{page}"
    return entries


def _has_docstring(package, name):
    """Whether `package.name` (what `package`'s __init__ imports or defines
    under that name: a submodule, a class, a function or a constant) has a
    docstring; constants count as documented by the comment lines above them."""
    source = PACKAGES[package]
    init = _parse(source, "__init__.py")
    for node in _statements(init):
        if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
            if node.module == package:  # a submodule
                if os.path.isdir(os.path.join(ROOT, source, name)):
                    return bool(ast.get_docstring(_parse(source, name, "__init__.py")))
                return bool(ast.get_docstring(_parse(source, name + ".py")))
            module = node.module.split(".")[-1]
            return _defined_with_docstring(_parse(source, module + ".py"), name)
    return _defined_with_docstring(init, name)


def _defined_with_docstring(tree, name):
    for node in _statements(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            return bool(ast.get_docstring(node))
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return True
    return False


def api_problems():
    """One line for each public name without an API entry or a docstring and
    each API entry that is not a public name; [] when they agree."""
    entries = api_entries()
    public = {(package, name) for package in PACKAGES for name in public_names(package)}
    problems = [
        f"{package}.{name} is public (its __all__) but has no '::: {package}.{name}' in docs/api/"
        for package, name in sorted(public - set(entries))
    ]
    problems += [
        f"{entries[key]}: '::: {key[0]}.{key[1]}' is not in {key[0]}.__all__"
        for key in sorted(set(entries) - public)
    ]
    problems += [
        f"{package}.{name} has no docstring"
        for package, name in sorted(public & set(entries))
        if not _has_docstring(package, name)
    ]
    return problems


def _package_tree():
    """A folder holding `keras_lars` laid out as installed: links to
    keras_lars/'s entries and `models` -> models/."""
    top = os.path.join(tempfile.mkdtemp(prefix="keras_lars_docs_"), "keras_lars")
    os.makedirs(top)
    for entry in os.listdir(os.path.join(ROOT, "keras_lars")):
        if entry != "__pycache__":
            os.symlink(os.path.join(ROOT, "keras_lars", entry), os.path.join(top, entry))
    os.symlink(os.path.join(ROOT, "models"), os.path.join(top, "models"))
    return os.path.dirname(top)


def on_config(config):
    python = config.plugins["mkdocstrings"].config.handlers.setdefault("python", {})
    python["paths"] = [_package_tree()]
    return config


# Before mkdocstrings' own on_config, which starts the Python handler with its
# paths (what mkdocs.plugins.event_priority(100) sets, without importing mkdocs).
on_config.mkdocs_priority = 100


def on_files(files, config):
    from mkdocs.structure.files import File

    for source, page in OUTSIDE_DOCS.items():
        files.append(File.generated(config, page, abs_src_path=os.path.join(ROOT, source)))
    for problem in api_problems():
        log.warning(problem)
    return files


def _repository_path(page):
    """The repository path of a site page (OUTSIDE_DOCS reversed, else docs/...)."""
    for source, site in OUTSIDE_DOCS.items():
        if site == page:
            return source
    return posixpath.join("docs", page)


def site_link(page, target):
    """`target`, a link written in `page` (a site path) relative to that
    page's file in the repository, rewritten relative to `page` on the site:
    a link into docs/ or to a file of OUTSIDE_DOCS; others unchanged."""
    if "://" in target or target.startswith("/"):
        return target
    here = posixpath.dirname(_repository_path(page))
    resolved = posixpath.normpath(posixpath.join(here, target))
    if resolved in OUTSIDE_DOCS:
        on_site = OUTSIDE_DOCS[resolved]
    elif resolved.startswith("docs/"):
        on_site = resolved[len("docs/") :]
    else:
        return target
    return posixpath.relpath(on_site, posixpath.dirname(page) or ".")


def as_console(markdown):
    """`markdown` with each fenced block that has no language and starts with
    `$ ` (a transcript: commands and their output) fenced as `console`, so
    that the copy button leaves out the prompts and the output
    (docs/stylesheets/extra.css); the Markdown files keep their plain fences."""
    lines = markdown.split("\n")
    inside = False
    for i, line in enumerate(lines):
        fence = FENCE.match(line)
        if not fence:
            continue
        starts_transcript = i + 1 < len(lines) and lines[i + 1].lstrip().startswith("$ ")
        if not inside and not fence.group(2) and starts_transcript:
            lines[i] = fence.group(1) + "```console"
        inside = not inside
    return "\n".join(lines)


def on_page_markdown(markdown, page, config, files):
    path = page.file.src_uri
    markdown = LINK.sub(
        lambda m: m.group(1) + site_link(path, m.group(2)) + (m.group(3) or "") + m.group(4),
        markdown,
    )
    return as_console(markdown)
