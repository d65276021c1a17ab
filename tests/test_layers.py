"""The package's import rule, read from the source with ast (no module is imported, so no JAX).

impala_jax/ has four layers, and imports point down only: the face (``__init__.py``, ``run.py``)
-> ``cli/`` -> ``rllib/`` -> ``runtime/`` -> ``core/``. Every import counts, at module level,
inside a function or under ``TYPE_CHECKING``; no module graph has a cycle; no private name
(``_x``) is imported from another module; ``core/`` imports only the numerical stack and a few
pure standard-library modules; ray is imported at module level only by ``rllib/ray_tune.py`` (itself
imported only once ray is), elsewhere inside the function that needs it. README.md,
"Architecture", says what each layer holds.

``runtime/`` and ``core/`` never read the config object: they take the frozen specs that
``rllib/specs.py`` builds (``config_reads`` says how a read is found). That check takes the
config's field and method names from ``IMPALAConfig`` itself, which imports no JAX either.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "impala_jax"
LAYERS = ("core", "runtime", "rllib", "cli", "face")  # bottom to top
FACE = {"__init__", "__main__", "run"}
CORE_MAY_IMPORT = {
    # the numerical stack
    *("jax", "jaxlib", "flax", "optax", "chex", "numpy", "gymnasium"),
    # the pure part of the standard library
    *("__future__", "collections", "dataclasses", "enum", "functools", "itertools", "math"),
    *("numbers", "operator", "types", "typing"),
}
RAY_AT_MODULE_LEVEL = {"impala_jax.rllib.ray_tune"}


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or (len(parts) == 2 and parts[1] in FACE):
        return "face"
    return parts[1]


def _in_functions(tree: ast.AST) -> set[int]:
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            inside |= {id(n) for n in ast.walk(node)}
    return inside


def read_imports(package: Path) -> dict[str, list[tuple[str, str | None, int, bool]]]:
    """module -> [(imported module, imported name or None, line, at module level)], every
    import in the file."""
    graph = {}
    for path in sorted(package.rglob("*.py")):
        module = _module_name(path, package)
        found = []
        tree = ast.parse(path.read_text(), str(path))
        lazy = _in_functions(tree)
        for node in ast.walk(tree):
            top = id(node) not in lazy
            if isinstance(node, ast.Import):
                found += [(alias.name, None, node.lineno, top) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolve against this module's package
                    base = module.split(".")
                    base = base[: len(base) - node.level + (path.stem == "__init__")]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module
                for alias in node.names:
                    submodule = f"{target}.{alias.name}"
                    if (package.parent / submodule.replace(".", "/")).with_suffix(".py").exists():
                        found.append((submodule, None, node.lineno, top))
                    else:
                        found.append((target, alias.name, node.lineno, top))
        graph[module] = found
    return graph


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def violations(graph: dict[str, list[tuple[str, str | None, int, bool]]]) -> list[str]:
    """Every break of the rule in the module docstring, one line each."""
    found, edges = [], {m: set() for m in graph}
    for module, imports in graph.items():
        layer = _layer(module)
        for target, name, line, at_module_level in imports:
            top = target.split(".")[0]
            if layer == "core" and top != "impala_jax" and top not in CORE_MAY_IMPORT:
                found.append(f"{module}:{line}: core imports {target}")
            if top == "ray" and at_module_level and module not in RAY_AT_MODULE_LEVEL:
                found.append(f"{module}:{line}: imports ray at module level")
            if top != "impala_jax":
                continue
            if target == "impala_jax" and module != "impala_jax":
                found.append(f"{module}:{line}: imports {name!r} from the face `impala_jax`")
                continue
            if target not in graph:
                found.append(f"{module}:{line}: imports {target}, which is not a module here")
                continue
            if target != module:
                edges[module].add(target)
            if LAYERS.index(_layer(target)) > LAYERS.index(layer):
                found.append(
                    f"{module}:{line}: {layer} imports {target} ({_layer(target)}), upward"
                )
            if name and name.startswith("_") and not name.startswith("__"):
                found.append(f"{module}:{line}: imports the private name {name} from {target}")
    # A package's __init__ is imported with each of its modules; it must import none of them.
    for cycle in _cycles(edges):
        found.append("import cycle: " + " -> ".join(cycle))
    return found


def test_the_package_keeps_the_rule():
    assert violations(read_imports(PACKAGE)) == []


def test_every_module_is_in_a_layer():
    stray = [m for m in read_imports(PACKAGE) if _layer(m) not in LAYERS]
    assert stray == []


BAD_PACKAGE = {
    "impala_jax/__init__.py": "from impala_jax.rllib.config import Config\n",
    "impala_jax/core/__init__.py": "",
    "impala_jax/core/losses.py": (
        "import logging\n"
        "def loss():\n"
        "    from impala_jax.runtime.learner import Learner  # upward, inside a function\n"
    ),
    "impala_jax/runtime/__init__.py": "",
    "impala_jax/runtime/learner.py": "from impala_jax.core.losses import loss\nimport ray\n",
    "impala_jax/rllib/__init__.py": "",
    "impala_jax/rllib/config.py": (
        "from typing import TYPE_CHECKING\n"
        "from impala_jax.rllib.checks import _is_int\n"
        "from impala_jax import IMPALA\n"
    ),
    "impala_jax/rllib/checks.py": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from impala_jax.rllib.config import Config\n"
    ),
}


def test_the_check_finds_each_kind_of_break(tmp_path):
    """The check itself, on a package that breaks every rule once."""
    for name, text in BAD_PACKAGE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = violations(read_imports(tmp_path / "impala_jax"))
    expected = [
        "impala_jax.core.losses:1: core imports logging",
        "impala_jax.core.losses:3: core imports impala_jax.runtime.learner (runtime), upward",
        "impala_jax.runtime.learner:2: imports ray at module level",
        "impala_jax.rllib.config:2: imports the private name _is_int from impala_jax.rllib.checks",
        "impala_jax.rllib.config:3: imports 'IMPALA' from the face",
        "import cycle: impala_jax.core.losses -> impala_jax.runtime.learner",
        "import cycle: impala_jax.rllib.checks -> impala_jax.rllib.config",
    ]
    for line in expected:
        assert any(f.startswith(line) for f in found), (line, found)
    assert len(found) == len(expected), found


def test_importing_the_package_imports_neither_jax_nor_ray():
    import subprocess

    code = "import sys, impala_jax; print(sorted({m.split('.')[0] for m in sys.modules}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(out.stdout))
    assert not loaded & {"jax", "ray", "flax", "optax", "envpool"}, loaded


# -- No config object below rllib/ ----------------------------------------------------------
# runtime/ and core/ take small frozen specs built in rllib/specs.py, never the IMPALAConfig
# object (DESIGN.md section 2). `config_reads` finds a read of it two ways, so that neither a
# renamed variable nor a field read off another name hides it:
#  1. any attribute read, or getattr/hasattr/setattr/vars, on a config-named object: `config`,
#     `cfg` or a name ending in `_config` / `_cfg` (a variable, or an attribute such as
#     `self.config`), or a local name assigned from one; but for the config's fields that are
#     plain dicts (CONFIG_DICTS) and the other libraries' configs (NOT_THE_CONFIG);
#  2. an attribute read of a name only the config has (its fields and public methods, less
#     SHARED_NAMES, which envs, spaces and dicts have too) on any object but a spec: one reached
#     through a name ending in `spec` (any case), a local name assigned from one, a parameter
#     annotated with a `...Spec` class, or `self` (an object's own attribute).
CONFIG_NAME = re.compile(r"(^|_)(config|cfg)$")
CONFIG_DICTS = {"model_config", "env_config", "evaluation_config"}
NOT_THE_CONFIG = {
    "jax.config",  # JAX's flags
    "env.config",  # an envpool env's own options (runtime/envs/vec_env.py)
}
SHARED_NAMES = {
    *("get", "items", "keys", "values", "copy"),  # IMPALAConfig reads like a dict, as RLlib's
    *("env", "observation_space", "action_space"),  # an env group's env, every env's spaces
}


def config_member_names() -> set[str]:
    """Every field and public method name of IMPALAConfig, less SHARED_NAMES."""
    from impala_jax.rllib.config import IMPALAConfig

    members = {n for n in dir(IMPALAConfig) if not n.startswith("_")} - set(dir(object))
    return (set(IMPALAConfig().to_dict()) | members) - SHARED_NAMES


def _chain(node: ast.AST) -> list[str]:
    """The names along ``a.b.c`` (["a", "b", "c"]); [] for anything else (a call, a subscript)."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return [node.id, *reversed(names)] if isinstance(node, ast.Name) else []


