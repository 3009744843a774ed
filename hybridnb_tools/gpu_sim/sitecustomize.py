"""Runs at the start of every process with this folder on ``PYTHONPATH`` before any other
sitecustomize (see ``fake_gpu.environ``): the simulated GPUs of ``fake_gpu``, when
``HYBRIDNB_TEST_GPU_SIM`` asks for them; then the platform lane's (tests/platform_sim)."""

import os

if os.environ.get("HYBRIDNB_TEST_GPU_SIM"):
    from hybridnb_tools.gpu_sim import fake_gpu

    fake_gpu.install()


def _run_the_next_sitecustomize() -> None:
    """Python runs only the first ``sitecustomize`` on the path; the tests' (each holds this
    function) run each other, once each, whichever comes first."""
    import importlib.util
    import pathlib
    import sys

    ran = {os.path.realpath(m.__file__) for name, m in list(sys.modules.items())
           if (name == "sitecustomize" or name.startswith("_sitecustomize_"))
           and getattr(m, "__file__", None)} | {os.path.realpath(__file__)}
    for folder in sys.path:
        path = os.path.realpath(os.path.join(folder or os.curdir, "sitecustomize.py"))
        if path not in ran and os.path.isfile(path) \
                and "def _run_the_next_sitecustomize" in pathlib.Path(path).read_text():
            spec = importlib.util.spec_from_file_location(f"_sitecustomize_{len(ran)}", path)
            module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


_run_the_next_sitecustomize()
