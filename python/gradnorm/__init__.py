"""gradnorm from Python: run scenarios on a step, a recipe or a framework entry point, and read
the report.

    import gradnorm

    report = gradnorm.run(step="steps/my_step.py", scenarios=["single/*", "dist/*"])
    report.assert_ok()          # raises gradnorm.NormalisationError with the oracle's reasons

    report = gradnorm.run(recipe="transformers:trainer", scenarios=["single/accum2-ragged/float32"],
                          recipe_args={"max_grad_norm": 1.0})
    for row in report.failed:
        print(row.scenario, row.variant, row.why, row.reproduce)

Each run is a child process (`python -m gradnorm run --json`, this interpreter, this
environment): the harness owns the process it runs in (it guards os._exit, os.fork and
signals there), so the caller's interpreter is never touched. Importing this package loads
neither torch nor the extension module. The pytest plugin (gradnorm.pytest_plugin) is built on
this. The guide: docs/python.md.
"""

import json
import os
import subprocess
import sys
import tempfile

__all__ = ["run", "Report", "Row", "GradnormError", "NormalisationError", "reproduce_command"]

# The exit statuses of `gradnorm` (tools/src/cli.cpp): 0 and 1 carry a report.
EXIT_AS_EXPECTED, EXIT_VERDICT, EXIT_USAGE, EXIT_RANK_FAILED, EXIT_INTERNAL = 0, 1, 2, 3, 70
EXIT_WRITE_FAILED = 74


class GradnormError(RuntimeError):
    """gradnorm did not judge: bad input (exit 2), a rank failed (3), a bug in gradnorm (70), a
    report it could not write (74), or the process was killed. `returncode`, `stderr` and `command` say which and why."""

    def __init__(self, message, returncode=None, stderr="", command=()):
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr
        self.command = list(command)


class NormalisationError(AssertionError):
    """Some row's verdict was not what was expected of it; the message has the oracle's reasons
    and each row's reproduce command. `rows` are the rows at fault."""

    def __init__(self, message, rows=()):
        super().__init__(message)
        self.rows = list(rows)


def _shell_quote(word):
    # reports/src/diff_report.cpp shell_quote: the same words, so a printed command is the same.
    plain = "-_./=:,+@%"
    if word and all(c.isascii() and (c.isalnum() or c in plain) for c in word):
        return word
    return "'" + word.replace("'", "'\\''") + "'"


def _exact(name):
    # A pattern that selects NAME alone: glob characters escaped.
    return "".join("\\" + c if c in "*?[]\\" else c for c in name)


def reproduce_command(arguments, scenario, variant):
    """The command that runs one row again: `gradnorm run ARGUMENTS -s SCENARIO -v VARIANT`, as
    `gradnorm diff` prints it (reports/src/diff_report.cpp)."""
    words = ["gradnorm run"] + [_shell_quote(a) for a in arguments]
    words += ["-s", _shell_quote(_exact(scenario)), "-v", _shell_quote(_exact(variant))]
    return " ".join(words)


_FIGURES = ("rel_l2_error", "max_abs_error", "max_ulp", "logged_loss_rel_error", "grad_norm_rel_error",
            "logged_loss", "oracle_loss", "grad_norm", "oracle_grad_norm", "world_size",
            "global_token_count")


class Row:
    """One scenario x variant of a report: its verdict, whether it was what was expected of it
    (`met`), why not, the oracle's reasons, the figures, and the command that runs it again."""

    def __init__(self, record, reproduce_arguments=()):
        self.record = record
        self.scenario = record["scenario"]
        self.variant = record["variant"]
        self.verdict = record["verdict"]
        self.expectation = record.get("expectation", "")
        self.met = bool(record["met"])
        self.why = record.get("why", "")
        self.reasons = list(record.get("reasons", []))
        self.notes = list(record.get("notes", []))
        self.error = record.get("error")
        self.figures = {key: record.get(key) for key in _FIGURES if key in record}
        self.reproduce = reproduce_command(list(reproduce_arguments), self.scenario, self.variant)

    @property
    def name(self):
        return f"{self.scenario} x {self.variant}"

    def explain(self):
        """What a failing test prints of this row."""
        lines = [f"{self.name}: {self.verdict}, expected {self.expectation}"
                 + (f" ({self.why})" if self.why else "")]
        lines += [f"  - {reason}" for reason in self.reasons]
        if self.error:
            lines.append(f"  error: {self.error}")
        lines += [f"  note: {note}" for note in self.notes]
        figures = ", ".join(f"{key} {value:.3g}" if isinstance(value, float) else f"{key} {value}"
                            for key, value in self.figures.items()
                            if value is not None and key in ("rel_l2_error", "max_ulp",
                                                             "logged_loss_rel_error",
                                                             "grad_norm_rel_error"))
        if figures:
            lines.append(f"  figures: {figures}")
        lines.append(f"  reproduce: {self.reproduce}")
        return "\n".join(lines)

    def __repr__(self):
        return f"<gradnorm.Row {self.name}: {self.verdict}{'' if self.met else ' (not met)'}>"