def _is_config(chain: list[str], config_aliases: set[str]) -> bool:
    if not chain or ".".join(chain[-2:]) in NOT_THE_CONFIG or chain[-1] in CONFIG_DICTS:
        return False
    return bool(CONFIG_NAME.search(chain[-1])) or chain == [chain[0]] and chain[0] in config_aliases


def _is_spec(chain: list[str], spec_aliases: set[str]) -> bool:
    return (
        any(n.lower().endswith("spec") for n in chain)
        or chain == ["self"]
        or (bool(chain) and chain[0] in spec_aliases)
    )


def _aliases(nodes: list[ast.AST]) -> tuple[set[str], set[str]]:
    """(config aliases, spec aliases) among ``nodes``: the names assigned from a config-named
    or a spec-named expression, and the parameters annotated with a ``...Spec`` class."""
    config, spec = set(), set()
    pairs = []
    for node in nodes:
        if isinstance(node, ast.arg) and node.annotation is not None:
            if _chain(node.annotation)[-1:] and _chain(node.annotation)[-1].endswith("Spec"):
                spec.add(node.arg)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs += zip(target.elts, node.value.elts, strict=False)
                else:
                    pairs.append((target, node.value))
    for _ in range(2):  # an alias of an alias
        for target, value in pairs:
            if isinstance(target, ast.Name):
                if _is_config(_chain(value), config):
                    config.add(target.id)
                elif _is_spec(_chain(value), spec) and _chain(value) != ["self"]:
                    spec.add(target.id)
    return config, spec


