"""notebooks/quickstart.ipynb runs top to bottom, so it never rots."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "quickstart.ipynb"


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_quickstart_notebook_runs(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")

    nb = nbformat.read(NOTEBOOK, as_version=4)
    # The kernel inherits this process's environment (CPU JAX, see conftest) and runs in tmp_path.
    client = nbclient.NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert any(o.get("output_type") == "error" for o in outputs) is False
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the inline learning curve
    text = "".join(o.get("text", "") for o in outputs)
    assert "restored at iteration 300" in text and "-> action" in text
    assert "recurrent rollout return" in text


STUDY = NOTEBOOK.with_name("policy_lag_study.ipynb")


@pytest.mark.timeout(400)
@pytest.mark.slow
def test_policy_lag_study_notebook_runs(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")

    monkeypatch.setenv("POLICY_LAG_STUDY_ENV_STEPS", "30000")  # a few intervals per member
    nb = nbformat.read(STUDY, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=360, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not any(o.get("output_type") == "error" for o in outputs)
    assert any("image/png" in o.get("data", {}) for o in outputs)
    text = "".join(o.get("text", "") for o in outputs)
    assert "42 members" in text and "no correction lag 32" in text
