"""examples/train/train.py alone: ranks as local processes on loopback, as torch.distributed's
environment describes them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or Kubeflow Trainer's (PET_*).

What is checked: two ranks train and agree; a run stopped by SIGTERM checkpoints, and the next
incarnation resumes from that checkpoint and ends with the loss of a run never interrupted, to the float;
a stale incarnation cannot write over a newer one's checkpoints; rendezvous errors are clear."""

from __future__ import annotations

import hashlib
import shutil
import signal
from pathlib import Path

import pytest

from .trainlog import Rank, free_port, ranks

K = 5
LONG = ["--steps", "400", "--checkpoint-every", str(K), "--step-time", "0.05"]
"""A run a test stops long before its end (400 steps take at least 20 s)."""


def _env(ckpt: Path, epoch: str, **more: str) -> dict[str, str]:
    return {"DISPATCH_CHECKPOINT_DIR": str(ckpt), "DISPATCH_JOB_ID": "job-1", "DISPATCH_EPOCH": epoch, **more}


def _finish(group: list[Rank]) -> list[int]:
    return [r.finish() for r in group]


def _reference(tmp_path: Path, steps: int, world: int = 2) -> str:
    """The final loss of a run of ``steps`` never interrupted (its own checkpoint directory)."""
    group = ranks(
        world,
        ["--steps", str(steps), "--checkpoint-every", str(K)],
        tmp_path,
        extra=_env(tmp_path / "ref", "1.0"),
    )
    assert _finish(group) == [0] * world, [r.output() for r in group]
    return group[0].run().final_loss


def test_two_ranks_train_in_step_and_checkpoint(tmp_path: Path) -> None:
    group = ranks(
        2, ["--steps", "12", "--checkpoint-every", str(K)], tmp_path, extra=_env(tmp_path / "c", "1.0")
    )
    assert _finish(group) == [0, 0], [r.output() for r in group]
    zero, one = (r.run() for r in group)
    assert [s for s, _ in zero.steps] == list(range(1, 13))
    assert zero.steps == one.steps  # every rank applies the same summed gradient
    assert zero.checkpoints == [5, 10, 12] and one.checkpoints == []  # rank 0 writes them
    assert sorted(p.name for p in (tmp_path / "c" / "job-1").iterdir()) == [
        "ckpt-e000001-s00000010.npz",
        "ckpt-e000001-s00000012.npz",
    ]
    assert zero.resumed_from is None and "final loss" in group[0].lines[-1]


@pytest.mark.parametrize("signalled", [0, 1], ids=["sigterm-rank-0", "sigterm-rank-1"])
def test_a_run_stopped_by_sigterm_resumes_and_ends_with_the_uninterrupted_loss(
    tmp_path: Path, signalled: int
) -> None:
    ckpt = tmp_path / "ckpt"
    steps = 400
    first = ranks(2, LONG, tmp_path, extra=_env(ckpt, "1.0"))
    first[0].wait_for(rf"^checkpoint step {K} epoch 1: ")
    first[signalled].terminate()
    codes = _finish(first)
    # The signalled rank ends as killed by SIGTERM; the other stops with it, exit 143.
    assert codes[signalled] == -signal.SIGTERM and codes[1 - signalled] == 143, codes
    before = first[0].run()
    reached = before.reached
    assert K <= reached < steps
    assert before.checkpoints[-1] == reached  # the checkpoint written on SIGTERM
    assert first[1].run().reached == reached  # both ranks stopped after the same step

    second = ranks(
        2,
        ["--steps", str(steps), "--checkpoint-every", str(K)],
        tmp_path,
        epoch="2.1",
        extra=_env(ckpt, "2.1"),
    )
    assert _finish(second) == [0, 0], [r.output() for r in second]
    after = second[0].run()
    assert after.resumed_from == reached and second[1].run().resumed_from == reached
    assert after.first - 1 >= K and after.first < reached + K
    assert after.first == reached + 1  # the SIGTERM checkpoint, not the last periodic one
    assert after.reached == steps
    assert after.final_loss == _reference(tmp_path, steps)


def test_without_the_sigterm_checkpoint_the_last_periodic_one_is_used(tmp_path: Path) -> None:
    """A rank killed outright (SIGKILL, as after a grace period) leaves only the periodic checkpoints;
    the next incarnation starts from the last of them, never past a step it did not reach."""
    ckpt = tmp_path / "ckpt"
    first = ranks(2, LONG, tmp_path, extra=_env(ckpt, "1.0"))
    first[0].wait_for(rf"^checkpoint step {2 * K} epoch 1: ")
    for r in first:
        r.kill()
    before = first[0].run()
    second = ranks(
        2, ["--steps", "30", "--checkpoint-every", str(K)], tmp_path, epoch="2.1", extra=_env(ckpt, "2.1")
    )
    assert _finish(second) == [0, 0]
    after = second[0].run()
    assert after.resumed_from == before.checkpoints[-1]
    assert after.resumed_from % K == 0 and after.first - 1 <= before.reached < after.first - 1 + K
    assert after.final_loss == _reference(tmp_path, 30)


def _digests(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir() if p.suffix == ".npz"
    }