def _is_def(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)


def config_reads(package: Path, names: set[str]) -> list[str]:
    """Every read of the config object in runtime/ and core/, by the rule above; one line each."""
    found = set()
    for path in sorted(package.rglob("*.py")):
        module = _module_name(path, package)
        if _layer(module) not in ("runtime", "core"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        inside = _in_functions(tree)
        # Each function with the aliases made in it (and in the functions nested in it); the
        # module's own statements with theirs.
        scopes = [list(ast.walk(n)) for n in ast.walk(tree) if id(n) in inside and _is_def(n)]
        scopes.append([n for n in ast.walk(tree) if id(n) not in inside])
        for nodes in scopes:
            config, spec = _aliases(nodes)
            for node in nodes:
                if isinstance(node, ast.Attribute):
                    chain = _chain(node.value)
                    where = f"{module}:{node.lineno}: reads {ast.unparse(node)}"
                    if _is_config(chain, config):
                        found.add(f"{where}, of the config")
                    elif node.attr in names and not _is_spec(chain, spec):
                        found.add(f"{where}, a config field or method, off no spec")
                elif (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr", "setattr", "vars")
                    and node.args
                    and _is_config(_chain(node.args[0]), config)
                ):
                    found.add(f"{module}:{node.lineno}: {ast.unparse(node)}, of the config")
    return sorted(found, key=lambda line: (line.split(":")[0], int(line.split(":")[1])))


def test_runtime_and_core_never_read_the_config():
    assert config_reads(PACKAGE, config_member_names()) == []


PLANTED_READS = {
    "impala_jax/runtime/__init__.py": "",
    "impala_jax/runtime/runner.py": (
        "import jax\n"
        "def run(config, settings, spec, loader: LoaderSpec):\n"
        "    a = config.num_envs_per_env_runner\n"
        "    c = config\n"
        "    b = c.env\n"
        "    d = settings.sample_timeout_s\n"
        "    e = getattr(config, 'seed')\n"
        "    f = spec.num_envs_per_env_runner + spec.env.num_envs_per_env_runner\n"
        "    g = loader.learner_queue_size\n"
        "    jax.config.update('jax_platforms', 'cpu')\n"
        "    h = model_config.get('use_lstm')\n"
        "class Runner:\n"
        "    def __init__(self, config):\n"
        "        self.config = config\n"
        "        self.explore = False\n"
        "    def act(self):\n"
        "        return self.config.explore, self.explore\n"
    ),
    "impala_jax/core/__init__.py": "",
    "impala_jax/core/losses.py": "def loss(cfg):\n    return cfg.vf_loss_coeff\n",
}


def test_the_config_check_finds_each_kind_of_read(tmp_path):
    """The config check itself, on planted reads: a config-named parameter, an alias of it,
    a config field read off another name, getattr, ``self.config``, and one in core/; not a
    spec's fields, JAX's config, a model config dict or an object's own attribute."""
    for name, text in PLANTED_READS.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = config_reads(tmp_path / "impala_jax", config_member_names())
    assert found == [
        "impala_jax.core.losses:2: reads cfg.vf_loss_coeff, of the config",
        "impala_jax.runtime.runner:3: reads config.num_envs_per_env_runner, of the config",
        "impala_jax.runtime.runner:5: reads c.env, of the config",
        "impala_jax.runtime.runner:6: reads settings.sample_timeout_s, a config field or "
        "method, off no spec",
        "impala_jax.runtime.runner:7: getattr(config, 'seed'), of the config",
        "impala_jax.runtime.runner:17: reads self.config.explore, of the config",
    ]


@pytest.mark.parametrize("layer", LAYERS[:-1])
def test_each_layer_is_a_folder(layer):
    assert (PACKAGE / layer / "__init__.py").is_file()


# A module that grows past this usually holds two jobs; rllib/config.py is the field table.
MAX_MODULE_LINES = 600
LONG_MODULES_ALLOWED = {"impala_jax.rllib.config"}
MAX_FUNCTION_LINES = 100
LONG_FUNCTIONS_ALLOWED = 2


def test_modules_and_functions_stay_readable_in_size():
    long_modules, long_functions = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path, PACKAGE)
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES and module not in LONG_MODULES_ALLOWED:
            long_modules.append(module)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                    long_functions.append(f"{module}.{node.name}")
    assert long_modules == []
    assert len(long_functions) <= LONG_FUNCTIONS_ALLOWED, long_functions
