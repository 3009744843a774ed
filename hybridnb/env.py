"""The process's surroundings, each read in one place: every ``HYBRIDNB_*`` variable, the
frontend (notebook, terminal, CI), quick mode, the launch environment (torchrun / ``hn.launch``)
and the user cache folder. Reading the environment never touches a GPU.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# ------------------------------------------------------------------ every HYBRIDNB_* variable
QUICK_ENV = "HYBRIDNB_QUICK"            # quick mode for CI and notebook tests
HEADLESS_ENV = "HYBRIDNB_HEADLESS"      # set by hn.launch in its workers: no frontend of their own
DEVICE_ENV = "HYBRIDNB_DEVICE"          # cpu | cuda | cuda:N | mps: forces detect()'s device
LAUNCHED_ENV = "HYBRIDNB_LAUNCHED"      # "1" in the ranks hn.launch starts
ISOLATED_ENV = "HYBRIDNB_ISOLATED"      # "1" in an isolated training worker: never isolates again
DATA_ENV = "HYBRIDNB_DATA"              # the notebooks' DATA: synthetic | a folder | R5-mini ...
FIRST_STEP_GRACE_ENV = "HYBRIDNB_FIRST_STEP_GRACE"  # silence to compile or start CUDA (600 s)
CACHE_DIR_ENV = "HYBRIDNB_CACHE_DIR"    # where hybridnb keeps its cache (the probe's verdicts)
PROBE_CACHE_TTL_ENV = "HYBRIDNB_PROBE_CACHE_TTL"  # seconds a passed probe is trusted; 0 = never
WARM_WORKER_ENV = "HYBRIDNB_WARM_WORKER"  # "0": no spare worker kept ready between isolated fits

# Frontends that show a notebook (rich output, a redrawn progress line); the interactive ones
# add a terminal IPython: a person at a prompt, where a script's advice (torchrun) does not fit.
NOTEBOOK_FRONTENDS = ("jupyter", "colab", "vscode")
INTERACTIVE_FRONTENDS = NOTEBOOK_FRONTENDS + ("ipython",)


def current() -> dict[str, str]:
    """This process's environment: what the functions taking ``environ=`` read otherwise."""
    return os.environ  # type: ignore[return-value]


def _env(environ: dict[str, str] | None) -> dict[str, str]:
    return current() if environ is None else environ


def quick() -> bool:
    """True when ``HYBRIDNB_QUICK`` asks for the quick mode (CI, notebook tests)."""
    return current().get(QUICK_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def frontend(environ: dict[str, str] | None = None) -> str:
    """``"colab"``, ``"vscode"``, ``"jupyter"`` (JupyterLab / Notebook 7), ``"ipython"`` (a
    terminal IPython), ``"ci"`` or ``"terminal"``, from environment variables (never by importing
    google.colab). A headless kernel (under CI, or started by a notebook runner) is ``"ci"``."""
    env = _env(environ)
    if env.get(HEADLESS_ENV):  # set by hn.launch in its workers: no frontend of their own
        return "ci"
    kernel = _in_kernel()
    if "COLAB_RELEASE_TAG" in env or "COLAB_GPU" in env:
        return "colab"
    if env.get("VSCODE_PID") or env.get("VSCODE_CWD") or env.get("VSCODE_IPC_HOOK_CLI"):
        return "vscode" if kernel else "terminal"
    if env.get("CI", "").lower() in ("1", "true", "yes") or env.get("NBVAL") \
            or env.get("PYTEST_CURRENT_TEST"):  # headless runners (nbval under pytest) mark it
        return "ci"
    if kernel:  # jupyter-server sets JPY_SESSION_NAME for its kernels; a runner is their parent
        cmd = "" if env.get("JPY_SESSION_NAME") else _parent_command(env)
        return "ci" if any(runner in cmd for runner in HEADLESS_RUNNERS) else "jupyter"
    return "ipython" if _ipython_shell() is not None else "terminal"


HEADLESS_RUNNERS = ("nbclient", "nbconvert", "papermill", "nbval", "pytest", "jupyter-execute",
                    "nbmake", "testbook")


def _parent_command(env) -> str:
    """Command line of the process that started this kernel (lower case; "" when unknown)."""
    try:
        import psutil

        pid = int(env.get("JPY_PARENT_PID") or os.getppid())
        return " ".join(psutil.Process(pid).cmdline()).lower()
    except Exception:  # noqa: BLE001 - broad: psutil's errors vary by OS; unknown is ""
        return ""


def _ipython_shell():
    """The running IPython shell, if any (a shell has IPython imported already)."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def _in_kernel() -> bool:
    """True inside a Jupyter kernel (ZMQ shell), false in a terminal IPython or plain Python."""
    return ("ipykernel" in sys.modules
            and type(_ipython_shell()).__name__ == "ZMQInteractiveShell")


def launch_env(environ: dict[str, str] | None = None) -> tuple[int, int, int] | None:
    """``(rank, local_rank, world_size)`` when this process is one rank of a launched job
    (torchrun or ``hn.launch`` set ``RANK`` and ``WORLD_SIZE``), else None."""
    env = _env(environ)
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    local = env.get("LOCAL_RANK", "")
    return rank, int(local) if local.strip().isdigit() else rank, world


def cache_dir(environ: dict[str, str] | None = None) -> Path:
    """hybridnb's cache folder: ``$HYBRIDNB_CACHE_DIR``, else ``$XDG_CACHE_HOME/hybridnb``, else
    ``~/.cache/hybridnb``. Not created here."""
    env = _env(environ)
    if env.get(CACHE_DIR_ENV):
        return Path(env[CACHE_DIR_ENV]).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "hybridnb"


def seconds_from_env(name: str, default: float, environ: dict[str, str] | None = None,
                     zero: str | None = None) -> float:
    """A number of seconds from ``$name`` (``default`` when unset): > 0, or >= 0 when ``zero``
    says what 0 means; ValueError naming the variable otherwise."""
    raw = _env(environ).get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value >= 0 if zero else value > 0) or value == float("inf"):
        raise ValueError(f"{name}={raw!r} must be a number of seconds {'>=' if zero else '>'} 0 "
                         f"({f'0 {zero}; ' if zero else ''}unset means {default:g} s)")
    return value


def warm_worker() -> bool:
    """Whether a spare worker (an idle interpreter with torch loaded: its memory) is kept ready
    for the next isolated fit: ``$HYBRIDNB_WARM_WORKER``, on unless it says 0/false/no/off."""
    return current().get(WARM_WORKER_ENV, "").strip().lower() not in ("0", "false", "no", "off")
