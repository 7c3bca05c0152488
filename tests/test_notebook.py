"""The notebooks run top to bottom (small setting) and pass their own checks: estimator_variance.ipynb (the
variance lab) and train_with_your_reward.ipynb (a reward of your own through the Python API)."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "estimator_variance.ipynb"
REWARD_NOTEBOOK = NOTEBOOK.parent / "train_with_your_reward.ipynb"


def python3_kernel_or_skip() -> None:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        pytest.skip("no 'python3' Jupyter kernel (pip install ipykernel)")


def run_notebook(path: Path, monkeypatch) -> list:
    """Execute ``path`` with ``DLMRL_NOTEBOOK_SMALL=1``; its code cells, each checked to have run without error."""
    nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e '.[dev]')")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install -e '.[dev]')")
    python3_kernel_or_skip()
    monkeypatch.setenv("DLMRL_NOTEBOOK_SMALL", "1")  # the kernel inherits the environment
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=600, resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    assert all(c.get("execution_count") for c in code)  # every cell ran
    return code


def stream_text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


# about 15 s (a kernel start and a small lab run): in the default run, so CI executes the notebook
@pytest.mark.slow  # (~11 s on a 2-core CI machine; the training notebook stays in the default run)
def test_estimator_variance_notebook_runs(monkeypatch):
    code = run_notebook(NOTEBOOK, monkeypatch)
    text = stream_text(code[-1])
    assert " records checked; worst |z| = " in text and "variance ratio in [" in text, text
    assert "shared plans shrink the variance of the ELBO difference by" in text, text


# a kernel start and a 2-step run (about 15 s): in the default run, so CI executes the notebook
def test_train_with_your_reward_notebook_runs(monkeypatch):
    code = run_notebook(REWARD_NOTEBOOK, monkeypatch)
    assert "held-out solve rate: before " in "".join(stream_text(c) for c in code)
    figures = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(figures) >= 2, "the live curve and the curve from metrics.jsonl"
    text = stream_text(code[-1])
    assert "reloaded weights identical: True" in text, text
