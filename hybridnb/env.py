"""Where we are running (frontend) and the small/CI mode, each read in one place."""

from __future__ import annotations

import os
import sys

SMOKE_ENV = "HYBRIDNB_SMOKE"
HEADLESS_ENV = "HYBRIDNB_HEADLESS"


def smoke() -> bool:
    """True when ``HYBRIDNB_SMOKE`` asks for the small mode (CI, notebook tests)."""
    return os.environ.get(SMOKE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def frontend(environ: dict[str, str] | None = None) -> str:
    """Name the frontend from environment variables (never by importing google.colab).

    One of ``"colab"``, ``"vscode"``, ``"jupyter"`` (JupyterLab / Notebook 7), ``"ipython"``
    (a terminal IPython), ``"ci"``, ``"terminal"``. ``"jupyter"`` needs a running IPython
    kernel; a headless kernel reports ``"ci"``: one under CI/pytest/nbval, or one that no
    jupyter-server session started and whose parent process is a notebook runner (nbclient,
    nbconvert, papermill, nbval, pytest).
    """
    env = os.environ if environ is None else environ
    if env.get(HEADLESS_ENV):  # set by hn.launch in its workers: no frontend of their own
        return "ci"
    kernel = _in_kernel()
    if "COLAB_RELEASE_TAG" in env or "COLAB_GPU" in env:
        return "colab"
    if env.get("VSCODE_PID") or env.get("VSCODE_CWD") or env.get("VSCODE_IPC_HOOK_CLI"):
        return "vscode" if kernel else "terminal"
    if env.get("CI", "").lower() in ("1", "true", "yes") or env.get("NBVAL") or smoke_ci(env):
        return "ci"
    if kernel:
        return "ci" if _headless_kernel(env) else "jupyter"
    if "IPython" in sys.modules and _ipython_shell() is not None:
        return "ipython"
    return "terminal"


def smoke_ci(env: dict[str, str]) -> bool:
    """Headless notebook execution (nbclient, nbval, papermill) marks itself this way."""
    return bool(env.get("PYTEST_CURRENT_TEST") or env.get(HEADLESS_ENV))


HEADLESS_RUNNERS = ("nbclient", "nbconvert", "papermill", "nbval", "pytest", "jupyter-execute",
                    "nbmake", "testbook")


def _headless_kernel(env) -> bool:
    """A kernel started by a notebook runner rather than by a person's frontend.

    jupyter-server sets ``JPY_SESSION_NAME`` for the kernels of its sessions (JupyterLab,
    Notebook 7); runners start the kernel themselves, so the kernel's parent is the runner.
    """
    if env.get("JPY_SESSION_NAME"):
        return False
    cmd = _parent_command(env)
    return any(runner in cmd for runner in HEADLESS_RUNNERS)


def _parent_command(env) -> str:
    """Command line of the process that started this kernel (lower case; "" when unknown)."""
    try:
        import psutil

        pid = int(env.get("JPY_PARENT_PID") or os.getppid())
        return " ".join(psutil.Process(pid).cmdline()).lower()
    except Exception:
        return ""


def _ipython_shell():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _in_kernel() -> bool:
    """True inside a Jupyter kernel (ZMQ shell), false in a terminal IPython or plain Python."""
    if "ipykernel" not in sys.modules:
        return False
    shell = _ipython_shell()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"