def test_a_stale_incarnation_cannot_overwrite_the_newer_ones_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    own = ckpt / "job-1"
    # Incarnation 1, left running by hand: one rank, slow steps.
    stale = Rank(LONG, {**_env(ckpt, "1.0")}, tmp_path)
    stale.wait_for(rf"^checkpoint step {K} epoch 1: ")
    # Incarnation 2 resumes from it and runs to its end (fast: no step time), writing its checkpoints.
    newer = Rank(["--steps", "200", "--checkpoint-every", str(K)], _env(ckpt, "2.1"), tmp_path)
    assert newer.finish() == 0, newer.output()
    written = _digests(own)
    assert any(name.startswith("ckpt-e000002-") for name in written)
    # The stale one reaches its next checkpoint, sees the newer incarnation's and stops without writing.
    assert stale.finish() == 3, stale.output()
    assert any("fenced: incarnation 2 has written checkpoints" in line for line in stale.errors)
    assert _digests(own) == written
    # Started again by hand, the stale incarnation refuses at once.
    again = Rank(LONG, _env(ckpt, "1.0"), tmp_path)
    assert again.finish() == 3 and "fenced" in again.output()
    assert _digests(own) == written
    # Even a stale write that raced past the check (an old incarnation's file with a later step) cannot
    # shadow the newer incarnation's: the next one resumes from incarnation 2's last checkpoint.
    newest_1 = max(p for p in own.iterdir() if p.name.startswith("ckpt-e000001-"))
    shutil.copy(newest_1, own / "ckpt-e000001-s99999999.npz")
    third = Rank(["--steps", "200", "--checkpoint-every", str(K)], _env(ckpt, "3.2"), tmp_path)
    assert third.finish() == 0, third.output()
    assert "resumed from step 200 (checkpoint of incarnation 2)" in third.lines


def test_sigterm_on_one_rank_writes_the_checkpoint_the_next_incarnation_resumes_from(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    one = Rank(LONG, _env(ckpt, "1.0"), tmp_path)
    one.wait_for(r"^step 7 loss ")
    one.terminate()
    assert one.finish() == -signal.SIGTERM
    run = one.run()
    assert run.checkpoints[-1] == run.reached
    assert "stopping after step" in one.lines[-1]
    name = f"ckpt-e000001-s{run.reached:08d}.npz"
    assert (ckpt / "job-1" / name).exists()
    nxt = Rank(["--steps", "20", "--checkpoint-every", str(K)], _env(ckpt, "2.1"), tmp_path)
    assert nxt.finish() == 0
    assert nxt.run().resumed_from == run.reached


def test_a_rank_that_cannot_reach_rank_0_says_where_it_looked(tmp_path: Path) -> None:
    port = free_port()
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    lonely = Rank(["--connect-timeout", "1"], env, tmp_path)
    assert lonely.finish() == 1
    assert f"could not reach rank 0 at 127.0.0.1:{port} within 1 s" in lonely.output()
    assert "check MASTER_ADDR and MASTER_PORT" in lonely.output()


def test_rank_0_refuses_a_rank_of_another_incarnation(tmp_path: Path) -> None:
    port = str(free_port())
    common = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    zero = Rank(["--steps", "3"], {**common, "RANK": "0", "DISPATCH_EPOCH": "2.1"}, tmp_path)
    stale = Rank(["--steps", "3"], {**common, "RANK": "1", "DISPATCH_EPOCH": "1.0"}, tmp_path)
    assert stale.finish() == 1
    assert "refused rank 1: rank 1 belongs to epoch 1.0, rank 0 to 2.1" in stale.output()
    right = Rank(["--steps", "3"], {**common, "RANK": "1", "DISPATCH_EPOCH": "2.1"}, tmp_path)
    assert [zero.finish(), right.finish()] == [0, 0], zero.output()
    assert zero.run().steps == right.run().steps and zero.run().reached == 3


def test_kubeflow_trainers_variables_are_read_too(tmp_path: Path) -> None:
    """A TrainJob's pods get PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT (the torch
    runtime), not RANK or WORLD_SIZE (torchrun would set those)."""
    port = str(free_port())
    common = {
        "PET_NNODES": "2",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": port,
        "PET_NPROC_PER_NODE": "1",
    }
    group = [Rank(["--steps", "4"], {**common, "PET_NODE_RANK": str(r)}, tmp_path) for r in (0, 1)]
    assert _finish(group) == [0, 0], [r.output() for r in group]
    assert group[0].lines[0].startswith(f"rank 0 of 2 (local rank 0), epoch 1.0, rank 0 at 127.0.0.1:{port}")
    assert group[0].run().steps == group[1].run().steps


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK='one': expected an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 is not in [0, 2)"),
        ({"DISPATCH_EPOCH": "2"}, "DISPATCH_EPOCH='2': expected \"N.R\""),
        ({"TRAIN_STEPS": "many"}, "TRAIN_STEPS='many': expected an integer"),
    ],
)
def test_bad_environment_is_a_clear_error(tmp_path: Path, env: dict[str, str], words: str) -> None:
    bad = Rank([], env, tmp_path)
    assert bad.finish() == 2
    assert words in bad.output()


def test_the_torch_backend_trains_alike(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # never installed by the project: checked where a user has it
    group = ranks(2, ["--steps", "6", "--backend", "torch"], tmp_path, extra=_env(tmp_path / "c", "1.0"))
    assert _finish(group) == [0, 0], [r.output() for r in group]
    assert group[0].run().final_loss == _reference(tmp_path, 6)
