"""The documentation holds together: README.md stays a short front door, and every relative link in
README.md and docs/ points at a file that exists and, with a #anchor into a markdown file, at one of
its headings (GitHub's slugs). Standard library and pytest only."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_LIMIT = 15_000
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]


def prose_lines(text: str):
    """(line number, line) for every line outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lowercase, punctuation other than hyphens
    and underscores removed, each space a hyphen."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in "-_ ")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a markdown file, duplicates numbered -1, -2, ... as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path):
    """(line number, target) of every relative link outside code."""
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        line = CODE_SPAN.sub(lambda m: "code", line)
        for m in LINK.finditer(line):
            target = m.group(2)
            if not target or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, mailto:, ...
                continue
            yield number, target


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, target in links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not dest.exists():
            problems.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where} (no heading with anchor #{anchor} in {dest.name})")
    return problems


def test_readme_is_a_front_door():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_LIMIT, f"README.md is {size} bytes; move detail into docs/ (limit {README_LIMIT})"


def test_docs_exist():
    assert (ROOT / "docs").is_dir()
    assert len(markdown_files()) > 5


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    assert broken_links(path) == []


def test_checker_finds_broken_links(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text(
        "# Title\n\n## Trackers: MLflow & W&B\n\n## Same\n\n## Same\n\n```bash\n# not a "
        "heading\n[x](nope.md)\n```\n"
        "[ok](#trackers-mlflow--wb) [ok](#same-1) [ok](a.md#title) [web](https://example.com/x#y)\n"
        "[bad](#same-2) [bad](#not-a-heading) [bad](missing.md) `[code](nope.md)`\n",
        encoding="utf-8",
    )
    problems = broken_links(tmp_path / "a.md")
    assert [p.split(": ", 1)[1].split(" (")[0] for p in problems] == [
        "#same-2",
        "#not-a-heading",
        "missing.md",
    ]


def test_slugs_follow_github():
    assert slug("Sweeps: `normbench sweep`") == "sweeps-normbench-sweep"
    assert slug("Trackers: MLflow and Weights & Biases") == "trackers-mlflow-and-weights--biases"
    assert slug("SLURM: hydra/launcher=slurm") == "slurm-hydralauncherslurm"
    assert slug("lr_sensitivity: each norm at its best learning rate (90 runs)") == (
        "lr_sensitivity-each-norm-at-its-best-learning-rate-90-runs"
    )
    assert slug("Per-run peak memory and `normbench --help` (part 17)") == (
        "per-run-peak-memory-and-normbench---help-part-17"
    )


# --- docs/configuration.md is the reference: every experiment, group, key and CLI option ---------------

CONFIGURATION = ROOT / "docs" / "configuration.md"
GROUPS = ("norm", "placement", "model", "data", "train", "logger", "experiment", "variant", "hydra/launcher")


def code_words(text: str) -> set[str]:
    """Every dotted name and every word inside the code spans and fenced blocks of a markdown text."""
    spans = [m.group(2) for m in CODE_SPAN.finditer(text)]
    fenced, inside = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
        elif inside:
            fenced.append(line)
    words = set()
    for chunk in [*spans, *fenced]:
        for word in re.findall(r"[A-Za-z_][\w./-]*", chunk):
            parts = word.split("=")[0].split(".")
            words.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))  # `norm.eps` names norm too
            words.update(re.split(r"[=/]", word))
            words.add(word)
    return words


def leaves(node, prefix: str = "") -> list[str]:
    """The dotted keys of a config's leaves (a dict's keys, recursively; an empty dict is a leaf)."""
    if not isinstance(node, dict) or not node:
        return [prefix] if prefix else []
    return [key for k, v in node.items() for key in leaves(v, f"{prefix}.{k}" if prefix else str(k))]


def config_reference() -> dict[str, list[str]]:
    """What docs/configuration.md must name: the config groups with their options, and every key of the
    composed default config and of each group option (experiments and variants set existing keys)."""
    import yaml
    from omegaconf import OmegaConf

    from normbench.core.configtree import conf_dir, group_options

    with compose_context() as compose:
        default = OmegaConf.to_container(compose([]), resolve=False)
    keys = set(leaves(default))
    for group in ("norm", "placement", "model", "data", "train", "logger"):
        for option in group_options(group):
            node = yaml.safe_load((conf_dir() / group / f"{option}.yaml").read_text(encoding="utf-8")) or {}
            node.pop("defaults", None)
            keys.update(leaves(node, group))
    return {
        "groups": [g for g in GROUPS if (conf_dir() / g).is_dir()],
        "options": sorted({o for g in GROUPS for o in group_options(g)}),
        "keys": sorted(keys),
    }


