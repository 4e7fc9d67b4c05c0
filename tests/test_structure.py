"""The house's shape, checked: imports flow one way, the report loads no training code, defaults live once."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import compose_cfg

from normbench.data.corpus import DATA_SCHEMAS
from normbench.model.gpt import ModelConfig
from normbench.model.norms import norm_options
from normbench.model.placements import NOT_OPTIONS, PLACEMENTS
from normbench.training.config import TrainConfig, conf_dir, group_options, load_group, parse_config
from normbench.training.sinks import SINKS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "normbench"


def import_graph() -> dict[str, set[str]]:
    """normbench's modules and the normbench modules each imports, wherever the import statement sits."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets |= {base} | {f"{base}.{a.name}" for a in node.names}
        graph[name] = {
            r
            for t in targets
            if t.startswith("normbench") and (r := resolve(t)) and r != name and not name.startswith(r + ".")
        }  # a package's own __init__ is no edge
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, as the path that closes it (depth-first search)."""
    found, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_the_import_graph_has_no_circle_lazy_imports_included():
    graph = import_graph()
    assert "normbench.training.loop" in graph and "normbench.core.fileio" in graph["normbench.core.runs"]
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


@pytest.mark.parametrize(
    "module", ["normbench.core.fileio", "normbench.core.identity", "normbench.core.errors"]
)
def test_the_bottom_layer_imports_nothing_of_normbench_above_it(module):
    assert import_graph()[module] <= {"normbench.core.errors"}


# What each part may import: a layer imports only the layers listed for it (and the core), so imports
# flow one way: core <- model, data <- training <- sweeps <- claims <- the command line; the norm bench
# sits on the model, and a user's own norm is checked with the bench and the training loop; the report
# reads files (and the bench's goals), and the claims registry reads reports.
ALLOWED = {
    "core": set(),
    "model": {"core"},
    "data": {"core"},
    "bench": {"core", "model"},
    "report": {"core", "bench"},  # normbench.bench.goals only: it imports nothing
    "training": {"core", "model", "data"},
    "extending": {"core", "model", "data", "training", "bench"},
    "sweeps": {"core", "model", "data", "training"},
    "claims": {"core", "model", "data", "training", "sweeps", "report"},  # above the sweeps and the report
}


def _layer(module: str) -> str:
    parts = module.split(".")
    return (
        parts[1]
        if len(parts) > 2 or f"normbench/{parts[-1]}" in {f"normbench/{k}" for k in ALLOWED}
        else "top"
    )


def test_imports_flow_one_way_between_the_parts():
    wrong = []
    for module, targets in import_graph().items():
        layer = _layer(module) if module != "normbench" else "top"
        if layer == "top":
            continue  # the command line and the public API sit above everything
        for target in targets:
            other = _layer(target) if target != "normbench" else "top"
            if other != layer and other not in ALLOWED[layer]:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_the_layer_rule_catches_an_import_running_back_up():
    assert _layer("normbench.model.norms") == "model" and _layer("normbench.cli") == "top"
    assert "training" not in ALLOWED["model"] and "model" not in ALLOWED["data"]


def config_error_handlers(root: Path) -> set[str]:
    """``module.function`` of every ``except`` clause below ``root`` that names ConfigError."""
    found = set()
    for path in root.rglob("*.py"):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        for func in ast.walk(ast.parse(path.read_text())):
            if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                for node in ast.walk(func):
                    if isinstance(node, ast.ExceptHandler) and node.type is not None:
                        caught = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
                        if any(ast.unparse(c).split(".")[-1] == "ConfigError" for c in caught):
                            found.add(f"{module}.{func.name}")
    return found


def test_a_users_mistake_is_handled_at_the_edge_and_made_a_value_in_one_place():
    """A ConfigError is caught in two places: the edge of each normbench process (the CLI's, a sweep's
    Hydra child's) and ``checked``, where a sweep's plan reads an invalid job as a line of it."""
    assert config_error_handlers(PACKAGE) == {
        "normbench.core.errors.edge",
        "normbench.training.config.checked",
    }


def test_the_handler_count_sees_a_handler_added(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "mod.py").write_text(
        "def f():\n    try:\n        g()\n    except (KeyError, errors.ConfigError):\n        pass\n"
    )
    assert config_error_handlers(package) == {"pkg.mod.f"}


def test_the_report_loads_neither_the_training_loop_nor_the_model():
    code = (
        "import sys, normbench.report; "
        "print(sorted(m for m in ('normbench.training.loop', 'normbench.model.gpt', "
        "'normbench.training.config',"
        " 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ----------------------------------------------------------------------------- defaults live once: in conf/


SCHEMAS = {
    "model": lambda name: ModelConfig,
    "train": lambda name: TrainConfig,
    "data": DATA_SCHEMAS.get,
    "logger": lambda name: SINKS[name][0].Options if SINKS[name][0] else None,
}


def _yaml(group: str, option: str) -> dict:
    return yaml.safe_load((conf_dir() / group / f"{option}.yaml").read_text()) or {}


@pytest.mark.parametrize("group", ["model", "train", "data", "logger"])
def test_a_schema_states_no_default_and_its_yaml_gives_every_field(group):
    for option in group_options(group):
        values = _yaml(group, option)
        if group == "logger":
            values = values.get(option) or {}
        schema = SCHEMAS[group](option if group != "data" else values.get("name"))
        if schema is None:  # jsonl: no options
            assert values == {}
            continue
        fields = dataclasses.fields(schema)
        with_default = [
            f.name
            for f in fields
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        ]
        assert with_default == [], f"{schema.__name__} states defaults that conf/{group}/ already holds"
        assert set(values) == {f.name for f in fields}, (
            f"conf/{group}/{option}.yaml and {schema.__name__} differ"
        )


def test_norm_and_placement_yaml_agree_with_the_constructors_keywords():
    """A norm's class keywords are what build_norm uses without a config (QK-norm, the bench): they
    must say what the YAML says."""
    for option in group_options("norm"):
        values = {k: v for k, v in _yaml("norm", option).items() if k not in ("name", "sync")}
        keywords = norm_options(values.get("name", option))
        for key, value in values.items():
            assert keywords[key] == value, (
                f"conf/norm/{option}.yaml: {key}={value!r}, the class says {keywords[key]!r}"
            )
    for option in group_options("placement"):
        cls = PLACEMENTS[option]
        keywords = {
            p.name: p.default
            for p in inspect.signature(cls.__init__).parameters.values()
            if p.kind is p.KEYWORD_ONLY
        }
        for key, value in _yaml("placement", option).items():
            if key == "embedding_norm":  # the model reads it; the block class holds its default
                assert cls.embedding_norm == value, f"conf/placement/{option}.yaml: {key}={value!r}"
            elif key not in NOT_OPTIONS:  # the model's keys (final_norm, the recipe's init, tie_head)
                assert keywords[key] == value, (
                    f"conf/placement/{option}.yaml: {key}={value!r}, the class says {keywords[key]!r}"
                )


@pytest.mark.parametrize("group", ["norm", "placement", "model", "data", "train", "logger"])
def test_every_option_of_every_group_composes_and_parses(group, tmp_path):
    for option in group_options(group):
        extra = ["data.path=README.md"] if (group, option) == ("data", "text") else []
        run = parse_config(compose_cfg([f"{group}={option}", f"results_dir={tmp_path}", *extra]))
        assert run.config_hash


def test_every_variant_chooses_its_norm_and_placement_and_parses(tmp_path):
    """conf/variant/NAME.yaml picks a norm and a placement together (experiment=modern_zoo sweeps them)."""
    for option in group_options("variant"):
        cfg = compose_cfg([f"+variant={option}", "model.arch=llama", f"results_dir={tmp_path}"])
        run = parse_config(cfg)
        assert run.config_hash and cfg.placement.name in group_options("placement"), option
        assert cfg.norm.name in group_options("norm"), option


def test_load_group_gives_what_the_cli_composes():
    cli = parse_config(compose_cfg(["model=micro", "model.n_layer=3"]))
    assert load_group("model", "micro", n_layer=3) == cli.model
    assert load_group("train") == parse_config(compose_cfg([])).train
    assert load_group("data", train_sequences=16).train_sequences == 16


@pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None, reason="ruff is not installed (pip install ruff)"
)
@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_the_tree_is_ruff_clean(command):
    """`ruff check .` and `ruff format --check .` from the repo root, with pyproject.toml's settings."""
    done = subprocess.run([sys.executable, "-m", "ruff", *command], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# ----------------------------------------------------------------------------- sizes a reader can hold

LONGEST_FUNCTION, LONGEST_LOOP, DOCS_BYTES = 100, 600, 150_000


def long_functions(path: Path, limit: int = LONGEST_FUNCTION) -> list[str]:
    """The functions and methods of a module longer than ``limit`` lines, as ``name (lines)``."""
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1})"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > limit
    ]


@pytest.mark.parametrize(
    "part", ["core", "model", "data", "bench", "training", "extending", "sweeps", "claims", "report"]
)
def test_no_function_is_over_100_lines(part):
    found = {
        str(path.relative_to(ROOT)): long
        for path in sorted((PACKAGE / part).rglob("*.py"))
        if (long := long_functions(path))
    }
    assert found == {}


def test_the_length_checker_finds_a_long_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def short():\n    pass\n\n\ndef long():\n" + "    x = 1\n" * 100)
    assert long_functions(module) == ["long (101)"]


def test_the_training_loop_is_at_most_600_lines():
    assert len((PACKAGE / "training" / "loop.py").read_text().splitlines()) <= LONGEST_LOOP


def test_the_docs_are_at_most_150_kb():
    """docs/ is a manual a reader can hold: its history belongs in git, not in its pages."""
    assert sum(len(p.read_bytes()) for p in (ROOT / "docs").glob("*.md")) <= DOCS_BYTES
