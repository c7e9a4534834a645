"""What a process on a Linux node can be given (execve's limits): a job that no node could start is
refused at submit, naming the limit and the path, before any record is written — on the memory adapter
through the public API (the Kubeflow and Slurm adapters: tests/cli/test_cli_everyday.py,
tests/slurm/test_slurm_cli.py)."""

from __future__ import annotations

import pytest

import dispatch
from dispatch.execlimits import EXEC_BYTES, MAX_ARG_STRLEN


async def _submit(spec: dispatch.JobSpec) -> dispatch.JobRecord:
    async with await dispatch.open("memory", dispatch.Config(store=dispatch.MemoryStore())) as cluster:
        return await cluster.submit(spec, job_id="big")


async def test_the_longest_argument_linux_passes_is_accepted_and_one_byte_more_refused() -> None:
    fits = dispatch.JobSpec(command=("train", "x" * (MAX_ARG_STRLEN - 1)), env={"KUBESIM_SCRIPT": "exit 0"})
    assert (await _submit(fits)).job_id == "big"
    over = dispatch.JobSpec(command=("train", "é" * (MAX_ARG_STRLEN // 2)), env={"KUBESIM_SCRIPT": "exit 0"})
    with pytest.raises(dispatch.InvalidError) as refused:  # bytes of UTF-8, not characters
        await _submit(over)
    assert refused.value.path == "command[1]"
    assert "131,072 bytes" in str(refused.value) and "MAX_ARG_STRLEN" in str(refused.value)


async def test_an_environment_too_large_in_all_is_refused_naming_the_total() -> None:
    env = {f"E{i}": "v" * 100 for i in range(20_000)}  # each fits; together they cannot be exec'd
    with pytest.raises(dispatch.InvalidError) as refused:
        await _submit(dispatch.JobSpec(command=("train",), env={**env, "KUBESIM_SCRIPT": "exit 0"}))
    assert refused.value.path == "env"
    assert f"at most {EXEC_BYTES:,} in all" in str(refused.value), refused.value
