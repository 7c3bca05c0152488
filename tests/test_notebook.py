"""notebooks/estimator_variance.ipynb runs top to bottom (small setting) and passes its own checks."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "estimator_variance.ipynb"


def python3_kernel_or_skip() -> None:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        pytest.skip("no 'python3' Jupyter kernel (pip install ipykernel)")


# about 15 s (a kernel start and a small lab run): in the default run, so CI executes the notebook
def test_estimator_variance_notebook_runs(monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e '.[dev]')")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install -e '.[dev]')")
    python3_kernel_or_skip()
    monkeypatch.setenv("DLMRL_NOTEBOOK_SMALL", "1")  # the kernel inherits the environment
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=600, resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    assert all(c.get("execution_count") for c in code)  # every cell ran
    text = "".join(o.get("text", "") for o in code[-1].outputs if o.get("output_type") == "stream")
    assert " records checked; worst |z| = " in text and "variance ratio in [" in text, text
    assert "shared plans shrink the variance of the ELBO difference by" in text, text
