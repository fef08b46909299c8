"""No import cycle: between the modules of the distribution (keras_lars,
keras_lars.models, keras_lars.tools), nor between its packages at any level
(keras_lars.tools.train -> keras_lars.tools.plan while plan imports train is
one, though no module imports itself back).

Read from the source, nothing imported: setup.cfg's `package_dir` says which
folder holds which package (tools/ is keras_lars.tools, models/ is
keras_lars.models). Every import counts, also one inside a function: a lazy
import still makes its module depend on the other, and a cycle closed by one
is still two modules (or packages) that each need the other, layered neither
way; importing lazily only hides it from Python's import-time check. The
remedy is the same either way: move what both need into a third module, or
make the dependency one-way. Imports through importlib (keras_lars.tools.train's
lazy names) are not read.
"""

import ast
import configparser
import itertools
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _folders(root):
    """{package: its folder} from setup.cfg's package_dir."""
    parser = configparser.ConfigParser()
    parser.read(os.path.join(root, "setup.cfg"))
    lines = parser["options"]["package_dir"].strip().splitlines()
    pairs = (line.split("=") for line in lines if line.strip())
    return {package.strip(): os.path.join(root, folder.strip()) for package, folder in pairs}


def _file_of(name, folders):
    """The file of module or package `name`, or None."""
    for package in sorted(folders, key=len, reverse=True):  # the longest mapping wins
        if name == package or name.startswith(package + "."):
            base = os.path.join(folders[package], *name[len(package) :].split(".")[1:])
            for path in (os.path.join(base, "__init__.py"), base + ".py"):
                if os.path.isfile(path):
                    return path
            return None
    return None


def module_graph(root=ROOT):
    """{module: {module: [(line, lazy)]}}: each module of the distribution and
    the modules of the distribution it imports, with the line of each import and
    whether it sits inside a function. `from a import b` names a.b where that is
    a module, else a; `import a.b` names a.b."""
    folders = _folders(root)
    graph = {}
    for package, folder in folders.items():
        for directory, subdirectories, files in os.walk(folder):
            subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
            parts = os.path.relpath(directory, folder).split(os.sep)
            prefix = ".".join([package] + [p for p in parts if p != "."])
            if _file_of(prefix, folders) != os.path.join(directory, "__init__.py"):
                continue  # not a package of `package` (mapped elsewhere, or no __init__)
            for file in sorted(f for f in files if f.endswith(".py")):
                name = prefix if file == "__init__.py" else f"{prefix}.{file[:-3]}"
                with open(os.path.join(directory, file)) as f:
                    tree = ast.parse(f.read())
                graph[name] = _imports_of(tree, name, file == "__init__.py", folders)
    return graph


def _imports_of(tree, name, is_package, folders):
    found = {}

    def add(target, node, lazy):
        if _file_of(target, folders) is not None:
            found.setdefault(target, []).append((node.lineno, lazy))

    def visit(node, lazy):
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, child, inner)
            elif isinstance(child, ast.ImportFrom):
                module = child.module or ""
                if child.level:  # relative: from the package this module is in
                    base = name.split(".")
                    base = base[: len(base) - child.level + (1 if is_package else 0)]
                    module = ".".join(base + ([module] if module else []))
                for alias in child.names:
                    below = f"{module}.{alias.name}"
                    add(below if _file_of(below, folders) else module, child, inner)
            visit(child, inner)

    visit(tree, False)
    return found


def find_cycle(graph):
    """One cycle of `graph` ({node: its targets}) as [a, b, ..., a], or None."""
    done, path = set(), []

    def visit(node):
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        path.append(node)
        for target in sorted(graph.get(node, ())):
            found = visit(target)
            if found:
                return found
        path.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        found = visit(node)
        if found:
            return found
    return None


def package_graphs(graph):
    """{package: {member: {member: [(module, imported module)]}}}: for each
    package, its members (each subpackage with every module under it, each of
    its own modules, and its __init__ as the package itself) and which member
    imports which, with the module-level imports that make each edge."""
    packages = {name for name in graph if any(other.startswith(name + ".") for other in graph)}
    result = {}
    for package in packages:
        members = result.setdefault(package, {})

        def member(module, package=package):
            if module == package:
                return package
            if module.startswith(package + "."):
                return f"{package}.{module[len(package) + 1 :].split('.')[0]}"
            return None

        for module, targets in graph.items():
            a = member(module)
            for target in targets:
                b = member(target)
                if a and b and a != b:
                    members.setdefault(a, {}).setdefault(b, []).append((module, target))
    return result


def _describe(cycle, edges):
    """`a -> b -> a`, each step with the imports (file line, lazy) that make it."""
    steps = []
    for a, b in itertools.pairwise(cycle):
        steps.append(f"{a} -> {b}: " + "; ".join(edges(a, b)))
    return " -> ".join(cycle) + "\n  " + "\n  ".join(steps)


