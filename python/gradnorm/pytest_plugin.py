"""gradnorm's pytest plugin (the `pytest11` entry point): normalisation rows as test items.

Two sources of items, each one item per scenario x variant that gradnorm would judge:

- scenario files pytest collects, named `*.gradnorm.toml` (the `gradnorm_files` ini option
  changes the patterns): `gradnorm run -f FILE` judges the steps the file declares in its
  `[[variant]]` tables on its scenarios;
- `[[tool.gradnorm.run]]` tables in the rootdir's pyproject.toml, each a `gradnorm run` of its
  own: `step`, `recipe`, `recipe_args`, `recipe_model`, `files`, `scenarios`, `variants`,
  `nproc`, `timeout`, `args` (gradnorm.run's arguments) and an optional `name`; paths are
  relative to the pyproject.toml.

Items are named SCENARIO[VARIANT], so -k selects them by either. A file's or table's items run
in one gradnorm child process (only those still selected), the first time one of them runs;
each then reads its row. A row as expected passes, a pair gradnorm leaves out is skipped with
its reason, any other row fails with the oracle's reasons and the command that reproduces it
(also a `reproduce` property in --junitxml). Under xdist each worker runs its own items.

The plugin imports nothing heavy (no torch): it loads in every pytest session of an environment
where gradnorm is installed, and does nothing without those files or tables. The guide:
docs/python.md.
"""

import fnmatch
import json
import os
import subprocess
import sys

import pytest

import gradnorm

try:
    import tomllib
except ImportError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib


def pytest_addoption(parser):
    group = parser.getgroup("gradnorm", "gradnorm: normalisation rows as tests")
    group.addoption("--gradnorm-timeout", type=float, default=None, metavar="SECONDS",
                    help="gradnorm run --timeout for every run (a rank's wait in one collective, "
                         "a Python step's run)")
    group.addoption("--gradnorm-jobs", type=int, default=None, metavar="N",
                    help="gradnorm run -j: scenarios judged at once in each run")
    group.addoption("--gradnorm-report-dir", default=None, metavar="DIR",
                    help="keep each run's JSON report in DIR")
    group.addoption("--gradnorm-arg", action="append", default=[], metavar="ARG",
                    help="one more gradnorm run argument for every run (repeatable)")
    parser.addini("gradnorm_files", type="args", default=["*.gradnorm.toml"],
                  help="file patterns gradnorm collects as scenario files (default *.gradnorm.toml)")


def pytest_configure(config):
    config.addinivalue_line("markers", "gradnorm: a gradnorm normalisation row")


def _table(path):
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle).get("tool", {}).get("gradnorm")
    except (OSError, tomllib.TOMLDecodeError):
        return None


def pytest_collect_file(file_path, parent):
    config = parent.config
    if any(fnmatch.fnmatch(file_path.name, pattern) for pattern in config.getini("gradnorm_files")):
        return GradnormFile.from_parent(parent, path=file_path)
    if file_path.name == "pyproject.toml" and file_path.parent == config.rootpath:
        table = _table(file_path)
        if table and table.get("run"):
            return GradnormConfig.from_parent(parent, path=file_path)
    return None


_ARGUMENTS = {"step", "recipe", "recipe_args", "recipe_model", "files", "scenarios", "variants",
              "nproc", "timeout", "jobs", "args", "name"}