def missing_from_configuration(text: str) -> list[str]:
    words = code_words(text)
    ref = config_reference()
    missing = [f"group {g}" for g in ref["groups"] if g not in words]
    missing += [f"option {o}" for o in ref["options"] if o not in words]
    missing += [f"key {k}" for k in ref["keys"] if k not in words]
    return missing


def test_configuration_names_every_group_option_and_key():
    missing = missing_from_configuration(CONFIGURATION.read_text(encoding="utf-8"))
    assert missing == [], f"docs/configuration.md does not name: {', '.join(missing)}"


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body up to the next heading of the same or a higher level) for every heading."""
    lines = list(prose_lines(text))
    all_lines = text.splitlines()
    heads = [
        (n, len(m.group(1)), m.group(2)) for n, line in lines if (m := re.match(r"^(#{1,6})\s+(.*)", line))
    ]
    out = []
    for i, (n, level, title) in enumerate(heads):
        end = next((m for m, lv, _ in heads[i + 1 :] if lv <= level), len(all_lines) + 1)
        out.append((title, "\n".join(all_lines[n : end - 1])))
    return out


def commands(group, prefix: str = "normbench"):
    """(full name, command) of every command of a click group, its sub-apps' commands too."""
    for name, command in group.commands.items():
        yield f"{prefix} {name}", command
        if hasattr(command, "commands"):
            yield from commands(command, f"{prefix} {name}")


def missing_cli_options(text: str) -> list[str]:
    """Each command of the Typer app, and each of a sub-app's (``normbench claims run``), needs a
    section titled with its full name that names every one of its options (click's own introspection
    of the command line, the one users get)."""
    import typer.main

    from normbench.cli import app

    root = typer.main.get_command(app)
    found = sections(text)
    missing = []
    for name, command in commands(root):
        bodies = [body for title, body in found if f"{name}`" in title]
        if not bodies:
            missing.append(f"a section titled `{name}`")
            continue
        for param in command.params:
            for opt in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]:
                if opt.startswith("-") and not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", bodies[0]):
                    missing.append(f"{name} {opt}")
    for param in root.params:
        for opt in param.opts:
            if opt not in text:
                missing.append(f"normbench {opt}")
    return missing


def test_configuration_names_every_command_and_option():
    missing = missing_cli_options(CONFIGURATION.read_text(encoding="utf-8"))
    assert missing == [], f"docs/configuration.md lacks: {', '.join(missing)}"


def test_reference_checkers_find_what_is_missing():
    ref = config_reference()
    assert "experiment" in ref["groups"] and "ln_scaling" in ref["options"] and "train.lr" in ref["keys"]
    assert "logger.mlflow.tracking_uri" in ref["keys"] and "norm.groups" in ref["keys"]
    text = "`" + "` `".join([*ref["groups"], *ref["options"], *ref["keys"]]) + "`"
    assert missing_from_configuration(text) == []
    assert missing_from_configuration(text.replace("train.lr`", "train.xx`")) == ["key train.lr"]

    import typer.main

    from normbench.cli import app

    root = typer.main.get_command(app)
    pages = [" ".join(o for p in root.params for o in p.opts)] + [
        f"## `{name}`\n\n" + " ".join(o for p in cmd.params for o in [*p.opts, *p.secondary_opts])
        for name, cmd in commands(root)
    ]
    assert missing_cli_options("\n".join(pages)) == []
    assert missing_cli_options("\n".join(pages).replace("--version", "--xx")) == ["normbench --version"]
    assert missing_cli_options("\n".join(pages).replace("--tune", "--xx")) == ["normbench report --tune"]
    assert missing_cli_options("\n".join(pages).replace("--holm", "--xx")) == [
        "normbench claims report --holm"
    ]
    assert "a section titled `normbench claims run`" in missing_cli_options(
        "\n".join(p for p in pages if "normbench claims run`" not in p)
    )


# --- every example in the docs composes ----------------------------------------------------------------

EXAMPLE_FENCE = re.compile(r"^\s*```(bash|sh|shell|console|yaml)\s*$")
USER_CONFIG = ("--config-dir", "hydra.searchpath", "$")  # examples over a user's own files or shell values


def compose_context():
    """One Hydra context over normbench's config tree for many compositions (the CLI's composition,
    in-process)."""
    from contextlib import contextmanager

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from normbench.core.configtree import conf_dir

    @contextmanager
    def context():
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            yield lambda overrides: compose(config_name="config", overrides=list(overrides))
        GlobalHydra.instance().clear()

    return context()