def _module_edges(graph):
    def edges(a, b):
        return [
            f"line {line}" + (" (inside a function)" if lazy else "") for line, lazy in graph[a][b]
        ]

    return edges


def _package_edges(graph, members):
    def edges(a, b):
        return [
            f"{module} imports {target} ("
            + ", ".join(
                f"line {line}" + (" inside a function" if lazy else "")
                for line, lazy in graph[module][target]
            )
            + ")"
            for module, target in sorted(members[a][b])
        ]

    return edges


def package_cycles(graph):
    """Each package's member cycle, described, or [] when there is none."""
    found = []
    for package, members in sorted(package_graphs(graph).items()):
        cycle = find_cycle(members)
        if cycle:
            found.append(f"in {package}: " + _describe(cycle, _package_edges(graph, members)))
    return found


def test_every_module_of_the_distribution_is_read():
    graph = module_graph()
    for name in (
        "keras_lars",
        "keras_lars.compat._registry",
        "keras_lars.layerwise",
        "keras_lars.models",
        "keras_lars.models.resnet",
        "keras_lars.tools",
        "keras_lars.tools.settings",
        "keras_lars.tools.train.loop",
        "keras_lars.tools.plan",
        "keras_lars.tools.batch_study.cli",
        "keras_lars.tools.input_pipeline.sources",
    ):
        assert name in graph, name
    assert not any(name.startswith(("tools", "models")) for name in graph)  # installed names only
    assert "keras_lars.tools.train" in graph["keras_lars.tools.batch_study.runner"]
    # from keras_lars.tools import settings: the module, not the package
    assert "keras_lars.tools.settings" in graph["keras_lars.tools.train.runtime"]
    # an import inside a function counts, and says so
    lazy = graph["keras_lars.tools.train"]["keras_lars.tools.train.cli"]
    assert lazy and all(inside for _, inside in lazy)


def test_no_module_imports_another_in_a_cycle():
    graph = module_graph()
    cycle = find_cycle(graph)
    assert cycle is None, _describe(cycle, _module_edges(graph))


def test_no_package_imports_another_in_a_cycle():
    """At every level: keras_lars's modules and subpackages (compat, models,
    tools), keras_lars.tools's (train, plan, batch_study, input_pipeline and its
    own modules: settings, storage, ...), and so on down."""
    cycles = package_cycles(module_graph())
    assert not cycles, "\n".join(cycles)


def test_the_checks_see_a_planted_cycle():
    """On the real graph (acyclic: the tests above) with one import added."""
    graph = module_graph()
    lines = [(1, False)]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "d": {"a"}}) is None
    # A module cycle: the library importing the tool back.
    planted = {**graph, "keras_lars.schedules": {**graph["keras_lars.schedules"]}}
    planted["keras_lars.schedules"]["keras_lars.tools.train.length"] = lines
    cycle = find_cycle(planted)
    assert cycle and "keras_lars.schedules" in cycle and "keras_lars.tools.train.length" in cycle
    assert any(found.startswith("in keras_lars: ") for found in package_cycles(planted))
    # A package cycle that no module closes: input_pipeline's errors would import
    # train's length (which imports nothing of input_pipeline), while train's
    # feed imports input_pipeline.
    length = "keras_lars.tools.train.length"
    assert "keras_lars.tools.input_pipeline" in graph["keras_lars.tools.train.feed"]
    errors = "keras_lars.tools.input_pipeline.errors"
    planted = {**graph, errors: {**graph[errors], length: lines}}
    assert find_cycle(planted) is None
    found = [c for c in package_cycles(planted) if c.startswith("in keras_lars.tools: ")]
    assert found and "keras_lars.tools.input_pipeline -> keras_lars.tools.train" in found[0]
    assert f"{errors} imports {length} (line 1)" in found[0]


def test_compat_stands_on_keras_lars_internals_only():
    for module, targets in module_graph().items():
        if module.startswith("keras_lars.compat"):
            outside = {t for t in targets if not t.startswith("keras_lars.compat")}
            assert outside <= {"keras_lars._internals"}, module


def test_the_library_imports_no_tool_and_no_model():
    """CONTRIBUTING's one way: keras_lars.tools -> keras_lars + keras_lars.models."""
    for module, targets in module_graph().items():
        if module.startswith("keras_lars.tools"):
            continue
        if module.startswith("keras_lars.models"):
            above = ("keras_lars.tools",)
        else:
            above = ("keras_lars.tools", "keras_lars.models")
        wrong = sorted(target for target in targets if target.startswith(above))
        assert not wrong, f"{module} imports {wrong}"
