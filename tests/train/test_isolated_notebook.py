"""An isolated fit from a real Jupyter kernel (nbclient): the model and dataset classes are
defined in notebook cells (they travel to the spawned worker with cloudpickle), a cell asks
``torch.cuda.is_available()`` first, as most notebooks do, and the fit trains in the worker and
leaves the trained weights in the notebook's own model object."""

from __future__ import annotations

import json

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow

CELLS = [
    "import torch\nprint('cuda', torch.cuda.is_available())",
    "import hybridnb as hn\nfrom torch import nn\nfrom torch.utils.data import Dataset",
    # classes that exist only in this kernel's __main__
    """class Windows(Dataset):
    def __init__(self, n=256):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, 16, generator=g)
        self.y = self.x.mean(dim=(1, 2)).unsqueeze(1) * 3

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)""",
    """torch.manual_seed(0)
model = TinyNet()
before = [p.detach().clone() for p in model.parameters()]
tr = hn.Trainer(model, device="cpu", isolate=True, batch_size=32, epochs=3, lr=1e-2,
                live="text", seed=0)
tr.fit(Windows(), val=Windows(64))""",
    """import json
changed = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
print("RESULT", json.dumps({
    "same_object": tr.model is model, "changed": changed,
    "kinds": [e.kind for e in tr.events], "epochs": tr.history["epoch"].tolist(),
    "val_loss": tr.history["val_loss"].tolist(), "cuda_initialized": torch.cuda.is_initialized(),
}))""",
]


def test_an_isolated_fit_from_a_notebook_trains_its_own_classes_in_a_worker(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    result = json.loads(text.split("RESULT", 1)[1])
    assert result["same_object"] and result["changed"]  # the notebook's model, trained
    assert result["epochs"] == [0, 1, 2]
    assert result["val_loss"][-1] < result["val_loss"][0]
    assert "worker_lost" not in result["kinds"] and "isolate" in result["kinds"]
    assert result["cuda_initialized"] is False
    fit_out = "".join(o.get("text", "") for o in nb.cells[3].outputs)
    assert "supervised worker" in fit_out  # where it trained, said once
