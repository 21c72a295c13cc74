"""gradnorm as a Python package: `pip install --no-build-isolation .` (docs/install.md).

The C++ is this repository's CMake project, built against the torch of the environment pip
runs in (its headers, its C++ ABI, its libraries): the extension module gradnorm._native,
the package python/gradnorm around it, and the example models --recipe runs use by default.
--no-build-isolation, because the build needs that torch, which a build environment would not
have. The Debian packages of docs/install.md are a prerequisite (CMake, Ninja, the C++ libraries).

Which CMake build it takes, in this order:
- GRADNORM_BUILD_DIR: that build folder, which must have been configured for a torch, C++ ABI
  and Python like this environment's (gradnorm-build.json says); otherwise the install fails,
  naming both. Nothing is rebuilt from scratch in its place.
- build/, the folder scripts/build.sh makes, when it was configured for such an environment:
  its module is brought up to date (scripts/build.sh installs .venv's gradnorm this way).
- otherwise a build of its own in build/pip-<python ABI>-torch<version>, kept for the next
  install from this checkout (the first takes minutes: all of gradnorm's C++). Its flags are
  the ones CI tests (RelWithDebInfo: -O2; GCC 12's -O3 raises a false -Wrestrict in libstdc++),
  and the installed module is stripped of its line tables.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as handle:
        return re.search(r"project\(gradnorm VERSION ([0-9.]+)", handle.read()).group(1)


def environment():
    """What a build must match to load here: torch's version and C++ ABI, Python's ABI."""
    try:
        import torch
    except ImportError as error:
        sys.exit(f"gradnorm: this Python ({sys.executable}) cannot import torch ({error}). "
                 "gradnorm builds against the environment's own torch: install torch >= 2.9 "
                 "first (pip install torch==2.13.0), then gradnorm with "
                 "pip install --no-build-isolation . (pip's isolated build environment has no torch)")
    return {"torch": torch.__version__, "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI),
            "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
            "soabi": sysconfig.get_config_var("SOABI")}


def built_for(folder):
    try:
        with open(os.path.join(folder, "python-package", "gradnorm-build.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def differences(built, here):
    return [f"{key}: {built.get(key)} (the build) vs {here[key]} (here)"
            for key in here if str(built.get(key)) != str(here[key])]


def torch_requirement(version):
    # The torch the module was compiled against, its local label (+cpu) aside: pip must not
    # move torch from under it later.
    return "torch==" + version.split("+")[0]


class CMakeBuild(build_ext):
    def run(self):
        here = environment()
        folder, configure = self.choose_build(here)
        if configure:
            self.announce(f"gradnorm: configuring {folder} (all of gradnorm's C++: minutes)", level=2)
            subprocess.check_call(["cmake", "-G", "Ninja", "-S", ROOT, "-B", folder,
                                   "-DCMAKE_BUILD_TYPE=RelWithDebInfo", f"-DGRADNORM_PYTHON={sys.executable}",
                                   "-DGRADNORM_BUILD_TESTS=OFF", "-DGRADNORM_WITH_MIMALLOC=OFF"])
        jobs = str(os.cpu_count() or 1)
        subprocess.check_call(["cmake", "--build", folder, "--target", "gradnorm_native",
                               "--parallel", jobs])
        with tempfile.TemporaryDirectory(prefix="gradnorm-install-") as staging:
            # The module with its installed RPATH and no debug information, and the example models.
            subprocess.check_call(["cmake", "--install", folder, "--component", "python", "--strip",
                                   "--prefix", staging])
            package = os.path.join(self.build_lib, "gradnorm")
            os.makedirs(package, exist_ok=True)
            for name in os.listdir(os.path.join(staging, "gradnorm")):
                source = os.path.join(staging, "gradnorm", name)
                target = os.path.join(package, name)
                if os.path.isdir(source):
                    shutil.rmtree(target, ignore_errors=True)
                    shutil.copytree(source, target)
                else:
                    shutil.copy2(source, target)

    def choose_build(self, here):
        chosen = os.environ.get("GRADNORM_BUILD_DIR")
        if chosen:
            chosen = os.path.abspath(chosen)
            built = built_for(chosen)
            if built is None:
                sys.exit(f"gradnorm: GRADNORM_BUILD_DIR={chosen} is not a configured gradnorm build "
                         "(no python-package/gradnorm-build.json)")
            if differences(built, here):
                sys.exit(f"gradnorm: GRADNORM_BUILD_DIR={chosen} was built for another environment: "
                         + "; ".join(differences(built, here))
                         + " (unset GRADNORM_BUILD_DIR to build for this one)")
            return chosen, False
        default = os.path.join(ROOT, "build")
        built = built_for(default)
        if built is not None and not differences(built, here):
            return default, False
        own = os.path.join(ROOT, "build", f"pip-{here['soabi']}-torch{here['torch']}")
        return own, built_for(own) is None


setup(
    version=project_version(),
    # torch as built against; NumPy, or torch warns at import in every run's output; pytest,
    # which the plugin plugs into.
    install_requires=[torch_requirement(environment()["torch"]), "numpy", "pytest>=7"],
    ext_modules=[Extension("gradnorm._native", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": os.path.join("build", "setuptools")}},
)
