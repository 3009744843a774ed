"""Run a notebook top to bottom in a real JupyterLab page (headless Chromium), as a person would:
``python -m hybridnb_tools.lab notebooks/04_challenge1_training.ipynb --out runs/lab``.

It starts JupyterLab on 127.0.0.1 (no token, a free port) in a temporary root holding a copy of the
notebook, opens it in Chromium, clicks Run > Run All Cells, waits until every code cell has run
(or one failed), and saves full-page screenshots plus a JSON summary (cells run, errors, the
plots and live views seen, seconds). Chromium is Debian's (``/usr/bin/chromium``, launched by
playwright with ``executable_path``; nothing is downloaded). The browser test
(tests/live/test_browser.py) uses the same server and page helpers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from hybridnb.env import QUICK_ENV

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]

# What the page shows: code cells (run or not), errors, plots, the live views' summaries. An
# error is a traceback in a stderr-rendered output (a cell that raised); an error a cell caught
# and printed on purpose is stdout and does not count.
CELLS = """() => {
  const cells = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')];
  const prompts = cells.map(c => (c.querySelector('.jp-InputPrompt') || {}).innerText || '');
  const errors = [...document.querySelectorAll(
      '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
    .map(e => e.innerText).filter(t => t.includes('Traceback') || /^\\w*Error:/m.test(t));
  return {cells: cells.length,
          run: prompts.filter(p => /\\[\\d+\\]/.test(p)).length,
          busy: prompts.filter(p => p.includes('[*]')).length,
          errors: errors.map(t => t.slice(0, 2000)),
          plots: document.querySelectorAll('.js-plotly-plot').length,
          summaries: [...document.querySelectorAll('.hybridnb-summary')].map(e => e.innerText)};
}"""


def chromium() -> str | None:
    """Debian's Chromium, or None."""
    for path in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if path and os.access(path, os.X_OK):
            return path
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=2) as r:
        return json.loads(r.read() or b"null")


@contextlib.contextmanager
def jupyterlab(root: Path, env: dict[str, str] | None = None,
               start_kernels: tuple[str, ...] = ()) -> Iterator[str]:
    """A JupyterLab server on ``root`` (its URL); kernels for ``start_kernels`` (notebook paths
    relative to ``root``) start at once, so they boot while Chromium starts. The kernels see a
    person's session: no pytest, CI or small-mode variables unless ``env`` sets them."""
    settings = root / ".settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True}))
    # every cell stays in the page (JupyterLab 4 otherwise renders only those near the view)
    tracker = root / ".settings" / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True, exist_ok=True)
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    port = _free_port()
    full = {k: v for k, v in os.environ.items()
            if k not in ("PYTEST_CURRENT_TEST", "CI", QUICK_ENV, "NBVAL")}
    full.update(env or {})
    full["JUPYTERLAB_SETTINGS_DIR"] = str(root / ".settings")
    full["JUPYTERLAB_WORKSPACES_DIR"] = str(root / ".ws")
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--IdentityProvider.token=", "--ServerApp.password=",
           "--ServerApp.disable_check_xsrf=True", f"--ServerApp.root_dir={root}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log_path = root / "server.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full, cwd=root)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + 60
            while True:
                try:
                    get_json(f"{url}/api/status")
                    break
                except OSError:
                    if server.poll() is not None or time.time() > deadline:
                        raise RuntimeError("JupyterLab did not start:\n"
                                           + log_path.read_text()[-3000:]) from None
                    time.sleep(0.2)
            for name in start_kernels:
                body = json.dumps({"path": name, "name": name, "type": "notebook",
                                   "kernel": {"name": "python3"}}).encode()
                req = urllib.request.Request(f"{url}/api/sessions", data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
                urllib.request.urlopen(req, timeout=30).close()
            yield url
        finally:
            server.terminate()
            try:
                server.wait(15)
            except subprocess.TimeoutExpired:
                server.kill()


def open_and_run_all(browser, url: str, name: str, observer: str | None = None,
                     size: tuple[int, int] = (1400, 1100)):
    """Open notebook ``name`` in its own window, wait for its kernel to be idle (a fresh server
    races the kernel start), install ``observer`` (JS) if given and click Run All Cells."""
    context = browser.new_context(viewport={"width": size[0], "height": size[1]})
    page = context.new_page()  # its own window: never throttled as a background tab
    page.goto(f"{url}/lab/tree/{name}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    deadline = time.time() + 120
    while True:
        sessions = [s for s in get_json(f"{url}/api/sessions") if s["path"] == name]
        if sessions and sessions[0]["kernel"]["execution_state"] == "idle" and \
                page.query_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]'):
            break
        if time.time() > deadline:
            raise TimeoutError(f"the kernel of {name} never became idle")
        time.sleep(0.2)
    if observer:
        page.evaluate(observer)
    page.click(".lm-MenuBar-itemLabel:text-is('Run')")
    page.click("li[data-command='runmenu:run-all']")
    return page


def wait_until_run(page, url: str, name: str, timeout_s: float,
                   progress=print) -> dict:
    """Poll until every code cell has an execution count and the kernel is idle, or a cell shows
    an error, or ``timeout_s`` passes; the page's last state (``CELLS``) plus ``seconds``."""
    t0 = time.time()
    last = -1
    while True:
        page.wait_for_timeout(1000)
        state = page.evaluate(CELLS)
        kernel = next((s["kernel"]["execution_state"] for s in get_json(f"{url}/api/sessions")
                       if s["path"] == name), "gone")
        if state["run"] != last:
            progress(f"  {state['run']}/{state['cells']} cells run "
                     f"({time.time() - t0:.0f} s, kernel {kernel})")
            last = state["run"]
        done = state["run"] == state["cells"] and not state["busy"] and kernel == "idle"
        if done or state["errors"] or time.time() - t0 > timeout_s:
            state.update(seconds=round(time.time() - t0, 1), kernel=kernel,
                         timed_out=not done and not state["errors"])
            return state


def cell_screenshots(page, out: Path) -> list[str]:
    """One picture per code cell that shows a plot, a table or the Trainer's summary (the
    notebook scrolls inside its panel, so a page screenshot shows only what is in view)."""
    shots = []
    cells = page.locator(".jp-Notebook .jp-CodeCell")
    for i in range(cells.count()):
        cell = cells.nth(i)
        if cell.locator(".js-plotly-plot, .hybridnb-summary, table").count():
            path = out / f"cell-{i + 1:02d}.png"
            cell.screenshot(path=str(path))
            shots.append(str(path))
    return shots


def run_notebook(notebook: Path, out: Path, *, small: bool = False, timeout_s: float = 1800,
                 env: dict[str, str] | None = None, progress=print) -> dict:
    """Run ``notebook`` top to bottom in JupyterLab; screenshots and ``lab-run.json`` in ``out``."""
    path = chromium()
    if path is None:
        raise RuntimeError("no Chromium found (/usr/bin/chromium): `apt-get install chromium`")
    from playwright.sync_api import sync_playwright

    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    root = out / "lab-root"
    root.mkdir(exist_ok=True)
    shutil.copy(notebook, root / notebook.name)
    kernel_env = dict(env or {})   # the notebook's runs/ lands beside its copy, in lab-root/
    repo = Path(__file__).resolve().parents[1]
    kernel_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(repo), os.environ.get("PYTHONPATH", "")) if p)
    if small:
        kernel_env[QUICK_ENV] = "1"
    with jupyterlab(root, kernel_env, start_kernels=(notebook.name,)) as url, \
            sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=CHROMIUM_FLAGS)
        try:
            page = open_and_run_all(browser, url, notebook.name)
            progress(f"JupyterLab at {url}: running {notebook.name}")
            state = wait_until_run(page, url, notebook.name, timeout_s, progress)
            page.screenshot(path=str(out / "lab-view.png"))
            shots = cell_screenshots(page, out)
        finally:
            browser.close()
    state.update(notebook=notebook.name, small=small,
                 screenshots=[str(out / "lab-view.png"), *shots])
    (out / "lab-run.json").write_text(json.dumps(state, indent=1))
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybridnb_tools.lab", description=__doc__)
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--out", type=Path, default=Path("runs") / "lab")
    parser.add_argument("--quick", action="store_true", help="quick mode (HYBRIDNB_QUICK=1)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for all cells")
    args = parser.parse_args(argv)
    state = run_notebook(args.notebook, args.out, small=args.quick, timeout_s=args.timeout)
    print(json.dumps({k: v for k, v in state.items() if k != "errors"}, indent=1))
    for err in state["errors"]:
        print(err, file=sys.stderr)
    return 0 if state["run"] == state["cells"] and not state["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