def fenced_blocks(text: str):
    """(line number, language, lines) of every fenced block tagged bash/sh/shell/console/yaml."""
    block, lang, start = None, None, 0
    for number, line in enumerate(text.splitlines(), 1):
        if block is None:
            if m := EXAMPLE_FENCE.match(line):
                block, lang, start = [], m.group(1), number
            elif FENCE.match(line):
                block, lang, start = [], None, number
        elif FENCE.match(line):
            if lang:
                yield start, lang, block
            block = None
        else:
            block.append(line)


def command_examples(path: Path):
    """(where, overrides) for every `normbench train|sweep ...` line of a shell block: its Hydra
    overrides, with the Hydra settings (hydra.*, hydra/...) and options left out, and each swept key at
    its first value (a glob at the first option it matches)."""
    import shlex

    for start, lang, lines in fenced_blocks(path.read_text(encoding="utf-8")):
        if lang == "yaml":
            continue
        joined, held = [], ""
        for line in lines:
            held += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
            if not line.rstrip().endswith("\\"):
                joined.append(held)
                held = ""
        for line in joined:
            m = re.search(r"\bnormbench (train|sweep)\b(.*)", line)
            if line.lstrip().startswith("#"):
                continue
            if not m or any(u in line for u in USER_CONFIG):
                continue
            body = m.group(2).split(" #")[0]
            body = re.split(r"\s(?:&&|\||;)\s", body)[0]
            tokens, skip = shlex.split(body), False
            overrides = []
            for token in tokens:
                if skip:
                    skip = False
                elif token.startswith("-"):
                    skip = token in ("--cfg", "-c", "--package", "-p")
                elif not token.startswith("hydra"):
                    overrides.append(token)
            yield f"{path.relative_to(ROOT)}:{start}: normbench {m.group(1)}{body}", overrides


def first_of_sweep(overrides: list[str]) -> list[str]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob

    from normbench.core.configtree import group_options

    out = []
    for o in OverridesParser.create().parse_overrides(overrides):
        if not o.is_sweep_override():
            out.append(o.input_line)
            continue
        key = o.get_key_element()
        if isinstance(o.value(), Glob):
            value = o.value().filter(group_options(o.key_or_group))[0]
        else:
            value = next(iter(o.sweep_string_iterator()))
        out.append(f"{key}={value}")
    return out


def yaml_examples(path: Path):
    """(where, group, option, text) of every yaml block that opens with `# DIR/GROUP/NAME.yaml`."""
    for start, lang, lines in fenced_blocks(path.read_text(encoding="utf-8")):
        if lang == "yaml" and lines and (m := re.match(r"#\s*\S*?([a-z_]+)/(\w+)\.yaml\b", lines[0])):
            yield f"{path.relative_to(ROOT)}:{start}", m.group(1), m.group(2), "\n".join(lines)


def example_problems(paths) -> list[str]:
    """Each example composed as normbench composes a sweep's jobs (``normbench.sweeps.composing``: each
    choice of config groups once, the key changes on a copy) and checked as a run's config is, before
    anything trains. A yaml example is composed as its option, from a config folder of its own; a user's
    class named by _target_ is composed, not imported."""
    import tempfile

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode
    from omegaconf import open_dict

    from normbench.core.configtree import conf_dir
    from normbench.sweeps import composing
    from normbench.training.config import parse_config

    problems = []

    def check(where, make):
        try:
            cfg = make()
            with open_dict(cfg):
                cfg.pop("hydra", None)
            if "_target_" not in cfg.norm and "_target_" not in cfg.placement:
                parse_config(cfg)
        except Exception as err:  # any failure is the finding
            problems.append(f"{where}: {type(err).__name__}: {str(err).splitlines()[0]}")

    GlobalHydra.instance().clear()
    with (
        initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3", job_name="normbench"),
        tempfile.TemporaryDirectory() as tmp,
    ):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("config", ["hydra.mode=MULTIRUN"], RunMode.MULTIRUN)
        examples = {}  # the same overrides in several places are composed once
        for path in paths:
            for where, overrides in command_examples(path):
                examples.setdefault(tuple(overrides), where)
        for overrides, where in examples.items():
            check(where, lambda o=overrides: composing.compose(loader, master, first_of_sweep(list(o))))
        for path in paths:
            for where, group, option, text in yaml_examples(path):
                folder = Path(tmp) / where.replace("/", "_").replace(":", "_")
                (folder / group).mkdir(parents=True)
                (folder / group / f"{option}.yaml").write_text(text, encoding="utf-8")
                overrides = [f"{group}={option}", f"hydra.searchpath=[file://{folder}]"]
                check(where, lambda overrides=overrides: compose(config_name="config", overrides=overrides))
    GlobalHydra.instance().clear()
    return problems


def test_every_example_config_composes():
    assert example_problems(markdown_files()) == []


