"""The API reference: every public name has one entry in docs/api/ and a
docstring (docs/site_hooks.py's check, which `mkdocs build --strict` runs in
CI; here without mkdocs), and the check itself catches a missing entry."""

import importlib.util
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _hooks():
    spec = importlib.util.spec_from_file_location(
        "site_hooks", os.path.join(ROOT, "docs", "site_hooks.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_public_name_has_an_api_entry_and_a_docstring():
    assert _hooks().api_problems() == []


def test_the_public_names_read_from_source_are_the_imported_ones():
    import keras_lars
    import keras_lars.models

    hooks = _hooks()
    assert hooks.public_names("keras_lars") == keras_lars.__all__
    assert hooks.public_names("keras_lars.models") == keras_lars.models.__all__
    for package in (keras_lars, keras_lars.models):
        for name in package.__all__:
            value = getattr(package, name)
            if callable(value) or hasattr(value, "__path__"):
                assert (value.__doc__ or "").strip(), f"{package.__name__}.{name}"


def test_a_name_added_to_all_without_a_page_is_reported(monkeypatch):
    hooks = _hooks()
    names = hooks.public_names
    monkeypatch.setattr(
        hooks,
        "public_names",
        lambda package: names(package) + (["Undocumented"] if package == "keras_lars" else []),
    )
    assert hooks.api_problems() == [
        "keras_lars.Undocumented is public (its __all__) but has no "
        "'::: keras_lars.Undocumented' in docs/api/"
    ]


def test_an_entry_for_a_name_not_in_all_is_reported(monkeypatch):
    hooks = _hooks()
    entries = hooks.api_entries()
    monkeypatch.setattr(
        hooks,
        "api_entries",
        lambda: {**entries, ("keras_lars", "kernels"): "api/optimizers.md"},
    )
    assert hooks.api_problems() == [
        "api/optimizers.md: '::: keras_lars.kernels' is not in keras_lars.__all__"
    ]


def test_links_between_docs_and_the_repository_markdown_resolve_on_the_site():
    link = _hooks().site_link
    assert link("index.md", "docs/optimizers.md") == "optimizers.md"
    assert link("index.md", "docs/batch_study/README.md") == "batch_study/README.md"
    assert link("index.md", "CONTRIBUTING.md") == "CONTRIBUTING.md"
    assert link("optimizers.md", "../README.md") == "index.md"
    assert link("optimizers.md", "../tests/golden/README.md") == "tests/golden/README.md"
    assert link("batch_study/README.md", "../../README.md") == "../index.md"
    assert link("batch_study/README.md", "../flags.md") == "../flags.md"
    assert link("CONTRIBUTING.md", "docs/versions.md") == "versions.md"
    assert link("optimizers.md", "https://example.org/a.md") == "https://example.org/a.md"


def test_a_transcript_shows_as_a_console_session_and_other_blocks_keep_their_fences():
    page = (
        "Run:\n\n```\n$ keras-lars-plan --devices=8\nstep  92.8 ms\n```\n\n"
        "```\npip install -e .\n```\n\n```python\nx = 1\n```\n"
        "  ```\n  $ keras-lars-train\n  ```\n"
    )
    assert _hooks().as_console(page) == page.replace("```\n$ keras", "```console\n$ keras").replace(
        "  ```\n  $", "  ```console\n  $"
    )


def _handler_options():
    """mkdocs.yml's python handler options: {name: value as written} and the
    filters (read as text: the test environments need not have PyYAML)."""
    with open(os.path.join(ROOT, "mkdocs.yml")) as f:
        text = f.read()
    options = dict(re.findall(r"^ {12}(\w+): (\S+)", text, re.M))
    filters = re.findall(r'^ {14}- "!(.*)"$', text, re.M)
    return options, [re.compile(pattern) for pattern in filters]


def test_the_api_pages_show_signatures_with_defaults_and_public_members_only():
    options, hidden = _handler_options()
    for name in ("show_signature", "separate_signature", "merge_init_into_class"):
        assert options[name] == "true", name
    assert options["inherited_members"] == "true"  # trust_ratio_stats is LayerwiseOptimizer's
    for private in ("_all_reduce_sum_gradients", "__init__", "build", "on_epoch_end"):
        assert any(pattern.search(private) for pattern in hidden), private
    for public in ("trust_ratio_stats", "noise_scale_stats", "uses_weight_decay", "parse"):
        assert not any(pattern.search(public) for pattern in hidden), public
