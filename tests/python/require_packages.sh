# Sourced by the framework tests before script_common.sh: require_packages PYTHONPATH PACKAGE...
# skips the test (exit 77), naming what is missing, where the environment's Python (with
# PYTHONPATH, which may be empty) finds no such top-level package. It locates them without
# importing them, which took 3 to 7 s a package set: a package that is there but fails to
# import fails the test itself, in the run that imports it.
require_packages() {  # PYTHONPATH PACKAGE...
  local path=$1 why
  shift
  if ! why=$(PYTHONPATH="$path" "$python" -c '
import importlib.util, sys
missing = [name for name in sys.argv[1:] if importlib.util.find_spec(name) is None]
sys.exit("not installed: " + ", ".join(missing) if missing else 0)' "$@" 2>&1); then
    echo "SKIP: $* in $python${path:+ with $path}: $(echo "$why" | tail -1)"
    exit 77
  fi
}
