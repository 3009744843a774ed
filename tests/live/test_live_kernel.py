"""The widget view in a real IPython kernel: a Stop click reaches a busy training loop.

A kernel executing a cell does not read widget messages; the view routes the Stop button's comm
to a kernel subshell (ipykernel 7) so the click lands while the loop runs. This test plays the
browser's part with jupyter_client: it sends exactly the message JupyterLab sends for a click.
"""

from __future__ import annotations

import time

import pytest

jupyter_client = pytest.importorskip("jupyter_client")

CELL = r"""
import time
from hybridnb.live import make_view
view = make_view("widgets")
view.start(dict(epochs=1000, steps_per_epoch=100, batch_size=8, device="cpu",
                precision="fp32", model="Fake", n_params=10, monitor="val_loss", quick=False))
print("ROUTE", view.clicks.mode, flush=True)
t0 = time.time(); g = 0
while not view.stop_requested and time.time() - t0 < 30:
    g += 1
    time.sleep(0.005)  # a training step (the GIL is released, as in torch kernels)
    sum(i * i for i in range(2000))  # and some Python work holding the GIL
    view.update(dict(epoch=g // 100, step=g % 100 + 1, global_step=g, loss=1 / g, lr=1e-3,
                     samples_per_s=1.0, elapsed_s=time.time() - t0))
view.end(dict(elapsed_s=time.time() - t0, events=[], device="cpu", precision="fp32",
              stopped="stop_button" if view.stop_requested else None, peak_memory_bytes=None))
print("STOPPED", view.stop_requested, g, round(time.time() - t0, 2), flush=True)
"""


@pytest.mark.slow
def test_stop_click_reaches_a_busy_training_loop():
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3")
    try:
        msg_id = kc.execute(CELL)
        out, stop_comm, clicked_at, errors = [], None, None, []
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                msg = kc.get_iopub_msg(timeout=1)
            except Exception:
                msg = None
            if msg is not None:
                kind, content = msg["msg_type"], msg["content"]
                if kind == "comm_open":
                    state = content["data"].get("state", {})
                    if state.get("_model_name") == "ButtonModel" and \
                            state.get("description") == "Stop":
                        stop_comm = content["comm_id"]
                elif kind == "stream":
                    out.append(content["text"])
                elif kind == "error":
                    errors.append("\n".join(content["traceback"]))
                elif (kind == "status" and content["execution_state"] == "idle"
                      and msg["parent_header"].get("msg_id") == msg_id):
                    break
            if stop_comm and clicked_at is None and "ROUTE" in "".join(out):
                time.sleep(1.0)  # let the loop run a while: the kernel is busy
                click = kc.session.msg("comm_msg", {"comm_id": stop_comm, "data": {
                    "method": "custom", "content": {"event": "click"}}})
                kc.shell_channel.send(click)
                clicked_at = time.time()
        text = "".join(out)
        assert not errors, errors[0]
        assert "ROUTE subshell" in text, text
        assert clicked_at is not None, "the Stop button never appeared"
        line = next(ln for ln in text.splitlines() if ln.startswith("STOPPED"))
        print(line, "click->idle", round(time.time() - clicked_at, 2))
        _, flag, steps, seconds = line.split()
        assert flag == "True"  # the loop saw the click ...
        assert float(seconds) < 10  # ... within seconds, not at the 30 s timeout
        assert int(steps) > 10  # and it really was training when clicked
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