class GradnormRun:
    """One `gradnorm run`: its arguments, its plan, and (once run) its report."""

    def __init__(self, node, arguments, cwd):
        self.node = node
        self.arguments = arguments
        self.cwd = cwd
        self.rows = {}     # (scenario, variant) -> gradnorm.Row, once judged
        self.errors = {}   # (scenario, variant) -> the GradnormError of the run that did not judge
        self.runs = 0
        self._plan = None

    def keywords(self):
        """gradnorm.run's arguments: the table's or file's, then the command line's options."""
        config = self.node.config
        keywords = {key: value for key, value in self.arguments.items() if key != "name"}
        # The command line's options over the configuration's, as pytest's own ini options go.
        if config.getoption("gradnorm_timeout") is not None:
            keywords["timeout"] = config.getoption("gradnorm_timeout")
        if config.getoption("gradnorm_jobs") is not None:
            keywords["jobs"] = config.getoption("gradnorm_jobs")
        keywords["args"] = gradnorm._listed(keywords.get("args")) + list(config.getoption("gradnorm_arg"))
        return keywords

    def plan(self):
        if self._plan is None:
            command = [sys.executable, "-m", "gradnorm", "run", "--plan"]
            command += gradnorm.command(**self.keywords())
            done = subprocess.run(command, cwd=self.cwd, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, errors="replace", check=False)
            if done.returncode != 0:
                raise GradnormCollectError(
                    f"gradnorm could not plan {self.node.nodeid} (exit {done.returncode}):\n"
                    + done.stderr.strip())
            # The plan is gradnorm's one JSON line; what the user's code printed at import
            # (a print, a framework's logger on standard output) may come before or after it.
            for line in reversed(done.stdout.splitlines()):
                if line.startswith('{"left_out":'):
                    try:
                        self._plan = json.loads(line)
                        break
                    except ValueError:
                        pass
            else:
                raise GradnormCollectError(
                    f"gradnorm printed no plan for {self.node.nodeid}:\n" + done.stdout[-2000:])
        return self._plan

    def items(self, parent):
        plan = self.plan()
        for pair in plan["rows"]:
            yield GradnormItem.from_parent(parent, name=f"{pair['scenario']}[{pair['variant']}]",
                                           run=self, scenario=pair["scenario"],
                                           variant=pair["variant"], left_out=None)
        for pair in plan["left_out"]:
            yield GradnormItem.from_parent(parent, name=f"{pair['scenario']}[{pair['variant']}]",
                                           run=self, scenario=pair["scenario"],
                                           variant=pair["variant"], left_out=pair["why"])

    def judge(self, session, item):
        """Judges ITEM's row, and with it every item of this run still selected (one child
        process for them all). Under xdist, whose workers each hold every item, ITEM alone,
        unless --dist loadfile sends a file's items to one worker."""
        key = (item.scenario, item.variant)
        if key in self.rows or key in self.errors:
            return
        config = self.node.config
        selected = [item]
        batches = not hasattr(config, "workerinput")
        if not batches:
            # An xdist worker: its own options say dist "no"; the command line it was started
            # from says whether a file's items all come here (--dist loadfile).
            argv = config.workerinput.get("mainargv", [])
            batches = "loadfile" in argv or "--dist=loadfile" in argv
        if batches:
            selected = [other for other in session.items
                        if isinstance(other, GradnormItem) and other.run is self
                        and other.left_out is None
                        and (other.scenario, other.variant) not in self.rows]
        everything = [other for other in self.node.iter_children() if other.left_out is None]
        keywords = self.keywords()
        if len(selected) < len(everything):
            # Only the selected rows' scenarios and variants (their product may hold more rows,
            # which are judged and not reported).
            keywords["scenarios"] = sorted({gradnorm._exact(other.scenario) for other in selected})
            keywords["variants"] = sorted({gradnorm._exact(other.variant) for other in selected})
        try:
            report = gradnorm.run(cwd=self.cwd, **keywords)
        except gradnorm.GradnormError as error:
            for other in selected:
                self.errors[(other.scenario, other.variant)] = error
            return
        for row in report.rows:
            self.rows[(row.scenario, row.variant)] = row
        report_dir = config.getoption("gradnorm_report_dir")
        if report_dir:
            os.makedirs(report_dir, exist_ok=True)
            self.runs += 1
            worker = os.environ.get("PYTEST_XDIST_WORKER")
            stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.node.nodeid)
            stem += (f".{worker}" if worker else "") + (f".{self.runs}" if self.runs > 1 else "")
            with open(os.path.join(report_dir, stem + ".json"), "w", encoding="utf-8") as handle:
                json.dump(report.data, handle, indent=1)