def test_example_checker_finds_a_bad_example(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    page = tmp_path / "x.md"
    page.write_text(
        "```bash\nnormbench train norm=rms model.n_layer=2   # fine\n"
        "normbench sweep norm=ln,nope train.lr=1e-3,1e-2      # the first of each swept key is composed\n"
        'normbench sweep "norm=glob(*)" hydra/launcher=joblib seed=0,1\n'
        "normbench train model.d_model=30 model.n_head=4\n"
        "normbench train norm=nope\n```\n"
        "```yaml\n# myconf/norm/myln.yaml\nname: ln\neps: 1.0e-06\n```\n"
        "```yaml\n# myconf/model/bad.yaml\nn_layer: two\n```\n",
        encoding="utf-8",
    )
    problems = example_problems([page])
    assert [p.split(": ")[1] if "normbench" in p else p.split(": ")[0] for p in problems] == [
        "normbench train model.d_model=30 model.n_head=4",
        "normbench train norm=nope",
        "x.md:13",
    ]


# --- the docs describe the product alone ---------------------------------------------------------------

URL = re.compile(r"https?://\S+|\]\([^)]*\)")
NOT_THE_PRODUCT = [
    (re.compile(r"(?<![\w&])#\d+\b"), "a reference number"),
    (re.compile(r"\b(issues?|PRs?|pull requests?) #?\d+", re.I), "a reference number"),
    (re.compile(r"\bsessions?\b", re.I), '"session"'),
    (
        re.compile(
            r"\b(first|second|third|fourth|fifth|earlier|previous|this|next|later|last) rounds?\b", re.I
        ),
        "a round",
    ),
    (re.compile(r"(?<!-)\brounds? (of (work|development|changes|measurements)|\d+)\b", re.I), "a round"),
    (
        re.compile(
            r"\b(this task|was lent|helpers?|the lead|(code|model) of before|(before|after) this change|"
            r"another branch|development (VM|machine)|engineers)\b",
            re.I,
        ),
        "words about the work, not the product",
    ),
]


def beyond_the_product(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        line = URL.sub("", line)
        for pattern, what in NOT_THE_PRODUCT:
            if m := pattern.search(line):
                found.append(f"{number}: {what}: {m.group(0)!r}")
                break
    return found


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_speak_of_the_product_only(path):
    assert beyond_the_product(path.read_text(encoding="utf-8")) == []


def test_words_beyond_the_product_are_found():
    text = (
        "Fixed in issue #14, see #7.\nThe second round of measurements.\nIn this session we ran it.\n"
        "The model of before, bit for bit.\n"
        "Fine: [x](a.md#12-steps), https://github.com/o/r/pull/3#issuecomment-1, --rounds 5, round to "
        "nearest even, one block each per round.\n"
    )
    assert [f.split(":")[0] for f in beyond_the_product(text)] == ["1", "2", "3", "4"]


# --- the code's pointers into the docs --------------------------------------------------------------------

DOC_POINTER = re.compile(r"docs/([\w.-]+\.md)(?:#([\w-]+))?")
POINTING = ("normbench", "conf", "hydra_plugins", "benchmarks", "scripts", "tests", "examples")


def stale_pointers(root: Path) -> list[str]:
    """Every `docs/PAGE.md` or `docs/PAGE.md#anchor` named in the code, configs, scripts and tests that
    names no page or no heading of it."""
    files = [p for d in POINTING for p in (root / d).rglob("*") if p.is_file() and p.suffix != ".pyc"]
    files = [p for p in files if p.name != Path(__file__).name]  # this file's examples and docstrings
    problems = []
    for path in [*files, root / "pyproject.toml"]:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for m in DOC_POINTER.finditer(text):
            page = root / "docs" / m.group(1)
            where = f"{path.relative_to(root)}: {m.group(0)}"
            if not page.exists():
                problems.append(f"{where} (no such page)")
            elif m.group(2) and m.group(2) not in anchors(page):
                problems.append(f"{where} (no such heading)")
    return problems


def test_the_code_points_at_pages_and_headings_that_exist():
    assert stale_pointers(ROOT) == []


def test_stale_pointers_are_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## How it times\n", encoding="utf-8")
    (tmp_path / "normbench").mkdir()
    (tmp_path / "normbench" / "x.py").write_text(
        "# docs/a.md#how-it-times docs/a.md docs/a.md#gone docs/b.md\n", encoding="utf-8"
    )
    (tmp_path / "pyproject.toml").write_text("", encoding="utf-8")
    assert [p.split(": ")[1] for p in stale_pointers(tmp_path)] == [
        "docs/a.md#gone (no such heading)",
        "docs/b.md (no such page)",
    ]
