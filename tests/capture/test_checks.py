"""capture/checks.py: the checks every captured row passes before it is written. Random healthy
states pass; each fault is named with its state (NaN, all zero, constant, the same at every
position, a norm far outside the embeddings'); a batch's numbers come back as one [states, 6]
tensor whatever the rows hold (the same states per row, as a capture has, or not), with the
embedding norm given as a float or a 0-d tensor per row, or as one tensor for the batch. Under
TRITON_INTERPRET=1 the state_stats kernel computes them, without it the reference does: the same
answers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from fastpath.capture.checks import NORM_BAND, batch_problems, batch_stats, row_problems  # noqa: E402


def _healthy(t: int, h: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=gen) * scale
    return (x + 0.01 * torch.where(x < 0, -1.0, 1.0)).to(torch.bfloat16)


def _norm(state: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(state.float(), dim=-1).mean())


def test_healthy_rows_pass_and_each_fault_is_named() -> None:
    good = {f"layer {i}": _healthy(9, 40, i) for i in range(3)}
    embed = _norm(good["layer 0"])
    assert row_problems(good, embed) == []
    faults = {
        "nan": lambda s: s.index_put_((torch.tensor([4]), torch.tensor([7])), torch.tensor(float("nan"), dtype=s.dtype)),
        "zero": lambda s: s.zero_(),
        "constant": lambda s: s.fill_(0.5),
        "same": lambda s: s.copy_(s[:1].expand_as(s)),
        "tiny": lambda s: s.mul_(NORM_BAND[0] / 100),
    }
    rows = []
    for spoil in faults.values():
        row = {k: v.clone() for k, v in good.items()}
        spoil(row["layer 1"])
        rows.append(row)
    problems = batch_problems(rows, [embed] * len(rows))
    for (name, _), found in zip(faults.items(), problems, strict=True):
        assert len(found) == 1 and found[0].startswith("layer 1: "), (name, found)
    assert "outside" in problems[-1][0] and "x the embeddings'" in problems[-1][0]
    assert "zero" in problems[1][0]


def test_a_batch_is_one_tensor_with_the_row_norms_beside_its_states() -> None:
    rows = [{"a": _healthy(5, 16, 1), "b": _healthy(5, 16, 2)}, {"a": _healthy(8, 16, 3), "b": _healthy(8, 16, 4)}]
    norms = [torch.tensor(2.0), torch.tensor(3.0)]
    names, stats = batch_stats(rows, norms)
    assert names == [["a", "b"], ["a", "b"]]
    assert stats.shape == (4, 6) and stats[:, 5].tolist() == [2.0, 2.0, 3.0, 3.0]
    assert stats[:, :4].tolist() == [[1.0, 1.0, 0.0, 0.0]] * 4  # finite, non-zero, varied, varies in time
    for k, state in enumerate(s for row in rows for s in row.values()):
        assert float(stats[k, 4]) == pytest.approx(_norm(state), rel=1e-5)


def test_rows_with_different_states_and_float_norms() -> None:
    rows = [{"a": _healthy(5, 16, 1)}, {"a": _healthy(6, 16, 2), "b": _healthy(6, 16, 3) * 0}]
    names, stats = batch_stats(rows, [1.5, 2.5])
    assert names == [["a"], ["a", "b"]] and stats[:, 5].tolist() == [1.5, 2.5, 2.5]
    assert batch_stats(rows, torch.tensor([1.5, 2.5], dtype=torch.float64))[1].tolist() == stats.tolist()
    assert batch_problems(rows, [1.5, 2.5])[1] and not batch_problems(rows, [1.5, 2.5])[0]
    assert batch_stats([], []) == ([], None)


def test_the_same_answers_with_and_without_the_kernel(monkeypatch) -> None:
    rows = [{"a": _healthy(17, 33, 5), "b": _healthy(17, 33, 6, scale=1e4)}] * 2
    with_env = batch_stats(rows, [1.0, 1.0])[1]
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    without = batch_stats(rows, [1.0, 1.0])[1]
    assert with_env[:, :4].tolist() == without[:, :4].tolist()
    assert torch.allclose(with_env[:, 4], without[:, 4], rtol=1e-5)