class Report:
    """A gradnorm JSON report (docs/report.schema.json) as objects: `rows`, `failed`, `ok`,
    `summary`, `variants` (what each variant judged: the framework and its version), `left_out`
    and `settings`. `returncode`, `stderr` and `command` are the run's, where it was run here."""

    def __init__(self, data, returncode=None, stderr="", command=()):
        if not isinstance(data, dict) or data.get("tool") != "gradnorm" or "records" not in data:
            raise GradnormError("not a gradnorm report (no tool: gradnorm, no records)")
        self.data = data
        self.returncode = returncode
        self.stderr = stderr
        self.command = list(command)
        self.reproduce_arguments = list(data.get("run", {}).get("reproduce_arguments", []))
        self.rows = [Row(record, self.reproduce_arguments) for record in data["records"]]
        self.summary = dict(data.get("summary", {}))
        self.variants = dict(data.get("variants", {}))
        self.left_out = list(data.get("left_out", []))
        self.settings = dict(data.get("settings", {}))

    @classmethod
    def load(cls, path):
        """A report that `gradnorm run --json PATH` wrote."""
        with open(path, encoding="utf-8") as handle:
            return cls(json.load(handle))

    @property
    def failed(self):
        """The rows whose verdict was not what was expected of them."""
        return [row for row in self.rows if not row.met]

    @property
    def ok(self):
        """Every row as expected (and at least one row judged)."""
        return bool(self.rows) and not self.failed

    def row(self, scenario, variant):
        for row in self.rows:
            if row.scenario == scenario and row.variant == variant:
                return row
        raise KeyError(f"no row {scenario} x {variant} in this report")

    def assert_ok(self):
        """Raises NormalisationError naming each row at fault, with the oracle's reasons and the
        command that reproduces it; also when the run judged no row at all."""
        if not self.rows:
            raise NormalisationError("gradnorm judged no row (no scenario x variant was selected)")
        failed = self.failed
        if failed:
            head = (f"gradnorm: {len(failed)} of {len(self.rows)} row"
                    f"{'' if len(self.rows) == 1 else 's'} not as expected")
            raise NormalisationError("\n".join([head] + [row.explain() for row in failed]), failed)

    def __repr__(self):
        return f"<gradnorm.Report {len(self.rows)} rows, {len(self.failed)} not as expected>"


def _listed(value):
    if value is None:
        return []
    return [value] if isinstance(value, (str, os.PathLike)) else list(value)


def command(*, step=None, recipe=None, recipe_args=None, recipe_model=None, files=(), scenarios=(),
            variants=(), nproc=None, timeout=None, jobs=None, args=()):
    """The `gradnorm run` arguments of run() (without --json), for a caller that runs it itself."""
    words = []
    if step is not None:
        words += ["--python-step", os.fspath(step)]
    if recipe is not None:
        words += ["--recipe", recipe]
    for key, value in (recipe_args or {}).items():
        # A string as it would be typed after --recipe-arg KEY=; any other value as a Python
        # literal, which the adapters read back with ast.literal_eval (None, dicts, booleans).
        words += ["--recipe-arg", f"{key}={value if isinstance(value, str) else repr(value)}"]
    if recipe_model is not None:
        words += ["--recipe-model", recipe_model]
    for file in _listed(files):
        words += ["-f", os.fspath(file)]
    for pattern in _listed(scenarios):
        words += ["-s", pattern]
    for pattern in _listed(variants):
        words += ["-v", pattern]
    if nproc is not None:
        words += ["--nproc", str(nproc)]
    if timeout is not None:
        words += ["--timeout", str(timeout)]
    if jobs is not None:
        words += ["-j", str(jobs)]
    return words + [os.fspath(a) for a in _listed(args)]


def run(*, step=None, recipe=None, recipe_args=None, recipe_model=None, files=(), scenarios=(),
        variants=(), nproc=None, timeout=None, jobs=None, args=(), cwd=None, env=None,
        python=None):
    """Runs `gradnorm run` in a child process of PYTHON (default: this interpreter) and returns
    its Report.

    step: a Python step, "FILE.py[:FUNCTION]" (--python-step). recipe: real framework code,
    "FRAMEWORK:TARGET" (--recipe), with recipe_args {KEY: VALUE} (--recipe-arg) and
    recipe_model (--recipe-model); a string value goes as typed on the command line, any
    other as a Python literal. files: scenario files (-f). scenarios, variants: names or
    patterns (-s, -v). nproc: rank processes. args: any other `gradnorm run` arguments.
    Raises GradnormError when gradnorm did not judge (exit 2, 3, 70, a signal).
    """
    words = command(step=step, recipe=recipe, recipe_args=recipe_args, recipe_model=recipe_model,
                    files=files, scenarios=scenarios, variants=variants, nproc=nproc,
                    timeout=timeout, jobs=jobs, args=args)
    with tempfile.TemporaryDirectory(prefix="gradnorm-api-") as folder:
        path = os.path.join(folder, "report.json")
        full = [python or sys.executable, "-m", "gradnorm", "run", "-q", "--json", path] + words
        done = subprocess.run(full, cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, errors="replace", check=False)
        if done.returncode not in (EXIT_AS_EXPECTED, EXIT_VERDICT) or not os.path.exists(path):
            meaning = {EXIT_USAGE: "bad input", EXIT_RANK_FAILED: "a rank failed",
                       EXIT_INTERNAL: "an internal error (a bug in gradnorm)",
                       EXIT_WRITE_FAILED: "the report could not be written"}.get(
                done.returncode,
                f"killed by signal {-done.returncode}" if done.returncode < 0 else "no report")
            tail = "\n".join(done.stderr.strip().splitlines()[-20:])
            raise GradnormError(f"gradnorm run exited {done.returncode} ({meaning}): {tail}",
                                done.returncode, done.stderr, full)
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    return Report(data, done.returncode, done.stderr, full)
