"""Python runs only the first ``sitecustomize`` on ``sys.path``. The test tools' own (the GPU
simulation's, next to this file, and the platform lane's in ``tests/platform_sim``) each end with
``run_the_next(__file__)``, so they run each other, once each, whichever comes first."""

import importlib.util
import os
import pathlib
import sys

MARK = "run_the_next(__file__)"


def run_the_next(this: str) -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` that holds ``MARK`` and has not run."""
    ran = {os.path.realpath(m.__file__) for name, m in list(sys.modules.items())
           if (name == "sitecustomize" or name.startswith("_sitecustomize_"))
           and getattr(m, "__file__", None)} | {os.path.realpath(this)}
    for folder in sys.path:
        path = os.path.realpath(os.path.join(folder or os.curdir, "sitecustomize.py"))
        if path not in ran and os.path.isfile(path) and MARK in pathlib.Path(path).read_text():
            spec = importlib.util.spec_from_file_location(f"_sitecustomize_{len(ran)}", path)
            module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return
