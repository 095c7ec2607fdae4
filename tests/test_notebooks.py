"""Every notebook in notebooks/ runs top to bottom on a small sample; any cell error fails."""
import glob
import os

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(__file__)), "notebooks", "*.ipynb")))


def test_there_are_notebooks_for_exploring_and_for_training():
    names = [os.path.basename(p) for p in NOTEBOOKS]
    assert "01_explore_and_reduce.ipynb" in names and "02_train_save_score.ipynb" in names


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_top_to_bottom(path, tmp_path, monkeypatch):
    # The kernel inherits this environment: the notebooks read their settings from it.
    monkeypatch.setenv("SPARKDEEP_ENV", "ci")
    monkeypatch.setenv("SPARKDEEP_SAMPLE", "0.02")
    monkeypatch.setenv("SPARKDEEP_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("SPARKDEEP_MASTER", "local[2]")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 3  # the plots were drawn
    # Executed copies for a look (not committed).
    nbformat.write(nb, str(tmp_path / os.path.basename(path)))