class GradnormCollectError(Exception):
    pass


class GradnormNode:
    """What collects items: iter_children() gives its items, however deep."""

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, GradnormCollectError):
            return str(excinfo.value)  # gradnorm's own message, not the plugin's traceback
        return super().repr_failure(excinfo)

    def iter_children(self):
        for child in getattr(self, "_children", []):
            yield from (child.iter_children() if isinstance(child, GradnormNode) else [child])


class GradnormFile(GradnormNode, pytest.File):
    """A scenario file: the steps it declares on its scenarios."""

    def collect(self):
        run = GradnormRun(self, {"files": [str(self.path)]}, str(self.config.rootpath))
        self._children = list(run.items(self))
        return self._children


class GradnormTable(GradnormNode, pytest.Collector):
    """One [[tool.gradnorm.run]] table."""

    def __init__(self, *, arguments, **kwargs):
        super().__init__(**kwargs)
        self.arguments = arguments

    def collect(self):
        unknown = sorted(set(self.arguments) - _ARGUMENTS)
        if unknown:
            raise GradnormCollectError(
                f"{self.path}: [[tool.gradnorm.run]] {self.name} has unknown keys "
                f"{', '.join(unknown)} (known: {', '.join(sorted(_ARGUMENTS))})")
        run = GradnormRun(self, self.arguments, str(self.path.parent))
        self._children = list(run.items(self))
        return self._children


class GradnormConfig(GradnormNode, pytest.File):
    """pyproject.toml's [[tool.gradnorm.run]] tables, one collector each."""

    def collect(self):
        tables = _table(self.path).get("run", [])
        if isinstance(tables, dict):
            tables = [tables]
        self._children = []
        taken = set()
        for index, table in enumerate(tables):
            if not isinstance(table, dict):
                raise GradnormCollectError(
                    f"{self.path}: [[tool.gradnorm.run]] number {index + 1} is not a table")
            name = str(table.get("name") or os.path.basename(str(table.get("step") or table.get("recipe")
                                                                 or f"run{index + 1}")))
            if name in taken:  # two tables named alike (two steps called step.py): numbered
                name = f"{name}#{index + 1}"
            taken.add(name)
            self._children.append(GradnormTable.from_parent(
                self, name=name, arguments=dict(table)))
        return self._children


class GradnormRowFailure(Exception):
    def __init__(self, row):
        super().__init__(row.explain())
        self.row = row


class GradnormItem(pytest.Item):
    def __init__(self, *, run, scenario, variant, left_out, **kwargs):
        super().__init__(**kwargs)
        self.run = run
        self.scenario = scenario
        self.variant = variant
        self.left_out = left_out
        self.add_marker("gradnorm")
        if left_out is not None:
            # A marker, so pytest reports the skip at the item (reportinfo), not in this file.
            self.add_marker(pytest.mark.skip(reason=f"gradnorm leaves this pair out: {left_out}"))

    def runtest(self):
        self.run.judge(self.session, self)
        key = (self.scenario, self.variant)
        if key in self.run.errors:
            raise self.run.errors[key]
        row = self.run.rows.get(key)
        if row is None:
            raise gradnorm.GradnormError(
                f"the run judged no row {self.scenario} x {self.variant} (its plan had one)")
        self.user_properties.append(("reproduce", row.reproduce))
        self.user_properties.append(("verdict", row.verdict))
        if not row.met:
            raise GradnormRowFailure(row)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, GradnormRowFailure):
            return str(excinfo.value)
        if isinstance(excinfo.value, gradnorm.GradnormError):
            return f"gradnorm did not judge: {excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, 0, f"gradnorm: {self.scenario} x {self.variant}"
