"""`python -m gradnorm` and the `gradnorm` console script: the command line, run in this Python.

The C++ harness is the extension module gradnorm._native; the process is gradnorm's from here
on, as the executable's is (the harness guards os._exit, os.fork and signals in it), and it ends
with the command's exit status. Tests that want a report object use gradnorm.run(), which runs
this in a child process.
"""

import os
import sys


def _prepare_environment():
    # Read by libraries at load time, so set before torch (and NumPy, pyarrow) load: one
    # OpenBLAS thread, and no jemalloc purging thread in pyarrow, so that a supervisor may fork
    # warm rank processes (python/src/interpreter.cpp sets the same for the executable).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")


def _fail(message):
    sys.stderr.write("gradnorm: " + message + "\n")
    sys.stderr.flush()
    return 2


def main(arguments=None):
    arguments = list(sys.argv[1:] if arguments is None else arguments)
    # What the executable's embedded interpreter has: no program folder first on sys.path, so a
    # folder in the working directory named like torch or a framework is not imported instead
    # of it (gradnorm itself is imported already).
    if sys.path and os.path.abspath(sys.path[0] or ".") in (
            os.getcwd(), os.path.dirname(os.path.abspath(sys.argv[0] or "."))):
        del sys.path[0]
    _prepare_environment()
    try:
        import torch
    except ImportError as error:
        sys.exit(_fail(f"this Python ({sys.executable}) cannot import torch: {error} "
                       "(gradnorm runs on the torch of the environment it is installed in)"))
    try:
        from gradnorm import _native
    except ImportError as error:
        sys.exit(_fail(f"gradnorm's extension module did not load: {error} (install the "
                       "package: pip install --no-build-isolation PATH_TO_GRADNORM)"))
    built = _native.build_info()
    running = {"torch": torch.__version__, "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI),
               "python": f"{sys.version_info[0]}.{sys.version_info[1]}"}
    different = [f"{key} {built[key]} (built) vs {running[key]} (here)"
                 for key in running if str(built[key]) != str(running[key])]
    if different:
        sys.exit(_fail("the installed gradnorm was built for another environment: "
                       + "; ".join(different)
                       + ": reinstall it here with pip install --no-build-isolation "
                       "--force-reinstall PATH_TO_GRADNORM"))

    import signal
    # The harness owns its signals, as the executable does: Python's SIGINT handler would only
    # set a flag no Python code reads while C++ runs, and Python ignores SIGPIPE.
    for name in ("SIGINT", "SIGPIPE", "SIGXFSZ"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    sys.argv = [""]  # as the embedded interpreter's
    # The harness replaces os._exit in its process (gradnorm_torch.embed); this one ends it.
    exit_process = os._exit

    package = os.path.dirname(os.path.abspath(__file__))
    examples = os.path.join(package, "examples")
    description = (f"CPython {sys.version.split()[0]}, the interpreter running gradnorm: "
                   f"{sys.executable} (torch {torch.__version__})")
    import subprocess
    # Rank processes and bench children: this interpreter again, with its flags (-s, -X ...).
    again = [sys.executable] + subprocess._args_from_interpreter_flags() + ["-m", "gradnorm"]
    code = _native.run_command_line(
        ["gradnorm"] + arguments, again,
        examples if os.path.isdir(examples) else "", description)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed pipe: nothing more to say
            pass
    # Without Python's finalisation: the harness's threads and torch's thread-local Python
    # objects outlive it (python/src/python_step.cpp, hold_interpreter_until_exit).
    exit_process(code)


if __name__ == "__main__":
    main()
